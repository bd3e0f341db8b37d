"""A simulated NVIDIA GPU Operator: node labelling and operand DaemonSets driven by a ClusterPolicy.

Active while a ClusterPolicy (nvidia.com/v1, seed.gpu_operator) exists; with several, the oldest
(creationTimestamp, then name) counts, as the real operator ignores the others (NVIDIA/gpu-operator
controllers/active_config.go getSingletonClusterPolicy). Each pass of the cluster's reconcile loop
(shared with the other controllers) does what the operator's controllers do
(reference/gpu-operator.md sections 2 and 3; NVIDIA/gpu-operator controllers/state_manager.go,
nodelabeling_controller.go, object_controls.go):

- Nodes with `nvidia.com/gpu.present=true` get the deploy labels STATE_LABELS, and MIG-capable
  ones `nvidia.com/gpu.deploy.mig-manager`, set to "true" only where the label is absent or empty:
  any other value (`false`, `paused-for-mig-change`) is left alone. `nvidia.com/gpu.deploy.operands=false`,
  or a node whose gpu.present is not "true", loses every deploy label. This runs on every pass.
- With migManager enabled (nil counts as enabled) and `migManager.config.default=all-disabled`, a
  MIG-capable node whose `nvidia.com/mig.config` is missing or empty gets `all-disabled`, whatever its
  gpu.deploy.mig-manager says. Like the real node-labelling controller this happens only on its
  triggers: the ClusterPolicy created or its spec changed (generation), the node created, or the
  node's gpu.present value, operands switch or MIG capability changed. Removing mig.config alone
  does not bring it back until the next trigger.
- The ConfigMap default-mig-parted-config (key config.yaml: MIG_PARTED_ASSET) is created, and written back
  from the asset on every pass, while mig-manager is enabled and migManager.config.name is empty or names
  it; a layout written into it is overwritten (createConfigMap in object_controls.go creates or updates it
  with a controller reference to the ClusterPolicy, and skips it only for a custom name). Deleted when
  mig-manager is disabled.
- Operand DaemonSets in status.namespace (OPERANDS): device plugin, GFD and mig-manager, each owned
  (controller reference) by the ClusterPolicy and labelled app.kubernetes.io/managed-by=gpu-operator,
  re-rendered when the ClusterPolicy changes (so mig.strategy changes roll the pods) and deleted when
  their component is disabled or the ClusterPolicy goes. With devicePlugin.config.name, plugin and GFD
  mount that ConfigMap as available-configs with DEFAULT_CONFIG (its entries are read by sharing.py).

"MIG-capable" follows hasMIGCapableGPU: `nvidia.com/mig.capable` decides when present; otherwise a
`nvidia.com/gpu.product` containing a100, a30 or h100 (the real list; H200 nodes rely on GFD's label).
Not emulated: the driver, toolkit, validator, DCGM and MPS operands, vGPU/VM workload configs,
GPUCluster, the other ConfigMaps of its assets (default-gpu-clients, the
entrypoint), and status conditions (status.state stays as seeded).
"""

from __future__ import annotations

import copy
import weakref

import yaml

