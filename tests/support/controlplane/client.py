"""A kind-based client of the test cluster for tests and the NVIDIA stand-ins, over HTTP with the
`kubernetes` Python client (its DynamicClient, which resolves kinds through discovery).

    api = Client(kubeconfig)
    api.seed(seed.node("gpu-1"), seed.pod("web-1", node="gpu-1"))   # waits until they are real
    api.patch("Node", "gpu-1", {"spec": {"unschedulable": True}})
    api.wait_for(lambda: api.find("Pod", "web-1") is None, "web-1 is gone")

Errors raise ApiError with the server's code, reason and message.
"""

from __future__ import annotations

import threading
import time

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import api_client
from kubernetes.dynamic import client as dynamic_client
from kubernetes.dynamic import exceptions as dyn_errors

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
# Kinds served in several groups: the one a bare kind means here.
PREFERRED = {"Event": "v1"}
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class ApiError(Exception):
    """An answer of the API server that is not a success (code, reason, message as sent)."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _error(exc: dyn_errors.DynamicApiError) -> ApiError:
    import json  # pylint: disable=import-outside-toplevel

    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        body = {}
    return ApiError(
        exc.status, body.get("reason", ""), body.get("message", str(exc.body)), body.get("details")
    )


class Client:
    """Kind-based calls against one cluster; safe to share between threads."""

    def __init__(self, kubeconfig: str, *, timeout: float = 30.0):
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        configuration = api_client.Configuration()
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        configuration.retries = urllib3.Retry(
            total=3, connect=3, read=0, status=0, backoff_factor=0.2
        )
        self.api = api_client.ApiClient(configuration)
        self.dyn = _Requests(self.api)
        self._discovery_lock = threading.Lock()
        self._kinds: dict | None = None
        self.lock = threading.RLock()  # the stand-ins' critical sections (see standins.py)
        self.errors: list = []

    # ----- resolution ------------------------------------------------------------------------

    def resource(self, kind: str, api_version: str | None = None) -> "Resource":
        """The resource that serves `kind` (in `api_version`, else the preferred version of the
        first group that has it, core first), from discovery; looks again once for a kind that a
        new CRD may have added."""
        api_version = api_version or PREFERRED.get(kind)
        for attempt in (0, 1):
            with self._discovery_lock:
                if attempt or self._kinds is None:
                    self._kinds = self._discover()
                found = self._kinds.get((kind, api_version)) or (
                    None if api_version else self._kinds.get((kind, None))
                )
            if found is not None:
                return found
        raise ApiError(
            404, "NotFound", f'no matches for kind "{kind}" in ' f'{api_version or "any version"}'
        )

    def _discover(self) -> dict:
        out: dict = {}
        versions = [("", "v1", "/api/v1")]
        for group in self._call("get", "/apis").get("groups") or []:
            preferred = (group.get("preferredVersion") or {}).get("version")
            ordered = sorted(group.get("versions") or [], key=lambda v: v["version"] != preferred)
            versions += [
                (group["name"], v["version"], f"/apis/{v['groupVersion']}") for v in ordered
            ]
        for group, version, path in versions:
            try:
                listed = self._call("get", path).get("resources") or []
            except ApiError:
                continue  # a group version going away (a CRD deleted) while we look
            subresources: dict = {}
            for item in listed:
                if "/" in item["name"]:
                    plural, sub = item["name"].split("/", 1)
                    subresources.setdefault(plural, set()).add(sub)
            for item in listed:
                if "/" in item["name"]:
                    continue
                res = Resource(
                    item["kind"],
                    group,
                    version,
                    item["name"],
                    item["namespaced"],
                    frozenset(subresources.get(item["name"], ())),
                    frozenset(item.get("verbs") or ()),
                )
                out.setdefault((item["kind"], res.group_version), res)
                out.setdefault((item["kind"], None), res)  # the first group wins a bare kind
        return out

    @staticmethod
    def _ns(res, namespace):
        return (namespace or "default") if res.namespaced else None

    def _call(self, method, path, body=None, **params):
        params.setdefault("_request_timeout", self.timeout)
        try:
            out = self.dyn.request(method, path, body=body, **params)
        except dyn_errors.DynamicApiError as exc:
            raise _error(exc) from None
        return out.to_dict() if hasattr(out, "to_dict") else out

    def path(self, kind, name=None, namespace=None, subresource=None, api_version=None):
        res = self.resource(kind, api_version)
        path = res.path(name=name, namespace=self._ns(res, namespace))
        return f"{path}/{subresource}" if subresource else path

    # ----- verbs -----------------------------------------------------------------------------

    def create(self, obj: dict) -> dict:
        meta = obj.get("metadata") or {}
        return self._call(
            "post",
            self.path(
                obj["kind"], namespace=meta.get("namespace"), api_version=obj.get("apiVersion")
            ),
            body=obj,
        )

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict:
        return self._call("get", self.path(kind, name, namespace))

    def find(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """Like get, but None when the object does not exist."""
        try:
            return self.get(kind, name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list:
        """Objects of a kind; namespace None lists every namespace."""
        res = self.resource(kind)
        path = res.path(namespace=namespace) if res.namespaced and namespace else res.path()
        params = {}
        if label_selector:
            params["label_selector"] = label_selector
        if field_selector:
            params["field_selector"] = field_selector
        items = self._call("get", path, **params).get("items") or []
        for item in items:  # a list leaves out each item's kind and apiVersion
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", res.group_version)
        return items

    def patch(
        self,
        kind: str,
        name: str,
        body,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict:
        return self._call(
            "patch",
            self.path(kind, name, namespace, subresource),
            body=body,
            content_type=PATCH_TYPES[patch_type],
        )

    def replace(self, obj: dict) -> dict:
        meta = obj["metadata"]
        return self._call(
            "put",
            self.path(
                obj["kind"], meta["name"], meta.get("namespace"), api_version=obj.get("apiVersion")
            ),
            body=obj,
        )

    def set_status(self, kind: str, name: str, status: dict, namespace: str | None = None,
                   current: dict | None = None) -> dict:
        """Replace an object's status through /status, as a controller does; no write when it is
        already that (compared with `current` where the caller has read it, else read here)."""
        current = current if current is not None else self.get(kind, name, namespace)
        if current.get("status") == status:
            return current
        return self.patch(
            kind,
            name,
            [{"op": "add", "path": "/status", "value": status}],
            namespace,
            "json",
            subresource="status",
        )

    def delete(
        self, kind: str, name: str, namespace: str | None = None, grace_period: int | None = None
    ) -> dict:
        params = {} if grace_period is None else {"grace_period_seconds": grace_period}
        return self._call("delete", self.path(kind, name, namespace), **params)

    def evict(self, name: str, namespace: str = "default") -> dict:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        return self._call("post", self.path("Pod", name, namespace, "eviction"), body=body)

    # ----- test helpers ----------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        """Creates a namespace if missing and waits for its default ServiceAccount (the
        ServiceAccount admission plugin refuses pods until kube-controller-manager made it)."""
        if self.find("Namespace", namespace) is None:
            try:
                self.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                )
            except ApiError as exc:
                if exc.code != 409:
                    raise
        self.wait_for(
            lambda: self.find("ServiceAccount", "default", namespace) is not None,
            f"the default ServiceAccount of namespace {namespace}",
        )

    def seed(self, *objs: dict, wait: bool = True) -> list:
        """Creates objects (or replaces existing ones), creating missing namespaces first. What a
        create drops is put right as a real cluster would have it:

        - a status in a manifest is written through /status afterwards; a Node's conditions are
          left to kwok (Ready, heartbeats), and the node is waited for until it is schedulable;
        - a pod owned by a ReplicaSet that tests.support.kubeapi.seed only named (uid
          `seed-replicaset-NAME`) gets a real ReplicaSet, scaled to the pods that name it, so
          the garbage collector keeps them and an evicted pod is replaced, as in a cluster;
        - a scripted PodDisruptionBudget (status.disruptionsAllowed, neither minAvailable nor
          maxUnavailable) becomes `maxUnavailable: N`, which the disruption controller turns
          into the same budget while the owners are healthy.

        With `wait`, a pod bound to a node is waited for until kwok runs it."""
        objs = [_scripted_budget(o) for o in objs]
        owners = _seeded_owners(objs)
        out = []
        for obj in objs:
            ref = _seeded_owner_ref(obj)
            if ref is not None:  # made an orphan now; its ReplicaSet adopts it below
                obj = _labelled_for(obj, ref["name"])
            out.append(self._seed_one(obj))
        for (namespace, name), pods in owners.items():
            self._seed_one(_replica_set(namespace, name, pods))
        if owners and wait:
            for made in out:
                if made.get("kind") == "Pod" and SEEDED_OWNER in made["metadata"].get(
                    "labels", {}
                ):
                    meta = made["metadata"]
                    self.wait_for(
                        lambda m=meta: self.get("Pod", m["name"], m["namespace"])["metadata"].get(
                            "ownerReferences"
                        ),
                        f"pod {meta['name']} adopted",
                    )
        if wait:
            for made in out:
                if made.get("kind") == "Node":
                    self.wait_node_ready(made["metadata"]["name"])
                if (
                    made.get("kind") == "Pod"
                    and (made.get("spec") or {}).get("nodeName")
                    and not (made.get("status") or {}).get("phase")
                    in ("Running", "Succeeded", "Failed")
                ):
                    meta = made["metadata"]
                    self.wait_for(
                        lambda m=meta: (
                            self.get("Pod", m["name"], m["namespace"]).get("status") or {}
                        ).get("phase")
                        == "Running",
                        f"pod {meta['namespace']}/{meta['name']} Running",
                    )
        return out

    def _seed_one(self, obj: dict) -> dict:
        meta = obj.setdefault("metadata", {})
        res = self.resource(obj["kind"], obj.get("apiVersion"))
        if res.namespaced:
            meta.setdefault("namespace", "default")
            self.ensure_namespace(meta["namespace"])
        status = obj.get("status")
        if obj["kind"] == "Node" and status:
            # kwok reports the conditions (Ready, heartbeats), as a kubelet would.
            obj = dict(obj, status={k: v for k, v in status.items() if k != "conditions"})
            status = None
        existing = (
            self.find(obj["kind"], meta["name"], meta.get("namespace"))
            if meta.get("name")
            else None
        )
        if existing is not None:
            made = self.replace(
                dict(
                    obj,
                    metadata=dict(meta, resourceVersion=existing["metadata"]["resourceVersion"]),
                )
            )
        else:
            made = self.create(obj)
        if status and "status" in _subresources(res):
            made = self.set_status(
                obj["kind"], made["metadata"]["name"], status, made["metadata"].get("namespace")
            )
        if obj["kind"] == "CustomResourceDefinition":
            self.wait_crd_established(made["metadata"]["name"])
        return made

    def wait_crd_established(self, name: str) -> None:
        """A new CRD serves its kind only once Established (asynchronous on a real server);
        waits for that, then forgets discovery so the kind resolves."""
        self.wait_for(
            lambda: any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (self.get("CustomResourceDefinition", name).get("status") or {}).get(
                    "conditions"
                )
                or []
            ),
            f"CRD {name} Established",
        )
        self.forget_kinds()

    def namespaced_resources(self) -> list:
        """Every namespaced resource served now that can be listed and deleted, once per group
        (its preferred version): what the namespace controller walks to empty a namespace."""
        self.forget_kinds()
        self.resource("Namespace")
        with self._discovery_lock:
            kinds = self._kinds
        out: dict = {}
        for (dummy, api_version), res in kinds.items():
            if api_version and res.namespaced and {"list", "deletecollection"} <= res.verbs:
                out.setdefault((res.group, res.plural), res)
        return list(out.values())

    def forget_kinds(self) -> None:
        """Discovery is read again at the next call: a CRD was added or deleted."""
        with self._discovery_lock:
            self._kinds = None

    def wait_node_ready(self, name: str, timeout: float = 30.0) -> dict:
        """Waits until kwok reports the node Ready and the node lifecycle controller lifted the
        not-ready taint the API server put on it (TaintNodesByCondition)."""

        def ready():
            node = self.get("Node", name)
            conditions = (node.get("status") or {}).get("conditions") or []
            taints = (node.get("spec") or {}).get("taints") or []
            return (
                node
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
                and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)
                else None
            )

        return self.wait_for(ready, f"node {name} Ready", timeout)

    def wait_for(self, predicate, what: str, timeout: float = 30.0, interval: float = 0.1):
        """Polls `predicate` until it is true; fails naming `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)


SEEDED_OWNER = "gpuops-test/owner"


def _seeded_owner_ref(obj: dict) -> dict | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "ReplicaSet" and str(ref.get("uid", "")).startswith("seed-"):
            return ref
    return None


def _seeded_owners(objs) -> dict:
    out: dict = {}
    for obj in objs:
        ref = _seeded_owner_ref(obj)
        if obj.get("kind") == "Pod" and ref is not None:
            key = ((obj.get("metadata") or {}).get("namespace") or "default", ref["name"])
            out.setdefault(key, []).append(obj)
    return out


def _replica_set(namespace: str, name: str, pods: list) -> dict:
    """A ReplicaSet of as many replicas as `pods`, made after them: it adopts them (they match
    its selector and have no controller) instead of making its own."""
    pod = pods[0]
    labels = dict((pod["metadata"].get("labels") or {}), **{SEEDED_OWNER: name})
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": len(pods),
            "selector": {"matchLabels": {SEEDED_OWNER: name}},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def _labelled_for(pod: dict, owner: str) -> dict:
    meta = dict(pod["metadata"])
    meta["labels"] = dict(meta.get("labels") or {}, **{SEEDED_OWNER: owner})
    meta.pop("ownerReferences", None)
    return dict(pod, metadata=meta)


def _scripted_budget(obj: dict) -> dict:
    spec = obj.get("spec") or {}
    if (
        obj.get("kind") != "PodDisruptionBudget"
        or "minAvailable" in spec
        or "maxUnavailable" in spec
        or "disruptionsAllowed" not in (obj.get("status") or {})
    ):
        return obj
    allowed = obj["status"]["disruptionsAllowed"]
    return {
        k: v
        for k, v in dict(obj, spec=dict(spec, maxUnavailable=allowed)).items()
        if k != "status"
    }


class Resource:
    """One API resource: where a kind is served and how."""

    def __init__(self, kind, group, version, plural, namespaced, subresources, verbs=frozenset()):
        self.kind, self.group, self.version = kind, group, version
        self.plural, self.namespaced, self.subresources = plural, namespaced, subresources
        self.verbs = verbs

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, name: str | None = None, namespace: str | None = None) -> str:
        base = f"/apis/{self.group_version}" if self.group else "/api/v1"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


class _Requests(dynamic_client.DynamicClient):
    """The DynamicClient's request() and watch plumbing, without its discovery (which is not
    safe to share between threads): Client resolves kinds itself."""

    def __init__(self, client):  # pylint: disable=super-init-not-called
        self.client = client
        self.configuration = client.configuration


def _subresources(res) -> list:
    return list(res.subresources)
