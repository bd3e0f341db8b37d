"""A small HTTPS proxy in front of the test cluster's kube-apiserver that can make the API go
away, fail or hang, for tests of what a client does then.

It serves the API server's own certificate and passes every request on with its headers (the
bearer token of a ServiceAccount included), so the server authenticates and authorizes each
request as it would without the proxy. Faults:

- `stop()` / `start()`: the API goes away and comes back on the same port. While stopped,
  connections are refused (nothing listens) and the requests in flight (watches) are cut.
- `fail_for("500", seconds)`: new requests are answered 500 (an InternalError Status);
  `fail_for("hang", seconds)` holds them. With `cut=True` the requests in flight are cut as the
  fault starts (a watch then reconnects into it).
- `expire_before(resource_version)`: a watch from an older resourceVersion gets the answer
  kube-apiserver gives when its history no longer reaches that far (an ERROR event, a Status
  410 Expired "too old resource version"), as after a compaction or a restart of the server.

    proxy = FaultProxy.for_cluster(cluster).start()
    kubeconfig = proxy.kubeconfig_from(cluster_env["KUBECONFIG"], tmp_path / "via-proxy")
    proxy.stop(); ...; proxy.start()
    proxy.close()

`requests` records [method, path, query, status] of every request it received, faulted or not
(status None while no answer came, or when none did).
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import ssl
import threading
import time
import urllib.parse

import yaml

STATUS_500 = (
    b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected outage",'
    b'"reason":"InternalError","code":500}'
)


class FaultProxy:
    """The proxy: `start()` listens (on the same port again after a `stop()`)."""

    def __init__(self, upstream: str, cert: str, key: str, ca: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.cert, self.key = cert, key
        self.client_context = ssl.create_default_context(cafile=ca)
        self.port = 0
        self.mode, self.until = None, 0.0
        self.faulted = 0
        self.expired_before = None
        self.requests: list = []
        self._server = None
        self._thread = None
        self._lock = threading.Lock()
        self._open: set = set()  # sockets of requests in flight, both sides

    @classmethod
    def for_cluster(cls, cluster) -> "FaultProxy":
        plane = cluster.control_plane
        return cls(plane.url, plane.pki["apiserver.crt"], plane.pki["apiserver.key"],
                   plane.pki["ca.crt"])

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kubeconfig_from(self, kubeconfig, path) -> str:
        """A copy of `kubeconfig` (same credentials) whose server is the proxy."""
        with open(kubeconfig, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
        for entry in config["clusters"]:
            entry["cluster"]["server"] = self.url
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        return str(path)

    # ----- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        server = _Server(("127.0.0.1", self.port), _Forward)
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(self.cert, self.key)
        server.socket = serving.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
        server.proxy = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True,
                                        name=f"fault-proxy-{self.port}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops listening (connections are refused) and cuts the requests in flight."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.cut()

    close = stop

    def cut(self) -> None:
        """Closes the connections of the requests in flight (to the client and upstream)."""
        with self._lock:
            open_now, self._open = list(self._open), set()
        for sock in open_now:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass

    # ----- faults ----------------------------------------------------------------------------

    def fail_for(self, mode, seconds: float, cut: bool = False) -> None:
        """Answer 500 (mode "500") or hold (mode "hang") new requests for `seconds`; mode None
        ends a fault. With `cut`, the requests in flight are cut now."""
        self.mode, self.until = mode, time.monotonic() + seconds
        if cut:
            self.cut()

    def fault(self):
        return self.mode if time.monotonic() < self.until else None

    def expire_before(self, resource_version) -> None:
        """Watches from a resourceVersion older than this one are answered 410 Expired."""
        self.expired_before = int(resource_version)

    def _track(self, sock):
        with self._lock:
            self._open.add(sock)

    def _untrack(self, sock):
        with self._lock:
            self._open.discard(sock)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy

    def handle_error(self, request, client_address):
        pass  # a handshake cut short, a connection cut by stop(): what the proxy is for


def _too_old(proxy, query: dict):
    """kube-apiserver's answer to a watch it has no history for, or None."""
    if proxy.expired_before is None or query.get("watch", [""])[0] not in ("true", "1"):
        return None
    try:
        asked = int(query.get("resourceVersion", [""])[0])
    except ValueError:
        return None
    if asked >= proxy.expired_before or asked == 0:
        return None
    status = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {asked} ({proxy.expired_before - 1})",
        "reason": "Expired", "code": 410,
    }
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self):
        try:
            self.request.do_handshake()
        except (OSError, ssl.SSLError):
            self.request.close()
            raise
        super().setup()
        self.server.proxy._track(self.request)

    def finish(self):
        self.server.proxy._untrack(self.request)
        try:
            super().finish()
        except OSError:
            pass

    def handle(self):
        try:
            super().handle()
        except (OSError, ssl.SSLError, http.client.HTTPException):
            pass  # cut by the proxy, or the client went away

    def handle_one(self):
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        path, _sep, query = self.path.partition("?")
        record = [self.command, path, query, None]
        proxy.requests.append(record)
        while proxy.fault() == "hang":
            time.sleep(0.2)
        if proxy.fault() == "500":
            proxy.faulted += 1
            record[3] = 500
            self._answer(500, "application/json", STATUS_500)
            return
        gone = _too_old(proxy, urllib.parse.parse_qs(query))
        if gone is not None:
            proxy.faulted += 1
            record[3] = 200
            self._answer(200, "application/json", gone)
            return
        upstream = http.client.HTTPSConnection(
            proxy.upstream.hostname, proxy.upstream.port, timeout=600,
            context=proxy.client_context)
        headers = dict(
            (k, v) for k, v in self.headers.items() if k.lower() not in ("host", "connection")
        )
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            proxy._track(upstream.sock)
            answer = upstream.getresponse()
            record[3] = answer.status
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
        finally:
            if upstream.sock is not None:
                proxy._untrack(upstream.sock)
            upstream.close()

    def _answer(self, code, content_type, body):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_one

    def log_message(self, *args):
        pass
