"""Hosts the NVIDIA stand-ins (tests/support/kubeapi: device plugin and GFD, the kubelet's device
manager behind PodResources, mig-manager, the GPU Operator, GPUCluster, NVIDIA's DRA kubelet
plugin, HAMi) as watch-driven controllers of a real cluster.

Each stand-in is a `reconcile(cluster)` function that reads with list/get/find and writes with
create/patch/set_status/delete. Here `cluster` is a View: reads come from informer caches (a
list, then a watch per kind, as client-go's informers do), writes go to the API server over
HTTP and update the cache with the answer, so a controller reads its own writes. A pass runs
every stand-in; a watch event starts the next pass, and a timer every half second catches what
changes outside the API (the simulated GPUs' state files).
"""

from __future__ import annotations

import logging
import threading
import time

from kubernetes import watch as kube_watch

from tests.support.kubeapi import allocations, deviceplugin, dra, dynamic, gpucluster, hami
from tests.support.kubeapi import migmanager, operator
from tests.support.controlplane.selectors import (fields_match, labels_match, parse_field_selector,
                                                  parse_label_selector)

from .client import ApiError

log = logging.getLogger(__name__)

# What the stand-ins read; other kinds are read from the API server directly.
CACHED_KINDS = (
    "Node",
    "Pod",
    "ConfigMap",
    "DaemonSet",
    "ResourceSlice",
    "ResourceClaim",
    "ClusterPolicy",
    "GPUCluster",
)
RECONCILERS = (
    operator.reconcile,
    gpucluster.reconcile,
    deviceplugin.reconcile,
    allocations.reconcile,
    dra.reconcile,
    dynamic.reconcile,
    hami.reconcile,
    migmanager.reconcile,
)
TICK = 0.5


class _Informer:
    """One kind's objects, kept current by a watch."""

    def __init__(self, client, kind):
        self.client, self.kind = client, kind
        self.objects: dict = {}  # (namespace, name) -> object
        self.gone: dict = {}  # (namespace, name) -> the resourceVersion it was deleted at
        self.synced = threading.Event()
        self.available = True

    def run(self, stopping, changed):
        while not stopping.is_set():
            try:
                res = self.client.resource(self.kind)
            except ApiError:  # a CRD not installed (yet): look again later
                self.available = False
                self.objects.clear()
                self.synced.set()
                stopping.wait(1.0)
                continue
            self.available = True
            try:
                try:
                    version = self._list(res)
                except ApiError as exc:
                    if exc.code != 404:
                        raise
                    # Its CRD was deleted since discovery (a reset): served no more, and the
                    # cache must not keep its objects.
                    self.client.forget_kinds()
                    self.available = False
                    self.objects.clear()
                    self.synced.set()
                    changed.set()
                    stopping.wait(1.0)
                    continue
                self.synced.set()
                changed.set()
                stream = kube_watch.Watch().stream(
                    self.client.dyn.request,
                    "get",
                    res.path(),
                    watch=True,
                    resource_version=version,
                    timeout_seconds=60,
                    serialize=False,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if stopping.is_set():
                        return
                    obj = event.get("raw_object") or event["object"]
                    if event["type"] == "BOOKMARK":
                        continue
                    if event["type"] == "ERROR":
                        break  # 410 Gone: list again
                    self.apply(event["type"], obj)
                    changed.set()
            except Exception as exc:  # pylint: disable=broad-except
                if stopping.is_set():
                    return
                log.debug("watch of %s ended: %s; listing again", self.kind, exc)
                stopping.wait(0.2)

    def behind(self) -> list | None:
        """What the cache lacks or holds stale against what the API server holds now (a newer
        write of ours is not stale), as (namespace, name) keys: [] when it is current, None
        when the kind is not listed yet."""
        try:
            listed = self.client.list(self.kind)
        except ApiError:
            # a kind not served: current while the cache knows it
            return [] if not self.available else None
        if not self.synced.is_set() or not self.available:
            return None
        now = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in listed}
        cached = dict(self.objects)
        return sorted(set(cached) - set(now)) + sorted(
            key for key, obj in now.items() if key not in cached or _rv(cached[key]) < _rv(obj))

    def _list(self, res) -> str:
        """Takes what the API server holds now; returns the list's resourceVersion."""
        listed = self.client._call("get", res.path())  # pylint: disable=protected-access
        self.objects = {
            (o["metadata"].get("namespace"), o["metadata"]["name"]): dict(
                o, kind=self.kind, apiVersion=res.group_version
            )
            for o in listed.get("items") or []
        }
        return listed["metadata"]["resourceVersion"]

    def relist(self) -> None:
        """Takes what the API server holds now, as a watch that lags behind would only later.
        A late event of the watch then finds newer objects here and is dropped."""
        self._list(self.client.resource(self.kind))

    def apply(self, event_type, obj):
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        if event_type == "DELETED":
            self.objects.pop(key, None)
            self.gone[key] = max(_rv(obj), self.gone.get(key, 0))
            return
        if _rv(obj) <= self.gone.get(key, 0):
            # The answer to a write of ours, come after the watch told of the object's deletion
            # (a reset deleting what a stand-in was writing): kept, it would hide for good that
            # the object is gone, and the stand-in would never make it again.
            return
        old = self.objects.get(key)
        if old and _rv(old) > _rv(obj):
            return  # the cache already holds a newer write of ours
        self.objects[key] = dict(obj, kind=obj.get("kind") or self.kind)


