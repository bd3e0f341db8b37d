"""One test cluster as tests see it: the kind-based Client, the audit log as a record of what
clients asked, watch-driven hooks, and a reset that takes the cluster back to how it started, so
tests share one control plane per pytest worker without seeing each other.

    cluster = TestCluster(control_plane)     # after control_plane.start()
    cluster.on("deleted", seen.append, kind="Pod")
    ...
    cluster.reset()                          # between tests

Outside pytest (the crash sweep, the benches), `running(workdir)` starts and stops it all:

    with running(workdir) as cluster:        # cluster.stand_ins: the NVIDIA stand-ins
        ...
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from kubernetes import watch as kube_watch

from .client import SYSTEM_NAMESPACES, ApiError, Client
from .pki import CLIENTS

HARNESS_USER = CLIENTS["harness"]

EVENTS = ("added", "modified", "deleted")
# Answers to pods/eviction, read from the audit log: the real server has no event for them.
EVICTION_EVENTS = {"evicted": 201, "eviction-refused": 429}
# Kinds a reset looks at: everything a test of this collection creates. Cluster-scoped kinds
# and namespaced ones in the system namespaces are deleted one by one when they were not there
# at the start; namespaces a test made are deleted whole.
RESET_KINDS = (
    "Node",
    "CustomResourceDefinition",
    "ResourceSlice",
    "DeviceClass",
    "DeviceTaintRule",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "Pod",
    "DaemonSet",
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "Job",
    "PodDisruptionBudget",
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Service",
    "Lease",
    "Event",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "Role",
    "RoleBinding",
    "ControllerRevision",
)
# Kinds that own pods: deleted before the pods, so that they make no new ones.
WORKLOAD_KINDS = ("DaemonSet", "Deployment", "ReplicaSet", "StatefulSet", "Job")
_ONCE_PER_SESSION = {"ServiceAccount": {"default"}, "ConfigMap": {"kube-root-ca.crt"}}


class RequestRecord:
    """One request from the audit log: verb, path (without the query), query, user, response
    code, and the HTTP method the verb stands for."""

    METHOD = {
        "get": "GET",
        "list": "GET",
        "watch": "GET",
        "create": "POST",
        "update": "PUT",
        "patch": "PATCH",
        "delete": "DELETE",
        "deletecollection": "DELETE",
    }

    def __init__(self, entry: dict):
        uri = entry.get("requestURI", "")
        self.path, dummy, self.query = uri.partition("?")
        self.verb = entry.get("verb", "")
        self.method = self.METHOD.get(self.verb, self.verb.upper())
        self.user = (entry.get("user") or {}).get("username", "")
        self.user_agent = entry.get("userAgent", "")
        self.code = (entry.get("responseStatus") or {}).get("code")
        self.resource = entry.get("objectRef") or {}

    def __repr__(self):
        return f"<{self.method} {self.path} {self.code}>"


class TestCluster(Client):
    """The Client of a started ControlPlane, with hooks, request records and reset."""

    __test__ = False  # not a pytest class

    def __init__(self, control_plane, *, kubeconfig: str | None = None):
        super().__init__(kubeconfig or control_plane.harness_kubeconfig)
        self.control_plane = control_plane
        self._hooks: list = []
        self._watches: dict = {}
        self._stopping = threading.Event()
        self._audit_offset = self._audit_size()
        self._baseline = self._snapshot()

    # ----- what clients asked ----------------------------------------------------------------

    def _audit_size(self) -> int:
        try:
            return os.path.getsize(self.control_plane.audit_log)
        except OSError:
            return 0

    @property
    def requests(self) -> list:
        """The requests of the clients under test (not the harness's own) since the last reset,
        from the API server's audit log (written a few milliseconds after the answer)."""
        out = []
        try:
            with open(self.control_plane.audit_log, "rb") as f:
                f.seek(self._audit_offset)
                for line in f:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if (
                        entry.get("stage") == "ResponseComplete"
                        and (entry.get("user") or {}).get("username") != HARNESS_USER
                    ):
                        out.append(RequestRecord(entry))
        except OSError:
            pass
        return out

    # ----- hooks -----------------------------------------------------------------------------

    def on(self, event: str, callback, kind: str | None = None):
        """Calls `callback(Event)` for `added`, `modified` or `deleted` objects of `kind`, from a
        watch (asynchronously: the change is already stored when the callback runs). Returns a
        function that removes the hook."""
        if event in EVICTION_EVENTS:
            kind = "Pod"
            self._ensure_audit_follower()
        elif event not in EVENTS or kind is None:
            raise ValueError(
                f"hooks take one of {EVENTS} and a kind, or one of "
                f"{tuple(EVICTION_EVENTS)}; not {event!r}, {kind!r}"
            )
        else:
            self._ensure_watch(kind)
        hook = (event, kind, callback)
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    def _ensure_watch(self, kind: str):
        if kind in self._watches:
            return
        res = self.resource(kind)
        started = threading.Event()
        thread = threading.Thread(
            target=self._watch, args=(kind, res, started), daemon=True, name=f"watch-{kind}"
        )
        self._watches[kind] = thread
        thread.start()
        started.wait(10)

    def _watch(self, kind, res, started):
        version = self._call("get", res.path(), limit=1)["metadata"]["resourceVersion"]
        started.set()
        while not self._stopping.is_set():
            try:
                stream = kube_watch.Watch().stream(
                    self.dyn.request,
                    "get",
                    res.path(),
                    watch=True,
                    resource_version=version,
                    timeout_seconds=30,
                    serialize=False,
                )
                for raw in stream:
                    if self._stopping.is_set():
                        return
                    obj = raw["raw_object"] if "raw_object" in raw else raw["object"]
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    self._fire(raw["type"].lower(), kind, obj)
            except Exception:  # pylint: disable=broad-except
                if self._stopping.is_set():
                    return
                time.sleep(0.2)
                version = self._call("get", res.path(), limit=1)["metadata"]["resourceVersion"]

    def _ensure_audit_follower(self):
        if "audit" in self._watches:
            return
        thread = threading.Thread(
            target=self._follow_audit,
            args=(self._audit_size(),),
            daemon=True,
            name="audit-follower",
        )
        self._watches["audit"] = thread
        thread.start()

    def _follow_audit(self, offset):
        codes = {code: event for event, code in EVICTION_EVENTS.items()}
        while not self._stopping.is_set():
            try:
                with open(self.control_plane.audit_log, "rb") as f:
                    f.seek(offset)
                    for line in f:
                        if not line.endswith(b"\n"):
                            break
                        offset += len(line)
                        record = RequestRecord(json.loads(line))
                        ref = record.resource
                        if (
                            ref.get("subresource") == "eviction"
                            and record.verb == "create"
                            and record.code in codes
                        ):
                            pod = self.find("Pod", ref.get("name"), ref.get("namespace")) or {
                                "metadata": {
                                    "name": ref.get("name"),
                                    "namespace": ref.get("namespace"),
                                }
                            }
                            self._fire(codes[record.code], "Pod", pod)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    def _fire(self, event_type, kind, obj):
        for event, hook_kind, callback in list(self._hooks):
            if event == event_type and hook_kind == kind:
                try:
                    callback(HookEvent(event_type, kind, obj))
                except Exception as exc:  # pylint: disable=broad-except
                    self.errors.append(exc)

    # ----- reset -----------------------------------------------------------------------------

    def _snapshot(self) -> dict:
        out = {}
        for kind in RESET_KINDS:
            try:
                out[kind] = {
                    (o["metadata"].get("namespace"), o["metadata"]["name"])
                    for o in self.list(kind)
                }
            except ApiError:
                out[kind] = set()
        out["Namespace"] = {(None, n["metadata"]["name"]) for n in self.list("Namespace")}
        return out

    def reset(self) -> None:
        """Deletes what was made since the cluster started (pods at once, without their grace
        period; the test's namespaces whole, emptied and finalized here), waits until it is
        gone, and forgets hooks, request records and errors."""
        self._hooks.clear()
        self.errors.clear()
        # Pods first, without their grace period: the owners' pods once the owners are gone (the
        # garbage collector and the namespace controller delete pods with their 30 s grace, and
        # kwok ends a Terminating pod at its deletionTimestamp).
        for kind in WORKLOAD_KINDS:
            for obj in self._new(kind):
                meta = obj["metadata"]
                self._quietly(
                    lambda k=kind, m=meta: self.delete(k, m["name"], m.get("namespace"))
                )
        self._force_pods()
        new_namespaces = [
            name
            for name in (n["metadata"]["name"] for n in self.list("Namespace"))
            if (None, name) not in self._baseline["Namespace"]
        ]
        # Deleted first, so that nothing can be made in them any more (NamespaceLifecycle
        # admission refuses creates in a Terminating namespace), then emptied here.
        for name in new_namespaces:
            self._quietly(lambda n=name: self.delete("Namespace", n))
        leftovers = []
        for kind in RESET_KINDS:
            try:
                items = self.list(kind)
            except ApiError:
                continue  # a kind whose CRD or API is gone
            for obj in items:
                meta = obj["metadata"]
                key = (meta.get("namespace"), meta["name"])
                if key in self._baseline.get(kind, ()) or meta.get("namespace") in new_namespaces:
                    continue
                if meta.get("namespace") in SYSTEM_NAMESPACES and meta[
                    "name"
                ] in _ONCE_PER_SESSION.get(kind, ()):
                    continue
                if meta.get("finalizers") and kind != "CustomResourceDefinition":
                    self._quietly(
                        lambda k=kind, m=meta: self.patch(
                            k, m["name"], {"metadata": {"finalizers": None}}, m.get("namespace")
                        )
                    )
                grace = 0 if kind == "Pod" else None
                self._quietly(
                    lambda k=kind, m=meta, g=grace: self.delete(
                        k, m["name"], m.get("namespace"), grace_period=g
                    )
                )
                leftovers.append((kind, meta.get("namespace"), meta["name"]))
        if new_namespaces:
            self._finish_namespaces(new_namespaces)
        self.wait_for(
            lambda: self._force_pods() is None
            and all(self.find(k, n, ns) is None for k, ns, n in leftovers if k != "Event")
            and not any(self.find("Namespace", n) for n in new_namespaces),
            "the objects of the last test to be deleted",
            timeout=120,
            interval=0.25,
        )
        self._audit_offset = self._audit_size()

    def _finish_namespaces(self, names) -> None:
        """Does at once what the namespace controller does to a deleted namespace: deletes
        everything in it, kind by kind, then takes the namespace's finalizer off through its
        finalize subresource. That controller first waits 5 s (namespaceDeletionGracePeriod,
        pkg/controller/namespace/namespace_controller.go), which was most of every reset."""
        resources = self.namespaced_resources()
        for dummy in range(50):
            left = 0
            for name in names:
                for res in resources:
                    left += self._empty(res, name)
            if not left:
                break
            time.sleep(0.1)
        else:
            return  # something keeps it: the namespace controller finishes, the wait below tells
        for name in names:
            ns = self.find("Namespace", name)
            if ns is not None and (ns.get("spec") or {}).get("finalizers"):
                ns["spec"]["finalizers"] = []
                path = f"/api/v1/namespaces/{name}/finalize"
                self._quietly(lambda p=path, o=ns: self._call("put", p, body=o))

    def _empty(self, res, namespace) -> int:
        """Deletes the objects of `res` in `namespace`, without finalizers or grace period;
        returns how many there were."""
        path = res.path(namespace=namespace)
        try:
            items = self._call("get", path).get("items") or []
        except ApiError:
            return 0  # a kind going away (its CRD deleted) or a namespace already gone
        for obj in items:
            meta = obj["metadata"]
            if meta.get("finalizers"):
                self._quietly(lambda m=meta: self._call(
                    "patch", f"{path}/{m['name']}", body={"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json"))
        if items:
            self._quietly(lambda: self._call("delete", path, grace_period_seconds=0))
        return len(items)

    def _new(self, kind):
        """The objects of `kind` made since the cluster started."""
        try:
            items = self.list(kind)
        except ApiError:
            return []
        return [
            o
            for o in items
            if (o["metadata"].get("namespace"), o["metadata"]["name"])
            not in self._baseline.get(kind, ())
        ]

    def _force_pods(self):
        """Deletes every pod made since the start at once (grace period 0), Terminating or not."""
        for pod in self._new("Pod"):
            meta = pod["metadata"]
            self._quietly(
                lambda m=meta: self.delete("Pod", m["name"], m.get("namespace"), grace_period=0)
            )

    def _quietly(self, call):
        try:
            call()
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise

    def service_account_kubeconfig(
        self, path, name: str, manifests: list, namespace: str = "gpuops-mig"
    ) -> str:
        """A kubeconfig for a new ServiceAccount bound to the ClusterRoles in `manifests` (files
        of rbac/) and nothing else: the identity a least-privilege test runs the collection as."""
        import yaml  # pylint: disable=import-outside-toplevel

        self.ensure_namespace(namespace)
        self.seed(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )
        for manifest in manifests:
            with open(manifest, encoding="utf-8") as f:
                for role in [d for d in yaml.safe_load_all(f) if d]:
                    self.seed(role)
                    self.seed(
                        {
                            "apiVersion": "rbac.authorization.k8s.io/v1",
                            "kind": "ClusterRoleBinding",
                            "metadata": {"name": f"{role['metadata']['name']}-{namespace}-{name}"},
                            "roleRef": {
                                "apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole",
                                "name": role["metadata"]["name"],
                            },
                            "subjects": [
                                {"kind": "ServiceAccount", "name": name, "namespace": namespace}
                            ],
                        }
                    )
        token = self._call(
            "post",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 7200},
            },
        )["status"]["token"]
        # The API server checks a token's ServiceAccount in its own cache first: while that still
        # holds the one of the same name a reset has just deleted (another UID), it answers 401.
        # Asked as the harness (a TokenReview), so that the test's requests do not show it.
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token}}
        self.wait_for(
            lambda: self._call("post", "/apis/authentication.k8s.io/v1/tokenreviews",
                               body=review)["status"].get("authenticated"),
            f"the API server to accept the token of {namespace}/{name}")
        return self.control_plane.token_kubeconfig(str(path), token, name)

    def close(self):
        self._stopping.set()