DEPLOY = "nvidia.com/gpu.deploy."
GPU_PRESENT = "nvidia.com/gpu.present"
MIG_CAPABLE = "nvidia.com/mig.capable"
PRODUCT = "nvidia.com/gpu.product"
MIG_CONFIG = "nvidia.com/mig.config"
OPERANDS_LABEL = DEPLOY + "operands"
MIG_MANAGER_LABEL = DEPLOY + "mig-manager"
# gpuStateLabels for the container workload (GO controllers/state_manager.go).
STATE_LABELS = tuple(DEPLOY + name for name in (
    "driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
    "node-status-exporter", "operator-validator", "client"))
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-operator"}
DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_MIG_CONFIG_MAP = "default-mig-parted-config"
# The operator's own asset for default-mig-parted-config (assets/state-mig-manager/0400_configmap.yaml), in
# small: one entry per device-filter where a profile's count differs by GPU type (PCI device ids as in
# gpuops_mig_sim.models). seed.DEFAULT_MIG_PARTED_CONFIG is the same object.
A100_40GB, A100_80GB, H100_80GB, A30 = "0x20B010DE", "0x20B210DE", "0x233010DE", "0x20B710DE"
MIG_PARTED_ASSET = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
        "all-1g.5gb": [{"device-filter": [A100_40GB], "devices": "all", "mig-enabled": True,
                        "mig-devices": {"1g.5gb": 7}}],
        "all-1g.10gb": [
            {"device-filter": [A100_40GB], "devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4}},
            {"device-filter": [A100_80GB, H100_80GB], "devices": "all", "mig-enabled": True,
             "mig-devices": {"1g.10gb": 7}},
        ],
        "all-1g.6gb": [{"device-filter": [A30], "devices": "all", "mig-enabled": True,
                        "mig-devices": {"1g.6gb": 4}}],
        "all-2g.20gb": [{"device-filter": [A100_80GB, H100_80GB], "devices": "all", "mig-enabled": True,
                         "mig-devices": {"2g.20gb": 3}}],
        "all-3g.20gb": [{"device-filter": [A100_40GB], "devices": "all", "mig-enabled": True,
                         "mig-devices": {"3g.20gb": 2}}],
        "all-balanced": [
            {"device-filter": [A100_40GB], "devices": "all", "mig-enabled": True,
             "mig-devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
            {"device-filter": [A100_80GB, H100_80GB], "devices": "all", "mig-enabled": True,
             "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
            {"device-filter": [A30], "devices": "all", "mig-enabled": True,
             "mig-devices": {"1g.6gb": 2, "2g.12gb": 1}},
        ],
    },
}

# name, ClusterPolicy section, nodeSelector label, image, gets MIG_STRATEGY
OPERANDS = (
    ("nvidia-device-plugin-daemonset", "devicePlugin", DEPLOY + "device-plugin",
     "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", True),
    ("gpu-feature-discovery", "gfd", DEPLOY + "gpu-feature-discovery",
     "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", True),
    ("nvidia-mig-manager", "migManager", MIG_MANAGER_LABEL,
     "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0", False),
)

# cluster -> {"policy": (uid, generation) or None, "nodes": {name: trigger key}}
_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def active_policy(cluster):
    """The ClusterPolicy the operator acts on (the oldest), or None."""
    policies = cluster.list("ClusterPolicy")
    if not policies:
        return None
    return min(policies, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))


def operand_namespace(policy) -> str:
    return (policy.get("status") or {}).get("namespace") or DEFAULT_NAMESPACE


def component_enabled(policy, section: str) -> bool:
    """ClusterPolicy `<section>.enabled`; nil means enabled (IsEnabled)."""
    return ((policy.get("spec") or {}).get(section) or {}).get("enabled") is not False


def mig_config_map(policy) -> str:
    """The ConfigMap mounted into mig-manager: migManager.config.name, or the default one when it is empty
    (mounted then as config-default.yaml, only the fallback: mig-manager generates a per-node config)."""
    return custom_mig_config(policy) or DEFAULT_MIG_CONFIG_MAP


def custom_mig_config(policy) -> str:
    """migManager.config.name, "" when unset (the chart's default)."""
    return ((((policy.get("spec") or {}).get("migManager") or {}).get("config") or {}).get("name") or "")


def asset_text() -> str:
    return yaml.safe_dump(MIG_PARTED_ASSET, sort_keys=False)


def mig_capable(labels: dict) -> bool:
    if MIG_CAPABLE in labels:
        return labels[MIG_CAPABLE] == "true"
    product = labels.get(PRODUCT, "").lower()
    return any(name in product for name in ("h100", "a100", "a30"))


