# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Kubernetes objects as the rollout reads them: what gpuops.mig.mig_cluster_info reads, which DaemonSet
is NVIDIA's DRA kubelet plugin, and objects trimmed to what the rollout decides on.

Shared by gpuops.mig.mig_cluster_info (module and action plugin, which return only what is needed:
every host's preview gets it, so its size is paid once per node) and plugin_utils/_node_decision.py.
Private to the collection; no Ansible imports (the reads go through the kubernetes.core service given).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _dra_claims as dra_claims
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _rbac as rbac

# The node label protocol shared with the GPU Operator's mig-manager (NVIDIA/mig-parted), and the marks this
# collection leaves on Kubernetes objects: one home for each name (roles/mig_node/vars/main.yml repeats them for
# the role's tasks; tests/unit/plugins/plugin_utils/test__role_contract.py holds the two together).
LABEL_CONFIG = "nvidia.com/mig.config"
LABEL_STATE = "nvidia.com/mig.config.state"
LABEL_DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED_VALUE = "paused-for-mig-change"
ANNOTATION_CORDONED = "gpuops.mig/cordoned"
ANNOTATION_LAST_ERROR = "gpuops.mig/last-error"
ANNOTATION_RUN_ID = "gpuops.mig/run-id"
# The hand-off of a node to a dynamic MIG partitioner (plugin_utils/_handoff.py): later static runs leave it alone.
ANNOTATION_HANDED_OFF = "gpuops.mig/handed-off"
LABEL_EVICT = "gpuops.mig/evict"
LABEL_SMOKE_TEST = "gpuops.mig/smoke-test"

# NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): the name its chart gives its pods.
DRA_APP = "dra-driver-nvidia-gpu"
# HAMi's device plugin: the label its chart gives the pods (Project-HAMi/HAMi charts/hami, daemonsetnvidia.yaml).
HAMI_POD_LABEL = ("app.kubernetes.io/component", "hami-device-plugin")

DEFAULT_OPERATOR_NAMESPACE = "gpu-operator"

# The ConfigMap of mig-parted configs the GPU Operator's Helm chart creates, used when its ClusterPolicy names none.
DEFAULT_OPERATOR_CONFIG = "default-mig-parted-config"

# gpuops.mig.mig_cluster_info's options besides kubernetes.core's connection options (AUTH_ARG_SPEC).
CLUSTER_READ_OPTIONS = dict(
    operator=dict(type="bool", default=True),
    nodes=dict(type="bool", default=True),
    node_status=dict(type="bool", default=False),
    configmaps=dict(type="list", elements="raw", default=[]),
    operator_config_nodes=dict(type="list", elements="str", default=[]),
    leases=dict(type="list", elements="str", default=[]),
    lease_namespace=dict(type="str", default="default"),
    dra_nodes=dict(type="list", elements="str", default=[]),
    check_access=dict(type="bool", default=False),
)


def cluster_read_spec(auth_spec: Mapping[str, Any]) -> dict[str, Any]:
    """gpuops.mig.mig_cluster_info's argument spec, given kubernetes.core's AUTH_ARG_SPEC (module and action
    plugin alike)."""
    spec = copy.deepcopy(auth_spec)
    spec.update(copy.deepcopy(CLUSTER_READ_OPTIONS))
    return spec


def is_dra_kubelet_plugin(daemonset: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet runs NVIDIA's DRA kubelet plugin (by its pods' app label, else by its name)."""
    template = ((daemonset.get("spec") or {}).get("template") or {})
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    name = (daemonset.get("metadata") or {}).get("name") or ""
    return (pod_labels.get("app.kubernetes.io/name") == DRA_APP or name.endswith("dra-driver-kubelet-plugin")
            or (DRA_APP in name and name.endswith("kubelet-plugin")))


def is_hami_device_plugin(daemonset: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet runs HAMi's device plugin (by its pods' component label)."""
    template = ((daemonset.get("spec") or {}).get("template") or {})
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    return pod_labels.get(HAMI_POD_LABEL[0]) == HAMI_POD_LABEL[1]


def trimmed(obj: Mapping[str, Any], keep_status: bool = True) -> dict[str, Any]:
    """The object without metadata.managedFields (the API server's field bookkeeping, often most of an
    object) and, unless keep_status, without its status (a Node's image list and conditions)."""
    obj = dict(obj)
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("managedFields", None)
    obj["metadata"] = metadata
    if not keep_status:
        obj.pop("status", None)
    return obj


def operator_namespace(cluster_policies: Iterable[Mapping[str, Any]]) -> str:
    for policy in cluster_policies:
        namespace = (policy.get("status") or {}).get("namespace")
        if namespace:
            return namespace
    return DEFAULT_OPERATOR_NAMESPACE


def operator_configmaps(cluster_policies: Iterable[Mapping[str, Any]], node_names: Sequence[str]) -> list[str]:
    """The ConfigMaps mig-manager takes its config from, by name: the one each ClusterPolicy names, else the one
    it generates for each node of node_names (<node>-mig-config) and the Helm chart's default; and the device
    plugin's per-node configs (devicePlugin.config.name) where one is named."""
    names = []
    for policy in cluster_policies:
        spec = policy.get("spec") or {}
        named = ((spec.get("migManager") or {}).get("config") or {}).get("name")
        names.extend([named] if named else ["%s-mig-config" % node for node in node_names] + [DEFAULT_OPERATOR_CONFIG])
        plugin_configs = ((spec.get("devicePlugin") or {}).get("config") or {}).get("name")
        if plugin_configs:
            names.append(plugin_configs)
    return names


_NAMESPACE = checks.pattern(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")     # a DNS label
_CONFIG_MAP = checks.pattern(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")      # a DNS subdomain (253 at most)


def configmap_ref(value: Any) -> dict[str, str] | None:
    """{name, namespace} of a ConfigMap a role variable names, written `[namespace/]name` (or given as
    {name, namespace}); an empty namespace is the GPU Operator's. None for anything else."""
    if isinstance(value, Mapping):      # the same rules as the string it stands for
        namespace, name = value.get("namespace") or "", value.get("name")
        if not isinstance(name, str):
            return None
        value = "%s/%s" % (namespace, name) if namespace else name
    parts = value.split("/") if isinstance(value, str) else []
    rules = (_NAMESPACE, _CONFIG_MAP) if len(parts) == 2 else (_CONFIG_MAP,)
    if not 1 <= len(parts) <= 2 or not all(
            len(part) <= 253 and checks.whole(rule, part) for rule, part in zip(rules, parts)):
        return None
    return {"namespace": parts[0] if len(parts) == 2 else "", "name": parts[-1]}


def configmaps_to_read(requested: Iterable[Mapping[str, str]], cluster_policies: Iterable[Mapping[str, Any]],
                       operator_ns: str, node_names: Sequence[str] = ()) -> dict[str, list[str]]:
    """{namespace: [names]}: the ConfigMaps asked for (configmap_ref's forms; one of no such form is
    not read: the preview refuses it, naming the variable) and, with a ClusterPolicy, the operator's
    config ConfigMaps; each name once, in a stable order."""
    wanted = {}
    for item in filter(None, map(configmap_ref, requested)):
        wanted.setdefault(item["namespace"] or operator_ns, set()).add(item["name"])
    for name in operator_configmaps(cluster_policies, node_names):
        wanted.setdefault(operator_ns, set()).add(name)
    return dict((namespace, sorted(names)) for namespace, names in sorted(wanted.items()))


def read_cluster(service: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """What gpuops.mig.mig_cluster_info returns, read through a kubernetes.core K8sService."""
    def find(kind: str, api_version: str, namespace: str | None = None, keep_status: bool = True,
             name: str | None = None, field_selectors: list[str] | None = None) -> list[dict[str, Any]]:
        selectors = {"field_selectors": field_selectors} if field_selectors else {}
        found = service.find(kind, api_version, name=name, namespace=namespace, **selectors)["resources"]
        return [trimmed(obj, keep_status) for obj in found]

    # What was not read is left out rather than returned empty: no ClusterPolicy read is not "no GPU Operator"
    # (site.yml then reads it itself before deciding whether to deploy a device plugin).
    result = dict(configmaps={})
    if params["operator"]:
        result["cluster_policies"] = find("ClusterPolicy", "nvidia.com/v1")
        # GPU Operator v26.7's DRA stack (tech preview): no mig-manager; its MIG devices must be set up beforehand.
        result["gpu_clusters"] = find("GPUCluster", "nvidia.com/v1alpha1")
        # NVIDIA's DRA kubelet plugin, and HAMi's device plugin (a partitioner a node may be handed to).
        result["daemonsets"] = [ds for ds in find("DaemonSet", "apps/v1", keep_status=False)
                                if is_dra_kubelet_plugin(ds) or is_hami_device_plugin(ds)]
    if params["nodes"]:
        result["nodes"] = find("Node", "v1", keep_status=params["node_status"])
    policies = result.get("cluster_policies") or []
    result["operator_namespace"] = operator_namespace(policies)
    # ConfigMaps by name only, never a namespace's list: other ConfigMaps there (kube-system/aws-auth, say) may
    # hold credentials, and what this returns ends up in job logs.
    wanted = configmaps_to_read(params["configmaps"], policies, result["operator_namespace"],
                                params["operator_config_nodes"])
    for namespace, names in wanted.items():
        result["configmaps"][namespace] = [cm for name in names for cm in find("ConfigMap", "v1", namespace, name=name)]
    if params.get("dra_nodes"):
        # With the DaemonSets read and none of them NVIDIA's DRA kubelet plugin, a cluster whose API refuses the
        # slices (RBAC without resource.k8s.io) is one without the driver.
        no_driver = "daemonsets" in result and not result["daemonsets"]
        result["dra_allocations"] = dra_allocations(find, params["dra_nodes"], no_driver)
    if params.get("check_access"):
        reviewer = service.client.resource("SelfSubjectAccessReview", "authorization.k8s.io/v1")
        result["missing_access"] = rbac.missing(
            lambda body: service.client.create(reviewer, body).to_dict(),
            params.get("lease_namespace") or "default")
        result["access_msg"] = rbac.message(result["missing_access"]) \
            if result["missing_access"] else ""
    # The nodes' leases by name (gpuops.mig.mig_node_lease): one a run that died left behind is released.
    result["leases"] = dict((lease["metadata"]["name"], lease) for name in params.get("leases") or ()
                            for lease in find("Lease", "coordination.k8s.io/v1", params.get("lease_namespace") or "default",
                                              name=name))
    return result


def dra_allocations(find: Any, node_names: Sequence[str], no_driver: bool = False) -> dict[str, Any]:
    """{node: _dra_claims.node_allocations} for each of node_names NVIDIA's DRA driver serves: which pod holds
    which device there, from the ResourceClaims, returned as that map only (the claims themselves stay here).
    When the API does not give them (RBAC, a timeout), each node says why, and its rollout drains the whole
    node, unless no_driver (no DaemonSet runs the driver's kubelet plugin). A cluster that serves no
    resource.k8s.io/v1 reads as one without the driver."""
    try:
        slices = find("ResourceSlice", dra_claims.API_VERSION, field_selectors=["spec.driver=" + dra_claims.DRIVER])
        claims = find("ResourceClaim", dra_claims.API_VERSION)
    except Exception as e:  # pylint: disable=broad-except  # kubernetes.core's CoreException, not importable here
        return {} if no_driver else dict((node, dra_claims.unreadable(node, e)) for node in node_names)
    found = dict((node, dra_claims.node_allocations(node, slices, claims)) for node in node_names)
    return dict((node, answer) for node, answer in found.items() if answer is not None)