def daemonsets_rolled_out(cluster, namespace: str, ready: bool = True) -> bool:
    """The namespace has DaemonSets, and each has a current pod on every node it selects (and,
    with `ready`, each of those pods ready)."""
    daemonsets = cluster.list("DaemonSet", namespace)
    for ds in daemonsets:
        status = ds.get("status") or {}
        want = status.get("desiredNumberScheduled") or 0
        counts = ("updatedNumberScheduled", "numberReady" if ready else "currentNumberScheduled")
        if status.get("observedGeneration", 0) < ds["metadata"]["generation"] or any(
                (status.get(count) or 0) != want for count in counts):
            return False
    return bool(daemonsets)


class HookEvent:
    """What a hook receives: the event type, the kind and the object as the watch sent it."""

    def __init__(self, type_, kind, obj):
        self.type, self.kind, self.obj = type_, kind, obj


@contextlib.contextmanager
def running(workdir):
    """A control plane started under `workdir`, its TestCluster and the NVIDIA stand-ins on it
    (`cluster.stand_ins`); all stopped, newest first, on the way out (also on an error)."""
    # pylint: disable=import-outside-toplevel
    from .launcher import ControlPlane
    from .standins import StandIns

    plane = ControlPlane(str(workdir)).start()
    cluster = stand_ins = None
    try:
        cluster = TestCluster(plane)
        stand_ins = StandIns(cluster).start()
        cluster.stand_ins = stand_ins
        yield cluster
    finally:
        if stand_ins is not None:
            stand_ins.stop()
        if cluster is not None:
            cluster.close()
        plane.stop()