def reconcile(cluster):
    policy = active_policy(cluster)
    memo = _seen.setdefault(cluster, {"policy": None, "nodes": {}})
    if policy is None:
        memo["policy"], memo["nodes"] = None, {}
        return  # operands go with their owner (ownerReference cascade)
    key = (policy["metadata"]["uid"], policy["metadata"].get("generation", 1))
    policy_changed = memo["policy"] != key
    memo["policy"] = key
    spec = policy.get("spec") or {}
    mig_manager = spec.get("migManager") or {}
    default_disabled = component_enabled(policy, "migManager") and \
        (mig_manager.get("config") or {}).get("default", "all-disabled") == "all-disabled"
    names = set()
    for node in cluster.list("Node"):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        names.add(meta["name"])
        trigger = (meta["uid"], labels.get(GPU_PRESENT), labels.get(OPERANDS_LABEL) == "false", mig_capable(labels))
        triggered = policy_changed or memo["nodes"].get(meta["name"]) != trigger
        memo["nodes"][meta["name"]] = trigger
        patch = node_label_patch(labels, default_disabled and triggered)
        if patch:
            cluster.patch("Node", meta["name"], {"metadata": {"labels": patch}})
    for gone in set(memo["nodes"]) - names:
        del memo["nodes"][gone]
    _sync_operands(cluster, policy)
    _sync_default_config(cluster, policy)


def _sync_default_config(cluster, policy):
    """default-mig-parted-config as createConfigMap leaves it: from the asset, on every pass."""
    namespace = operand_namespace(policy)
    existing = cluster.find("ConfigMap", DEFAULT_MIG_CONFIG_MAP, namespace)
    if not component_enabled(policy, "migManager"):
        if existing is not None:
            cluster.delete("ConfigMap", DEFAULT_MIG_CONFIG_MAP, namespace)
        return
    if custom_mig_config(policy) not in ("", DEFAULT_MIG_CONFIG_MAP):
        return
    manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": DEFAULT_MIG_CONFIG_MAP, "namespace": namespace,
                             "ownerReferences": _owner(policy)},
                "data": {"config.yaml": asset_text()}}
    if existing is None:
        cluster.create(manifest)
    elif existing.get("data") != manifest["data"] or existing["metadata"].get("ownerReferences") != _owner(policy):
        updated = copy.deepcopy(existing)
        updated["data"] = manifest["data"]
        updated["metadata"]["ownerReferences"] = _owner(policy)
        cluster.replace(updated)


def _owner(policy):
    return [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": policy["metadata"]["name"],
             "uid": policy["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def node_label_patch(labels: dict, default_mig_config: bool) -> dict:
    """The label changes the operator makes on one node (None values remove)."""
    deploy = [k for k in labels if k in STATE_LABELS or k == MIG_MANAGER_LABEL]
    if labels.get(GPU_PRESENT) != "true" or labels.get(OPERANDS_LABEL) == "false":
        return {k: None for k in deploy}
    patch = {k: "true" for k in STATE_LABELS if not labels.get(k)}
    capable = mig_capable(labels)
    if capable and not labels.get(MIG_MANAGER_LABEL):
        patch[MIG_MANAGER_LABEL] = "true"
    if capable and default_mig_config and not labels.get(MIG_CONFIG):
        patch[MIG_CONFIG] = "all-disabled"
    return patch


def _sync_operands(cluster, policy):
    namespace = operand_namespace(policy)
    if not cluster.find("Namespace", namespace):
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    wanted = {}
    for name, section, selector, image, strategy in OPERANDS:
        if component_enabled(policy, section):
            wanted[name] = operand_daemonset(policy, name, selector, image, strategy)
    uid = policy["metadata"]["uid"]
    for ds in cluster.list("DaemonSet"):
        refs = ds["metadata"].get("ownerReferences") or []
        if any(r.get("uid") == uid and r.get("controller") for r in refs) and \
                (ds["metadata"]["name"] not in wanted or ds["metadata"]["namespace"] != namespace):
            cluster.delete("DaemonSet", ds["metadata"]["name"], ds["metadata"]["namespace"])
    for name, manifest in wanted.items():
        # Each operand's ServiceAccount first, as the operator's state manifests make it: a real
        # API server refuses the DaemonSet's pods without it.
        account = manifest["spec"]["template"]["spec"]["serviceAccountName"]
        if cluster.find("ServiceAccount", account, namespace) is None:
            cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": account, "namespace": namespace,
                                         "ownerReferences": _owner(policy)}})
        existing = cluster.find("DaemonSet", name, namespace)
        if existing is None:
            cluster.create(manifest)
            continue
        if _rendered(existing) != _rendered(manifest):
            updated = copy.deepcopy(existing)
            updated["metadata"]["labels"] = manifest["metadata"]["labels"]
            updated["metadata"]["ownerReferences"] = manifest["metadata"]["ownerReferences"]
            updated["spec"] = dict(existing.get("spec") or {}, selector=manifest["spec"]["selector"],
                                   template=manifest["spec"]["template"])
            cluster.replace(updated)


