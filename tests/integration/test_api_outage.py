"""An API server that answers 500 for a while, or hangs, in the middle of a rollout (issue 37): the
run gives up within bounds, the node is left `failed` with its reason (annotation and Event,
written once the API answers again), its Lease released, and the next run puts it right. On the
real test cluster, as the rollout's ServiceAccount: the faults come from a small HTTPS proxy in
front of kube-apiserver (it serves the API server's own certificate and passes the bearer token
on, so the server authenticates and authorizes every request as it would)."""

import time

import pytest

from test_roles import STATE, Fleet

pytestmark = pytest.mark.playbook

LAYOUT = [{"gpus": "all", "devices": {"2g.12gb": 2}}]
FAST = {"mig_node_validate_delay": "1"}
LAST_ERROR = "gpuops.mig/last-error"


@pytest.fixture
def proxy(fault_proxy, cluster_env, tmp_path):
    """The fault proxy (tests/support/controlplane/faultproxy.py), with `kubeconfig`: the
    rollout's ServiceAccount through it."""
    fault_proxy.kubeconfig = fault_proxy.kubeconfig_from(
        cluster_env["KUBECONFIG"], tmp_path / "kubeconfig-proxy"
    )
    return fault_proxy


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
    time.sleep(5)  # the held requests end
    # The dead run could not release its Leases: they lapse 30 s after their last renewal. The
    # run may have ended sooner than that (when the first call that hung is one it does not
    # retry), so the next run waits for them, as the holder's message tells a user to.
    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_lease_wait=90))
    assert again.returncode == 0, again.stdout[-4000:]
    assert cluster.get("Node", "node-a")["metadata"]["labels"][STATE] == "success"
