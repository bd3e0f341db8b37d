"""The in-memory cluster: object store, API semantics, eviction, hooks and controllers.

Everything here is plain synchronous Python guarded by one re-entrant lock, so
the HTTP server thread and test code (seeding, hooks, assertions) can share it.
Tests use the kind-based methods (`create`, `get`, `list`, `patch`, `replace`,
`delete`, `evict`, `set_status`, `seed`, `on`); the HTTP layer uses the
`_`-prefixed ones, which take a Resource and the request's options.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import random
import threading
import uuid

from . import allocations, controllers, patch as patches, resources
from .controllers import now
from .errors import ApiError, already_exists, bad_request, conflict, not_found, resource_version_required
from .selectors import fields_match, labels_match, parse_field_selector, parse_label_selector, selector_requirements

log = logging.getLogger(__name__)

EVENTS = ("added", "modified", "deleted", "evicted", "eviction-refused")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet the API server uses for generateName


@dataclasses.dataclass
class Event:
    """What a hook receives. `old` is set for modified/deleted, `pdb` for eviction events."""
    type: str
    kind: str
    obj: dict
    old: dict | None = None
    pdb: dict | None = None


class Cluster:
    def __init__(self, *, run_controllers: bool = True):
        self.lock = threading.RLock()
        self._objects: dict = {}  # (group, plural, namespace, name) -> object
        self._rv = 0
        self._history = collections.deque(maxlen=5000)  # (rv, resource, type, obj, old) for watch replays
        self._watchers: list = []
        self._hooks: list = []
        self._controllers = list(controllers.ALL) if run_controllers else []
        self._reconciling = False
        self._dirty = False
        self._next_ip = 0
        self.errors: list = []  # exceptions raised by hooks or controllers; the fixture fails on any
        for name in DEFAULT_NAMESPACES:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ----- kind-based API for tests --------------------------------------------------------------

    def create(self, obj: dict) -> dict:
        res = resources.by_kind(obj.get("kind", ""), obj.get("apiVersion"))
        return self._create(res, obj.get("metadata", {}).get("namespace"), obj)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        res = resources.by_kind(kind)
        return self._read(res, self._ns(res, namespace), name)

    def find(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """Like get, but None when the object does not exist."""
        try:
            return self.get(kind, name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, label_selector: str = "",
             field_selector: str = "") -> list:
        return self._list(resources.by_kind(kind), namespace, label_selector, field_selector)[0]

    def patch(self, kind: str, name: str, body, namespace: str | None = None, patch_type: str = "merge") -> dict:
        """patch_type: merge, strategic or json."""
        res = resources.by_kind(kind)
        return self._patch(res, self._ns(res, namespace), name, body, patch_type)[0]

    def replace(self, obj: dict) -> dict:
        res = resources.by_kind(obj["kind"], obj.get("apiVersion"))
        meta = obj["metadata"]
        return self._update(res, self._ns(res, meta.get("namespace")), meta["name"], obj)

    def set_status(self, kind: str, name: str, status: dict, namespace: str | None = None) -> dict:
        """Replace an object's status, as a controller does; nothing happens when it is unchanged."""
        res = resources.by_kind(kind)
        return self._update(res, self._ns(res, namespace), name, {"status": status}, part="status")

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict:
        res = resources.by_kind(kind)
        return self._delete(res, self._ns(res, namespace), name)

    def evict(self, name: str, namespace: str = "default") -> None:
        self._evict(namespace, name)

    def seed(self, *objs: dict) -> list:
        """Create objects (or replace existing ones), creating missing namespaces first."""
        out = []
        with self.lock:
            for obj in objs:
                res = resources.by_kind(obj["kind"], obj.get("apiVersion"))
                meta = obj.setdefault("metadata", {})
                namespace = self._ns(res, meta.get("namespace"))
                if namespace and not self._objects.get(("", "namespaces", None, namespace)):
                    self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
                if (res.group, res.plural, namespace, meta.get("name")) in self._objects:
                    out.append(self._update(res, namespace, meta["name"], obj))
                else:
                    out.append(self._create(res, namespace, obj))
        return out

    def on(self, event: str, callback, kind: str | None = None):
        """Call `callback(Event)` on each event (see EVENTS) for `kind` (all kinds when None).

        Hooks run synchronously on the thread that made the change, inside the
        cluster lock, so they may read and write the cluster but must not block;
        start a threading.Timer for delayed actions. Returns a function that
        removes the hook.
        """
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; choose from {EVENTS}")
        entry = (event, kind, callback)
        self._hooks.append(entry)
        return lambda: self._hooks.remove(entry)

    def served_crds(self) -> set:
        """Names of the CustomResourceDefinitions that exist: their kinds are served over HTTP."""
        with self.lock:
            return {key[3] for key in self._objects if key[:2] == ("apiextensions.k8s.io", "customresourcedefinitions")}

    # ----- API semantics -------------------------------------------------------------------------

    @staticmethod
    def _ns(res, namespace):
        return (namespace or "default") if res.namespaced else None

    def _key(self, res, namespace, name):
        return (res.group, res.plural, namespace, name)

    def _read(self, res, namespace, name) -> dict:
        with self.lock:
            obj = self._objects.get(self._key(res, namespace, name))
            if obj is None:
                raise not_found(res, name)
            return copy.deepcopy(obj)

    def _list(self, res, namespace, label_selector="", field_selector=""):
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector)
        with self.lock:
            items = [
                copy.deepcopy(obj) for key, obj in sorted(self._objects.items(), key=_sort_key)
                if key[:2] == (res.group, res.plural) and (namespace is None or key[2] == namespace)
                and labels_match(labels, obj["metadata"].get("labels")) and fields_match(fields, obj)
            ]
            return items, str(self._rv)

    def _check_identity(self, res, namespace, name, body):
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        if body.get("kind") and body["kind"] != res.kind:
            raise bad_request(f"the kind {body['kind']} does not match the resource {res.plural}")
        if body.get("apiVersion") and body["apiVersion"] != res.api_version:
            raise bad_request(f"the emulator serves {res.kind} only as {res.api_version}")
        meta = body.get("metadata") or {}
        if name and meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if namespace and meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")

    def _create(self, res, namespace, body, *, dry_run=False) -> dict:
        if res.kind == "SelfSubjectAccessReview":  # no RBAC here: allowed, and nothing stored
            return dict(body, status={"allowed": True, "reason": "the emulator has no RBAC"})
        self._check_identity(res, namespace, None, body)
        namespace = self._ns(res, namespace or (body.get("metadata") or {}).get("namespace"))
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta = obj.setdefault("metadata", {})
        with self.lock:
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, "Invalid", f"{res.kind} is invalid: metadata.name: Required value")
                meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
            if namespace and not self._objects.get(("", "namespaces", None, namespace)):
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
            key = self._key(res, namespace, meta["name"])
            if key in self._objects:
                raise already_exists(res, meta["name"])
            if namespace:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            for system_field in ("resourceVersion", "deletionTimestamp", "selfLink"):
                meta.pop(system_field, None)
            if res.kind in resources.GENERATION_KINDS:
                meta["generation"] = 1
            self._default(res, obj)
            if dry_run:
                return obj
            return self._commit(res, key, obj, None, "added")

    def _default(self, res, obj):
        """Fields the API server or a kubelet would fill in at once on create."""
        _default_spec(res.kind, obj)
        if res.kind == "Pod" and not (obj.get("status") or {}).get("phase"):
            node = (obj.get("spec") or {}).get("nodeName")
            obj["status"] = controllers.running_pod_status(obj) if node else {"phase": "Pending"}
        elif res.kind == "Namespace":
            obj.setdefault("status", {"phase": "Active"})
        elif res.kind == "Service":
            spec = obj.setdefault("spec", {})
            if spec.get("type", "ClusterIP") != "ExternalName" and not spec.get("clusterIP"):
                self._next_ip += 1
                spec["clusterIP"] = f"10.96.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
                spec["clusterIPs"] = [spec["clusterIP"]]

    def _update(self, res, namespace, name, body, *, part="all", dry_run=False) -> dict:
        """part: "all" (tests; the whole object), "main" (HTTP PUT: status kept) or "status"."""
        self._check_identity(res, namespace, name, body)
        with self.lock:
            key = self._key(res, namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise not_found(res, name)
            # Optimistic concurrency as the generic registry's Update does it (staging/src/k8s.io/apiserver/pkg/
            # registry/generic/registry/store.go): a resourceVersion that is not the stored one is a 409
            # Conflict, for a PUT and for a patch that sets it alike; none is an unconditional update where the
            # kind's strategy allows one, else 422. Patches without one always apply to the stored object.
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise conflict(res, name)
            if not sent_rv and part == "main" and res.kind in resources.UPDATE_NEEDS_RESOURCE_VERSION:
                raise resource_version_required(res, name)
            if part == "status":
                new = copy.deepcopy(old)
                new["status"] = copy.deepcopy(body.get("status"))
                if new["status"] is None:
                    del new["status"]
            else:
                new = copy.deepcopy(body)
                if part == "main" and res.has_status:
                    new.pop("status", None)
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
            new["apiVersion"], new["kind"] = res.api_version, res.kind
            meta = new.setdefault("metadata", {})
            for fixed in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion", "generation"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
                else:
                    meta.pop(fixed, None)
            _default_spec(res.kind, new)
            if new == old:
                return copy.deepcopy(old)  # a no-op write keeps the resourceVersion, as on a real server
            if res.kind in resources.GENERATION_KINDS and _spec_of(new) != _spec_of(old):
                meta["generation"] = old["metadata"].get("generation", 1) + 1
            if dry_run:
                return new
            return self._commit(res, key, new, old, "modified")

    def _patch(self, res, namespace, name, body, patch_type, *, part="all", dry_run=False):
        """Returns (object, created). patch_type: json, merge, strategic or apply."""
        with self.lock:
            key = self._key(res, namespace, name)
            old = self._objects.get(key)
            if old is None:
                if patch_type != "apply":
                    raise not_found(res, name)
                # Server-side apply creates; field ownership is not tracked (treated as a merge patch).
                if not isinstance(body, dict):
                    raise bad_request("an apply patch must be an object")
                body = copy.deepcopy(body)
                body.setdefault("metadata", {}).update(name=name)
                return self._create(res, namespace, body, dry_run=dry_run), True
            if patch_type == "json":
                patched = patches.json_patch(copy.deepcopy(old), body)
            elif patch_type == "strategic":
                patched = patches.strategic_merge_patch(old, body)
            elif patch_type in ("merge", "apply"):
                if not isinstance(body, dict):
                    raise bad_request("a merge patch must be a JSON object")
                patched = patches.merge_patch(old, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type}")
            if part == "status":
                return self._update(res, namespace, name, patched, part="status", dry_run=dry_run), False
            if part == "main" and res.has_status:
                patched["status"] = copy.deepcopy(old.get("status"))
                if patched["status"] is None:
                    del patched["status"]
            return self._update(res, namespace, name, patched, dry_run=dry_run), False

    def _delete(self, res, namespace, name, *, dry_run=False, propagation=None, preconditions=None) -> dict:
        with self.lock:
            key = self._key(res, namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise not_found(res, name)
            meta = old["metadata"]
            for field in ("uid", "resourceVersion"):
                if (preconditions or {}).get(field) and preconditions[field] != meta.get(field):
                    raise conflict(res, name)
            if dry_run:
                return copy.deepcopy(old)
            if res.kind == "Namespace":
                # Contents first, owners before what they own, so no controller refills the namespace.
                contents = sorted((k for k in self._objects if k[2] == name),
                                  key=lambda k: bool(self._objects[k]["metadata"].get("ownerReferences")))
                for content in contents:
                    if content in self._objects:
                        self._delete(resources.by_plural(content[0], content[1]), content[2], content[3])
            # Finalizers and grace periods are not emulated: objects go at once.
            self._commit(res, key, None, old, "deleted")
            if propagation != "Orphan":
                self._delete_dependents(meta["uid"])
            return copy.deepcopy(old)

    def _delete_dependents(self, owner_uid):
        for key, obj in list(self._objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if key in self._objects and any(ref.get("uid") == owner_uid for ref in refs):
                self._delete(resources.by_plural(key[0], key[1]), key[2], key[3])

    def _evict(self, namespace, name, *, dry_run=False):
        """POST pods/NAME/eviction, following the API server's eviction REST handler."""
        pod_res = resources.by_kind("Pod")
        with self.lock:
            pod = self._read(pod_res, namespace, name)
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
                return self._finish_eviction(pod_res, pod, None, dry_run)
            pdbs = [pdb for pdb in self.list("PodDisruptionBudget", namespace)
                    if labels_match(selector_requirements((pdb.get("spec") or {}).get("selector")),
                                    pod["metadata"].get("labels"))]
            if len(pdbs) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                                                     "which the eviction subresource does not support.")
            if not pdbs:
                return self._finish_eviction(pod_res, pod, None, dry_run)
            pdb = pdbs[0]
            budget = pdb.get("status") or {}
            allowed = budget.get("disruptionsAllowed", 0)
            healthy, desired = budget.get("currentHealthy", 0), budget.get("desiredHealthy", 0)
            if not allocations.pod_ready(pod) and healthy >= desired > 0:
                return self._finish_eviction(pod_res, pod, pdb, dry_run)  # unhealthy pods go when the budget holds
            if allowed < 0:
                raise ApiError(403, "Forbidden", "pdb disruptions allowed is negative")
            if allowed == 0:
                self._fire(Event("eviction-refused", "Pod", pod, pdb=pdb))
                raise ApiError(
                    429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [{"reason": "DisruptionBudget", "message":
                                 f"The disruption budget {pdb['metadata']['name']} needs {desired} healthy pods "
                                 f"and has {healthy} currently"}]})
            if not dry_run:
                self.set_status("PodDisruptionBudget", pdb["metadata"]["name"],
                                dict(budget, disruptionsAllowed=allowed - 1), namespace)
            return self._finish_eviction(pod_res, pod, pdb, dry_run)

    def _finish_eviction(self, pod_res, pod, pdb, dry_run):
        if dry_run:
            return
        self._delete(pod_res, pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._fire(Event("evicted", "Pod", pod, pdb=pdb))

    # ----- change propagation --------------------------------------------------------------------

    def _commit(self, res, key, new, old, event_type) -> dict:
        self._rv += 1
        if new is None:
            del self._objects[key]
            recorded = copy.deepcopy(old)
            recorded["metadata"]["resourceVersion"] = str(self._rv)
        else:
            new["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[key] = new
            recorded = copy.deepcopy(new)
        self._history.append((self._rv, res, event_type, recorded, old))
        for watcher in list(self._watchers):
            watcher(self._rv, res, event_type, recorded, old)
        self._fire(Event(event_type, res.kind, copy.deepcopy(recorded), copy.deepcopy(old)))
        self._reconcile()
        return copy.deepcopy(new) if new is not None else recorded

    def _fire(self, event: Event):
        for name, kind, callback in list(self._hooks):
            if name == event.type and (kind is None or kind == event.kind):
                try:
                    callback(event)
                except HookError:
                    raise
                except Exception as exc:  # a broken hook must fail the test, not just the request
                    self.errors.append(exc)
                    log.exception("kubeapi hook %r failed", callback)
                    raise HookError(500, "InternalError", f"emulator hook failed: {exc!r}") from exc

    def _reconcile(self):
        """Run the controllers until nothing changes; writes they make only mark another pass."""
        if self._reconciling:
            self._dirty = True
            return
        self._reconciling = True
        try:
            for _pass in range(50):
                self._dirty = False
                for controller in self._controllers:
                    controller(self)
                if not self._dirty:
                    return
            raise RuntimeError("kubeapi controllers did not settle after 50 passes")
        except HookError:
            raise
        except Exception as exc:
            self.errors.append(exc)
            log.exception("kubeapi controller failed")
            raise
        finally:
            self._reconciling = False

    def history_since(self, rv: int):
        """Events after resourceVersion `rv`, or None when they are no longer kept (watch answers 410)."""
        with self.lock:
            if self._history and self._history[0][0] > rv + 1:
                return None
            return [entry for entry in self._history if entry[0] > rv]

    @property
    def resource_version(self) -> int:
        return self._rv


class HookError(ApiError):
    """A hook raised; already recorded in Cluster.errors."""


def _default_spec(kind: str, obj: dict):
    """The API server's defaulting for the workload fields clients dereference
    (helm --wait reads DaemonSet rollingUpdate and Deployment replicas)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        spec.setdefault("replicas", 1)
    if kind == "Deployment":
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            strategy.setdefault("rollingUpdate", {}).update(
                {k: v for k, v in (("maxUnavailable", "25%"), ("maxSurge", "25%"))
                 if k not in strategy.get("rollingUpdate", {})})
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
    elif kind == "DaemonSet":
        strategy = spec.setdefault("updateStrategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", 1)
            rolling.setdefault("maxSurge", 0)
        spec.setdefault("revisionHistoryLimit", 10)
    elif kind == "StatefulSet":
        strategy = spec.setdefault("updateStrategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            strategy.setdefault("rollingUpdate", {}).setdefault("partition", 0)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("revisionHistoryLimit", 10)


def _spec_of(obj):
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _sort_key(item):
    key = item[0]  # (group, plural, namespace, name)
    return (key[2] or "", key[3])
