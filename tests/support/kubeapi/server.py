"""The HTTP face of the emulator: Kubernetes REST paths on 127.0.0.1, served by aiohttp in a thread."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import socket
import threading

import yaml
from aiohttp import web

from . import protobuf, resources
from .cluster import Cluster
from .errors import ApiError, bad_request
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector

PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
# Kinds whose DELETE answers with the object; the others answer a Success Status.
DELETE_RETURNS_OBJECT = {"Pod", "Namespace"}

log = logging.getLogger(__name__)
_STOP = object()  # ends a watch stream when the server stops

RequestRecord = collections.namedtuple("RequestRecord", "method path query content_type")


def version_info(git_version: str) -> dict:
    major, minor = re.match(r"v?(\d+)\.(\d+)", git_version).groups()
    return {"major": major, "minor": minor, "gitVersion": git_version, "gitCommit": "0" * 40,
            "gitTreeState": "clean", "buildDate": "2024-08-13T00:00:00Z", "goVersion": "go1.22.5",
            "compiler": "gc", "platform": "linux/amd64"}


class KubeAPI(Cluster):
    """A Kubernetes API emulator: `start()` it, point clients at `write_kubeconfig()`, `stop()` it."""

    def __init__(self, *, version: str = "v1.31.0", run_controllers: bool = True):
        super().__init__(run_controllers=run_controllers)
        self.git_version = version  # what GET /version reports; change it to test kubeVersion checks
        self.requests: list = []  # every request, for assertions on what clients sent
        self.host, self.port = "127.0.0.1", None
        self.kubeconfig = None  # path of the last kubeconfig written
        self._thread = self._loop = self._stopping = None
        self._watch_queues: set = set()
        self._startup_error = None

    # ----- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0) -> KubeAPI:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock, ready), name="kubeapi", daemon=True)
        self._thread.start()
        if not ready.wait(15) or self._startup_error:
            raise RuntimeError(f"kubeapi did not start: {self._startup_error}")
        return self

    def stop(self):
        if self._loop and self._stopping and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(15)

    def __enter__(self):
        return self.start() if self.port is None else self

    def __exit__(self, *exc):
        self.stop()

    def write_kubeconfig(self, path, namespace: str = "default") -> str:
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "kubeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "kubeapi", "user": {"token": "kubeapi-test-token"}}],
            "contexts": [{"name": "kubeapi", "context": {"cluster": "kubeapi", "user": "kubeapi",
                                                         "namespace": namespace}}],
            "current-context": "kubeapi",
        }
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        self.kubeconfig = str(path)
        return self.kubeconfig

    def _run(self, sock, ready):
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve(sock, ready))
        except Exception as exc:  # surfaced by start()
            self._startup_error = exc
            ready.set()
        finally:
            self._loop.close()

    async def _serve(self, sock, ready):
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._stopping = asyncio.Event()
        ready.set()
        await self._stopping.wait()
        for queue in list(self._watch_queues):
            queue.put_nowait(_STOP)
        await runner.cleanup()

    # ----- request handling ----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        query = dict(request.query)
        self.requests.append(RequestRecord(request.method, request.path, query, request.content_type))
        try:
            fixed = self._fixed_path(request.path)
            if fixed is not None:
                return fixed
            res, namespace, name, sub = self._resource_path(request.path)
            if not resources.served(res, self.served_crds()):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if request.method == "GET" and name is None and query.get("watch") in ("1", "true"):
                return await self._watch(request, res, namespace, query)
            payload, code = self._dispatch(request.method, res, namespace, name, sub, query,
                                           request.content_type, body)
            return web.json_response(payload, status=code)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)
        except Exception as exc:  # an emulator bug: answer like the API server would, and fail the test
            if exc not in self.errors:
                self.errors.append(exc)
                log.exception("kubeapi failed on %s %s", request.method, request.path)
            error = ApiError(500, "InternalError", f"kubeapi emulator error: {exc!r}")
            return web.json_response(error.status(), status=500)

    def _fixed_path(self, path: str):
        """Discovery and the other non-resource endpoints; None for resource paths."""
        parts = [p for p in path.split("/") if p]
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return web.json_response(version_info(self.git_version))
        if path == "/openapi/v2":
            # An empty protobuf document: helm's client-side validation then checks nothing.
            return web.Response(body=b"", content_type="application/octet-stream")
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]})
        crds = self.served_crds()
        if parts == ["apis"]:
            return web.json_response(resources.api_group_list(crds))
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in resources.groups(crds):
            return web.json_response(dict(resources.api_group(parts[1], crds), kind="APIGroup", apiVersion="v1"))
        if parts == ["api", "v1"]:
            return web.json_response(resources.api_resource_list("", "v1", crds))
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in resources.groups(crds).get(parts[1], ()):
            return web.json_response(resources.api_resource_list(parts[1], parts[2], crds))
        if not parts or parts[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return None

    @staticmethod
    def _resource_path(path: str):
        """/api/v1/... or /apis/G/V/... -> (resource, namespace, name, subresource)."""
        parts = [p for p in path.split("/") if p]
        if parts[0] == "api":
            group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
        else:
            group, version, rest = parts[1], parts[2] if len(parts) > 2 else "", parts[3:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            candidate = resources.by_path(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        res = resources.by_path(group, version, rest[0]) if rest else None
        if res is None or len(rest) > 3 or (res.namespaced and namespace is None and len(rest) > 1):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return res, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None

    def _dispatch(self, method, res, namespace, name, sub, query, content_type, body):
        dry_run = query.get("dryRun") == "All"
        if name is None:
            if method == "GET":
                items, rv = self._list(res, namespace, query.get("labelSelector", ""),
                                       query.get("fieldSelector", ""))
                return {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": rv}, "items": items}, 200
            if method == "POST":
                return self._create(res, namespace, _decode(content_type, body), dry_run=dry_run), 201
            if method == "DELETE":
                items, rv = self._list(res, namespace, query.get("labelSelector", ""),
                                       query.get("fieldSelector", ""))
                for item in items:
                    self._delete(res, item["metadata"].get("namespace"), item["metadata"]["name"], dry_run=dry_run)
                return {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": rv}, "items": items}, 200
        elif sub is None:
            if method == "GET":
                return self._read(res, namespace, name), 200
            if method == "PUT":
                return self._update(res, namespace, name, _decode(content_type, body), part="main",
                                    dry_run=dry_run), 200
            if method == "PATCH":
                obj, created = self._patch(res, namespace, name, _decode(content_type, body),
                                           _patch_type(content_type), part="main", dry_run=dry_run)
                return obj, 201 if created else 200
            if method == "DELETE":
                options = _decode(content_type, body) or {}
                deleted = self._delete(
                    res, namespace, name, dry_run=dry_run or "All" in (options.get("dryRun") or []),
                    propagation=query.get("propagationPolicy") or options.get("propagationPolicy"),
                    preconditions=options.get("preconditions"))
                if res.kind in DELETE_RETURNS_OBJECT:
                    return deleted, 200
                return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": res.group, "kind": res.plural,
                                    "uid": deleted["metadata"]["uid"]}}, 200
        elif sub == "status" and res.has_status:
            if method == "GET":
                return self._read(res, namespace, name), 200
            if method == "PUT":
                return self._update(res, namespace, name, _decode(content_type, body), part="status",
                                    dry_run=dry_run), 200
            if method == "PATCH":
                return self._patch(res, namespace, name, _decode(content_type, body), _patch_type(content_type),
                                   part="status", dry_run=dry_run)[0], 200
        elif sub == "eviction" and res.kind == "Pod":
            if method == "POST":
                eviction = _decode(content_type, body) or {}
                options = eviction.get("deleteOptions") or {}
                self._evict(namespace, name, dry_run=dry_run or "All" in (options.get("dryRun") or []))
                return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # ----- watch ---------------------------------------------------------------------------------

    async def _watch(self, request, res, namespace, query):
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def matches(obj):
            return obj is not None and (namespace is None or obj["metadata"].get("namespace") == namespace) \
                and labels_match(labels, obj["metadata"].get("labels")) and fields_match(fields, obj)

        def translate(event_type, obj, old):
            now_matches = matches(obj)
            was_matching = event_type == "modified" and matches(old)
            if event_type == "deleted":
                return ("DELETED", obj) if now_matches else None
            if now_matches:
                return ("MODIFIED" if was_matching else "ADDED", obj)
            return ("DELETED", obj) if was_matching else None

        def push(_rv, event_res, event_type, obj, old):  # runs on the writer's thread
            event = translate(event_type, obj, old) if event_res is res else None
            if event:
                loop.call_soon_threadsafe(queue.put_nowait, event)

        with self.lock:
            since = query.get("resourceVersion")
            if since and since != "0":
                backlog = self.history_since(int(since))
                if backlog is None:
                    initial = [("ERROR", ApiError(410, "Expired", f"too old resource version: {since}").status())]
                else:
                    initial = [translate(t, o, old) for _rv, r, t, o, old in backlog if r is res]
            else:
                initial = [("ADDED", obj) for obj in self._list(res, namespace)[0] if matches(obj)]
            self._watchers.append(push)
        self._watch_queues.add(queue)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = loop.time() + timeout
        try:
            for event in initial:
                if event:
                    await response.write(_event_line(event))
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
                if event is _STOP:
                    break
                await response.write(_event_line(event))
        except ConnectionResetError:
            pass
        finally:
            with self.lock:
                self._watchers.remove(push)
            self._watch_queues.discard(queue)
        return response


def _event_line(event) -> bytes:
    return json.dumps({"type": event[0], "object": event[1]}).encode() + b"\n"


def _decode(content_type: str, body: bytes):
    if not body:
        return None
    if content_type == "application/vnd.kubernetes.protobuf":
        return protobuf.decode(body)
    try:
        if content_type.endswith("yaml"):
            return yaml.safe_load(body)
        return json.loads(body)
    except (ValueError, yaml.YAMLError) as exc:
        raise bad_request(f"the body of the request could not be decoded: {exc}") from exc


def _patch_type(content_type: str) -> str:
    if content_type not in PATCH_TYPES:
        raise ApiError(415, "UnsupportedMediaType", f"the media type {content_type!r} is not a patch type")
    return PATCH_TYPES[content_type]