def _rv(obj) -> int:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return 0


class View:
    """The `cluster` the stand-ins see: cached reads, writes through the client."""

    def __init__(self, client, informers: dict):
        self.client = client
        self.informers = informers
        self.lock = client.lock
        self.errors = client.errors
        self.host = None  # the StandIns that runs passes (for allocations.sync)

    def _reconcile(self):
        self.host.run_once()

    def _cached(self, kind):
        informer = self.informers.get(kind)
        return informer if informer is not None and informer.synced.is_set() else None

    def list(self, kind, namespace=None, label_selector="", field_selector=""):
        informer = self._cached(kind)
        if informer is None:
            try:
                return self.client.list(kind, namespace, label_selector, field_selector)
            except ApiError as exc:
                if exc.code == 404:
                    return []
                raise
        labels = parse_label_selector(label_selector) if label_selector else None
        fields = parse_field_selector(field_selector) if field_selector else None
        out = []
        for (ns, dummy), obj in sorted(
            informer.objects.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])
        ):
            if namespace and ns != namespace:
                continue
            if labels and not labels_match(
                labels, (obj.get("metadata") or {}).get("labels") or {}
            ):
                continue
            if fields and not fields_match(fields, obj):
                continue
            out.append(_copy(obj))
        return out

    def get(self, kind, name, namespace=None):
        found = self.find(kind, name, namespace)
        if found is None:
            raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
        return found

    def find(self, kind, name, namespace=None):
        informer = self._cached(kind)
        if informer is None:
            try:
                return self.client.find(kind, name, namespace)
            except ApiError as exc:
                if exc.code == 404:
                    return None
                raise
        res_namespace = (
            None
            if kind in ("Node", "ClusterPolicy", "GPUCluster", "ResourceSlice")
            else (namespace or "default")
        )
        obj = informer.objects.get((res_namespace, name))
        return _copy(obj) if obj is not None else None

    def _wrote(self, kind, obj):
        informer = self.informers.get(kind)
        if informer is not None and isinstance(obj, dict) and obj.get("metadata"):
            informer.apply("MODIFIED", dict(obj, kind=kind))
        return obj

    def create(self, obj):
        return self._wrote(obj["kind"], self.client.create(obj))

    def patch(self, kind, name, body, namespace=None, patch_type="merge", subresource=None):
        return self._wrote(kind, self.client.patch(kind, name, body, namespace, patch_type,
                                                   subresource))

    def replace(self, obj):
        return self._wrote(obj["kind"], self.client.replace(obj))

    def set_status(self, kind, name, status, namespace=None):
        current = self.find(kind, name, namespace)  # from the cache
        return self._wrote(kind, self.client.set_status(kind, name, status, namespace,
                                                        current=current or {}))

    def delete(self, kind, name, namespace=None):
        out = self.client.delete(kind, name, namespace)
        informer = self.informers.get(kind)
        if informer is not None and kind != "Pod":  # a pod stays, Terminating, until kwok ends it
            informer.objects.pop((None if kind == "Node" else namespace or "default", name), None)
        return out


