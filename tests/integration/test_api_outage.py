"""An API server that answers 500 for a while, or hangs, in the middle of a rollout (issue 37): the
run gives up within bounds, the node is left `failed` with its reason (annotation and Event,
written once the API answers again), its Lease released, and the next run puts it right. On the
real test cluster, as the rollout's ServiceAccount: the faults come from a small HTTPS proxy in
front of kube-apiserver (it serves the API server's own certificate and passes the bearer token
on, so the server authenticates and authorizes every request as it would)."""

import http.client
import http.server
import ssl
import threading
import time
import urllib.parse

import pytest
import yaml

from test_roles import STATE, Fleet

pytestmark = pytest.mark.playbook

LAYOUT = [{"gpus": "all", "devices": {"2g.12gb": 2}}]
FAST = {"mig_node_validate_delay": "1", "mig_node_drain_retry_delay": "1"}
LAST_ERROR = "gpuops.mig/last-error"
STATUS_500 = (
    b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected outage",'
    b'"reason":"InternalError","code":500}'
)


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards every request to `upstream`; while fault() says "500" answers 500 instead, while it
    says "hang" holds the request."""

    daemon_threads = True

    def __init__(self, upstream, cert, key, ca):
        super().__init__(("127.0.0.1", 0), Forward)
        self.upstream = urllib.parse.urlsplit(upstream)
        self.mode, self.until = None, 0.0
        self.faulted = 0
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(cert, key)
        self.socket = serving.wrap_socket(self.socket, server_side=True)
        self.client_context = ssl.create_default_context(cafile=ca)

    def fail_for(self, mode, seconds):
        self.mode, self.until = mode, time.monotonic() + seconds

    def fault(self):
        return self.mode if time.monotonic() < self.until else None


class Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_one(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        proxy = self.server
        while proxy.fault() == "hang":
            time.sleep(0.2)
        if proxy.fault() == "500":
            proxy.faulted += 1
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(STATUS_500)))
            self.end_headers()
            self.wfile.write(STATUS_500)
            return
        upstream = http.client.HTTPSConnection(
            proxy.upstream.hostname, proxy.upstream.port, timeout=600,
            context=proxy.client_context)
        headers = dict(
            (k, v) for k, v in self.headers.items() if k.lower() not in ("host", "connection")
        )
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            chunk = answer.read1(65536)
            if not chunk:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        upstream.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_one

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy(cluster, cluster_env, tmp_path):
    plane = cluster.control_plane
    server = Proxy(plane.url, plane.pki["apiserver.crt"], plane.pki["apiserver.key"],
                   plane.pki["ca.crt"])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with open(cluster_env["KUBECONFIG"]) as handle:
        config = yaml.safe_load(handle)
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:%d" % server.server_address[1]
    server.kubeconfig = str(tmp_path / "kubeconfig-proxy")
    with open(server.kubeconfig, "w") as handle:
        yaml.safe_dump(config, handle)
    yield server
    server.shutdown()


def when_pending(cluster, node, action):
    """Call action() once, when `node` is first labelled pending (its change under way)."""
    done = []

    def hook(event):
        if (
            not done
            and event.obj["metadata"]["name"] == node
            and (event.obj["metadata"].get("labels") or {}).get(STATE) == "pending"
        ):
            done.append(True)
            action()

    cluster.on("modified", hook, kind="Node")


def test_forty_seconds_of_500s_mid_rollout_leave_the_node_failed_with_why_and_released(
    cluster, cluster_env, tmp_path, proxy
):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.env.update(KUBECONFIG=proxy.kubeconfig, K8S_AUTH_KUBECONFIG=proxy.kubeconfig)
    fleet.add("node-a", "1xA30-24GB", mig_node_layouts=LAYOUT)
    when_pending(cluster, "node-a", lambda: proxy.fail_for("500", 40))

    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode != 0 and proxy.faulted > 0
    node = cluster.get("Node", "node-a")["metadata"]
    assert node["labels"][STATE] == "failed", proc.stdout[-4000:]
    assert (
        "injected outage" in node["annotations"][LAST_ERROR]
        or "500" in node["annotations"][LAST_ERROR]
    )
    events = [  # the collection's, not the kubelet's or the node controller's
        e for e in cluster.list("Event", "default")
        if e["involvedObject"]["name"] == "node-a" and e["reason"].startswith("Mig")
    ]
    assert [e["reason"] for e in events] == ["MigReconfigureFailed"]
    assert not cluster.get("Lease", "gpuops-mig-node-a")["spec"].get("holderIdentity")  # released

    again = fleet.run("playbooks/site.yml", FAST)
    assert again.returncode == 0, again.stdout[-4000:]
    assert cluster.get("Node", "node-a")["metadata"]["labels"][STATE] == "success"


def test_a_hung_api_server_mid_rollout_ends_the_run_within_bounds(
    cluster, cluster_env, tmp_path, proxy
):
    """The API hangs for good once the node is pending: the run ends (each call has a timeout), the
    node is left cordoned and pending for the next run, which puts it right once the API answers.
    """
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.env.update(KUBECONFIG=proxy.kubeconfig, K8S_AUTH_KUBECONFIG=proxy.kubeconfig)
    fleet.add("node-a", "1xA30-24GB", mig_node_layouts=LAYOUT)
    when_pending(cluster, "node-a", lambda: proxy.fail_for("hang", 100000))

    started = time.monotonic()
    # Shorter bounds than the defaults (60 s a call), so the test takes minutes, not ten.
    proc = fleet.run(
        "playbooks/site.yml", dict(FAST, mig_node_lease_duration=30, __mig_node_api_timeout=15)
    )
    assert proc.returncode != 0
    assert time.monotonic() - started < 400, "the run did not end in bounded time: " + proc.stdout

    proxy.fail_for(None, 0)
    time.sleep(
        5
    )  # the held requests end; the dead run's Lease lapses (30 s) before the next run takes it
    again = fleet.run("playbooks/site.yml", FAST)
    assert again.returncode == 0, again.stdout[-4000:]
    assert cluster.get("Node", "node-a")["metadata"]["labels"][STATE] == "success"