def _rendered(ds):
    meta, spec = ds["metadata"], ds.get("spec") or {}
    return (meta.get("labels"), meta.get("ownerReferences"), spec.get("selector"), spec.get("template"))


def operand_daemonset(policy, name, selector, image, with_strategy):
    """An operand DaemonSet as the operator renders it (only the fields the DaemonSet controller,
    kwok, the stand-ins and the roles read)."""
    spec = policy.get("spec") or {}
    namespace = operand_namespace(policy)
    env = []
    if with_strategy:
        # As NVIDIA/gpu-operator controllers/object_controls.go applyMIGConfiguration: no mig.strategy, no
        # MIG_STRATEGY env (the device plugin and GFD then run with their default, none); none without
        # NVIDIA_MIG_MONITOR_DEVICES.
        strategy = (spec.get("mig") or {}).get("strategy") or ""
        if strategy:
            env.append({"name": "MIG_STRATEGY", "value": strategy})
        if strategy != "none":
            env.append({"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})
    volumes, mounts = [], []
    if name == "nvidia-mig-manager":
        mig_manager = spec.get("migManager") or {}
        env += [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "DEFAULT_GPU_CLIENTS_NAMESPACE", "value": namespace}]
        volume = {"name": "mig-parted-config", "configMap": {"name": mig_config_map(policy)}}
        if custom_mig_config(policy):
            env.append({"name": "CONFIG_FILE", "value": "/mig-parted-config/config.yaml"})
        else:
            # TransformMIGManager: the default ConfigMap is only the fallback of the generated config.
            env.append({"name": "DEFAULT_CONFIG_FILE", "value": "/mig-parted-config/config-default.yaml"})
            volume["configMap"]["items"] = [{"key": "config.yaml", "path": "config-default.yaml"}]
        env += [dict(e) for e in mig_manager.get("env") or []]
        volumes.append(volume)
        mounts.append({"name": "mig-parted-config", "mountPath": "/mig-parted-config"})
    plugin_config = ((spec.get("devicePlugin") or {}).get("config") or {})
    if name in ("nvidia-device-plugin-daemonset", "gpu-feature-discovery") and plugin_config.get("name"):
        # The operator's config-manager reads devicePlugin.config's ConfigMap (gpu-operator.md section 5.2).
        env.append({"name": "DEFAULT_CONFIG", "value": plugin_config.get("default") or ""})
        volumes.append({"name": "available-configs", "configMap": {"name": plugin_config["name"]}})
        mounts.append({"name": "available-configs", "mountPath": "/available-configs"})
    container = {"name": name, "image": image, "env": env, "securityContext": {"privileged": True}}
    if mounts:
        container["volumeMounts"] = mounts
    pod_labels = {"app": name}
    template_spec = {
        "nodeSelector": {selector: "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-node-critical",
        "serviceAccountName": name if name != "nvidia-device-plugin-daemonset" else "nvidia-device-plugin",
        "containers": [container],
    }
    if volumes:
        template_spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": dict({"app": name}, **MANAGED_BY, **{"helm.sh/chart": "gpu-operator-v26.7.0"}),
            "ownerReferences": _owner(policy),
        },
        "spec": {
            "selector": {"matchLabels": dict(pod_labels)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": dict(pod_labels, **MANAGED_BY)}, "spec": template_spec},
        },
    }
