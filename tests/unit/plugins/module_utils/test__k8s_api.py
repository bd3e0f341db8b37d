"""The collection's own Kubernetes calls are bounded (plugins/module_utils/_k8s_api.py): a hung API
server fails a call after its timeout, and 5xx answers are retried with backoff before they fail
it."""

import http.server
import json
import threading
import time

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _k8s_api as k8s_api

kubernetes = pytest.importorskip("kubernetes")


class Api(http.server.BaseHTTPRequestHandler):
    """Answers GET /version as `script` says for each request in turn: a status, or "hang"."""

    script, seen = [], []

    def do_GET(self):
        step = self.script.pop(0) if self.script else 200
        self.seen.append(step)
        if step == "hang":
            time.sleep(3)
            return
        body = json.dumps({"major": "1", "minor": "31"} if step == 200 else {"code": step})
        self.send_response(step)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Api.script, Api.seen = [], []
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()


def client_of(api, monkeypatch, read, retries):
    """An ApiClient as kubernetes.core builds one (its discovery needs a whole API server)."""
    monkeypatch.setattr(k8s_api, "READ_TIMEOUT", read)
    monkeypatch.setattr(k8s_api, "RETRIES", retries)
    return k8s_api.bounded(kubernetes.client.ApiClient, kubernetes.client.Configuration(host=api))


def version(client):
    """(HTTP status, body) of GET /version, after the client's retries."""
    answer = client.call_api("GET", client.configuration.host + "/version")
    return answer.status, json.loads(answer.read() or b"{}")


def test_5xx_answers_are_retried_with_backoff(api, monkeypatch):
    client = client_of(api, monkeypatch, read=5, retries=3)
    Api.script, Api.seen = [500, 503], []
    assert version(client) == (200, {"major": "1", "minor": "31"})
    assert Api.seen == [500, 503, 200]


def test_a_hung_api_server_fails_the_call_after_the_timeout_and_the_retries(api, monkeypatch):
    client = client_of(api, monkeypatch, read=0.5, retries=1)
    Api.script, Api.seen = ["hang", "hang"], []
    started = time.monotonic()
    with pytest.raises(Exception):
        version(client)
    assert time.monotonic() - started < 2.9 and Api.seen == ["hang", "hang"]


def test_retries_give_up_and_the_last_5xx_is_the_answer(api, monkeypatch):
    client = client_of(api, monkeypatch, read=5, retries=1)
    Api.script, Api.seen = [500, 500, 500], []
    assert version(client)[0] == 500 and Api.seen == [500, 500]
