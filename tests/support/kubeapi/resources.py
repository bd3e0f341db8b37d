"""The kinds the emulator serves, and the discovery documents built from them.

One version per group keeps the store free of conversions. The list covers
what kubernetes.core, helm 3.17 and kubectl ask for on the paths our roles
use; add a row here to serve another kind.
"""

from __future__ import annotations

from dataclasses import dataclass

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple = ()
    has_status: bool = False  # has a /status subresource
    crd: str = ""  # a custom resource: served (discovery and REST) only while this CRD object exists

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


def _r(group_version, plural, kind, namespaced, short="", status=False, crd=""):
    group, _slash, version = group_version.rpartition("/")
    return Resource(group, version, plural, kind, namespaced, tuple(short.split()), status, crd)


CATALOG = [
    _r("v1", "namespaces", "Namespace", False, "ns", True),
    _r("v1", "nodes", "Node", False, "no", True),
    _r("v1", "pods", "Pod", True, "po", True),
    _r("v1", "services", "Service", True, "svc", True),
    _r("v1", "endpoints", "Endpoints", True, "ep"),
    _r("v1", "configmaps", "ConfigMap", True, "cm"),
    _r("v1", "secrets", "Secret", True),
    _r("v1", "serviceaccounts", "ServiceAccount", True, "sa"),
    _r("v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, "pvc", True),
    _r("v1", "persistentvolumes", "PersistentVolume", False, "pv", True),
    _r("v1", "events", "Event", True, "ev"),
    _r("v1", "limitranges", "LimitRange", True, "limits"),
    _r("v1", "resourcequotas", "ResourceQuota", True, "quota", True),
    _r("v1", "replicationcontrollers", "ReplicationController", True, "rc", True),
    _r("apps/v1", "deployments", "Deployment", True, "deploy", True),
    _r("apps/v1", "daemonsets", "DaemonSet", True, "ds", True),
    _r("apps/v1", "statefulsets", "StatefulSet", True, "sts", True),
    _r("apps/v1", "replicasets", "ReplicaSet", True, "rs", True),
    _r("apps/v1", "controllerrevisions", "ControllerRevision", True),
    _r("batch/v1", "jobs", "Job", True, "", True),
    _r("batch/v1", "cronjobs", "CronJob", True, "cj", True),
    _r("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, "pdb", True),
    _r("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, "hpa", True),
    # Answered, never stored: the emulator has no RBAC, so every review is allowed (cluster.py).
    _r("authorization.k8s.io/v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False),
    _r("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    _r("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    _r("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    _r("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _r("coordination.k8s.io/v1", "leases", "Lease", True),
    _r("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False, "crd crds", True),
    _r("storage.k8s.io/v1", "storageclasses", "StorageClass", False, "sc"),
    _r("storage.k8s.io/v1", "csidrivers", "CSIDriver", False),
    _r("storage.k8s.io/v1", "csinodes", "CSINode", False),
    _r("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, "netpol"),
    _r("networking.k8s.io/v1", "ingresses", "Ingress", True, "ing", True),
    _r("networking.k8s.io/v1", "ingressclasses", "IngressClass", False),
    _r("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True),
    _r("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, "pc"),
    _r("node.k8s.io/v1", "runtimeclasses", "RuntimeClass", False),
    _r("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    _r("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False),
    # Dynamic Resource Allocation (GA as resource.k8s.io/v1 in Kubernetes 1.34).
    _r("resource.k8s.io/v1", "resourceslices", "ResourceSlice", False),
    _r("resource.k8s.io/v1", "deviceclasses", "DeviceClass", False),
    _r("resource.k8s.io/v1", "resourceclaims", "ResourceClaim", True, "", True),
    _r("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
    # Custom resources: served only while their CRD exists (seed.gpu_operator creates it).
    _r("nvidia.com/v1", "clusterpolicies", "ClusterPolicy", False, "", True, crd="clusterpolicies.nvidia.com"),
    # GPU Operator v26.7's DRA stack (tech preview): another version of the same group.
    _r("nvidia.com/v1alpha1", "gpuclusters", "GPUCluster", False, "", True, crd="gpuclusters.nvidia.com"),
    # Kueue's queueing unit (kueue.py): v1beta2 is the version its CRD stores.
    _r("kueue.x-k8s.io/v1beta2", "workloads", "Workload", True, "wl", True, crd="workloads.kueue.x-k8s.io"),
]

# Kinds whose metadata.generation counts spec changes (what their controllers compare
# status.observedGeneration against).
GENERATION_KINDS = {
    "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob",
    "PodDisruptionBudget", "CustomResourceDefinition", "ClusterPolicy", "DeviceClass",
}

# Kinds whose REST strategy answers AllowUnconditionalUpdate() false: a PUT must carry the resourceVersion it
# read (pkg/registry/coordination/lease/strategy.go for Lease). Only the kinds the roles write are listed.
UPDATE_NEEDS_RESOURCE_VERSION = {"Lease"}

# Kinds that `kubectl get all` lists.
ALL_CATEGORY = {"Pod", "Service", "ReplicationController", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet",
                "Job", "CronJob", "HorizontalPodAutoscaler"}

_BY_PATH = {(r.group, r.version, r.plural): r for r in CATALOG}
_BY_PLURAL = {(r.group, r.plural): r for r in CATALOG}
_BY_KIND = {}
for _res in CATALOG:
    _BY_KIND.setdefault(_res.kind, _res)


def by_path(group: str, version: str, plural: str):
    return _BY_PATH.get((group, version, plural))


def by_plural(group: str, plural: str) -> Resource:
    return _BY_PLURAL[(group, plural)]


def by_kind(kind: str, api_version: str | None = None) -> Resource:
    res = _BY_KIND.get(kind)
    if res is None or (api_version and res.api_version != api_version):
        raise KeyError(f"the emulator does not serve {api_version or ''} {kind}".strip())
    return res


def served(res: Resource, crds=None) -> bool:
    """Whether `res` is served; crds: names of the CRDs that exist (None: serve every kind)."""
    return not res.crd or crds is None or res.crd in crds


def groups(crds=None) -> dict:
    """group name -> its served versions, the preferred (first in the catalog) first; the core group is ''."""
    out = {}
    for res in CATALOG:
        if served(res, crds) and res.version not in out.setdefault(res.group, []):
            out[res.group].append(res.version)
    return out


def api_group(name: str, crds=None) -> dict:
    versions = [{"groupVersion": f"{name}/{version}", "version": version} for version in groups(crds)[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def api_group_list(crds=None) -> dict:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [api_group(name, crds) for name in groups(crds) if name],
    }


def api_resource_list(group: str, version: str, crds=None) -> dict:
    entries = []
    for res in CATALOG:
        if res.group != group or res.version != version or not served(res, crds):
            continue
        entry = {
            "name": res.plural,
            "singularName": res.kind.lower(),
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": VERBS,
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        if res.kind in ALL_CATEGORY:
            entry["categories"] = ["all"]
        entries.append(entry)
        if res.has_status:
            entries.append({"name": f"{res.plural}/status", "singularName": "", "namespaced": res.namespaced,
                            "kind": res.kind, "verbs": ["get", "patch", "update"]})
        if res.kind == "Pod":
            # Without this entry kubectl drain falls back to DELETE, which skips PodDisruptionBudgets.
            entries.append({"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                            "version": "v1", "kind": "Eviction", "verbs": ["create"]})
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": res_gv(group, version),
            "resources": entries}


def res_gv(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version