def _copy(obj):
    import copy  # pylint: disable=import-outside-toplevel

    return copy.deepcopy(obj)


class StandIns:
    """Runs RECONCILERS against `client`'s cluster until stopped."""

    def __init__(self, client, reconcilers=RECONCILERS):
        self.client = client
        self.reconcilers = reconcilers
        self.informers = {kind: _Informer(client, kind) for kind in CACHED_KINDS}
        self.view = View(client, self.informers)
        self.view.host = self
        self._stopping = threading.Event()
        self._changed = threading.Event()
        self._threads: list = []
        self._pass_lock = threading.RLock()

    def start(self, timeout: float = 30.0) -> "StandIns":
        for informer in self.informers.values():
            self._spawn(
                informer.run, self._stopping, self._changed, name=f"informer-{informer.kind}"
            )
        deadline = time.monotonic() + timeout
        for informer in self.informers.values():
            informer.synced.wait(max(0.1, deadline - time.monotonic()))
        self._spawn(self._loop, name="stand-ins")
        return self

    def _spawn(self, target, *args, name):
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _loop(self):
        while not self._stopping.is_set():
            self._changed.wait(TICK)
            self._changed.clear()
            if self._stopping.is_set():
                return
            self.run_once()

    def run_once(self):
        """One pass of every stand-in (also what allocations.sync asks for)."""
        with self._pass_lock, self.client.lock:
            for reconcile in self.reconcilers:
                try:
                    reconcile(self.view)
                except ApiError as exc:
                    if exc.code not in (
                        404,
                        409,
                    ):  # a race with a test or another writer: next pass
                        log.warning("stand-in %s: %s", reconcile.__module__, exc)
                except Exception as exc:  # pylint: disable=broad-except
                    log.exception("stand-in %s failed", reconcile.__module__)
                    self.client.errors.append(exc)

    def sync(self, timeout: float = 30.0) -> None:
        """Returns once every informer's cache holds what the API server held at the call and a
        pass has run over it: the stand-ins have started what they do about every change stored
        before the call (they act after a watch event, not inside the write, so a test that needs
        their answer to its write calls this first)."""
        started = time.monotonic()
        for informer in self.informers.values():
            relisted = False
            while True:
                behind = informer.behind()
                if behind == []:
                    break
                waited = time.monotonic() - started
                if waited > timeout:
                    raise TimeoutError(
                        f"the {informer.kind} cache is not current after {timeout} s"
                        f" (behind: {behind}, relisted: {relisted})"
                    )
                if waited > timeout / 3 and behind and not relisted:
                    # A watch on a loaded machine can lag by seconds: list instead.
                    log.warning("the %s watch lags (%s): listing", informer.kind, behind)
                    informer.relist()
                    relisted = True
                time.sleep(0.05)
        self.run_once()

    def reset(self):
        """Forgets what the stand-ins remember (books, published plugins, mig-manager runs):
        their module-level state is keyed by the view, so a new view starts afresh."""
        with self._pass_lock, self.client.lock:
            self.view = View(self.client, self.informers)
            self.view.host = self

    def stop(self):
        self._stopping.set()
        self._changed.set()
