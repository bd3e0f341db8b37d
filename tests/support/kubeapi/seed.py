"""Manifests for seeding a test cluster: `kube_api.seed(node("gpu-1"), pod("web-1", node="gpu-1", ...))`.

Each helper returns a plain manifest dict that tests may edit before seeding.
"""

from __future__ import annotations

import yaml

from .deviceplugin import NVML_STATE_ANNOTATION


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def node(name: str, labels: dict | None = None, *, unschedulable: bool = False, taints: list | None = None,
         allocatable: dict | None = None, nvml_state: str | None = None) -> dict:
    """A Ready node. `nvml_state` links it to a simulated GPU state file (see deviceplugin.py)."""
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", **(allocatable or {})}
    manifest = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              **(labels or {})}},
        "spec": {},
        "status": {
            "capacity": dict(resources), "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "Hostname", "address": name}],
            # The kubernetes client (37) rejects a NodeSystemInfo that lacks any of these.
            "nodeInfo": {"architecture": "amd64", "bootID": f"boot-{name}",
                         "containerRuntimeVersion": "containerd://1.7.0", "kernelVersion": "6.1.0-13-amd64",
                         "kubeProxyVersion": "", "kubeletVersion": "v1.31.0", "machineID": f"machine-{name}",
                         "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "systemUUID": f"uuid-{name}"},
        },
    }
    if unschedulable:
        manifest["spec"]["unschedulable"] = True
    if taints:
        manifest["spec"]["taints"] = taints
    if nvml_state:
        manifest["metadata"]["annotations"] = {NVML_STATE_ANNOTATION: str(nvml_state)}
    return manifest


def pod(name: str, *, node: str | None = None, namespace: str = "default", labels: dict | None = None,
        owner: tuple | None = None, emptydir: bool = False, phase: str | None = None,
        limits: dict | None = None) -> dict:
    """A pod bound to `node`. owner=("ReplicaSet", "web-7d9f") makes it controller-owned;
    `limits` such as {"nvidia.com/gpu": 1} become the container's resource limits."""
    container = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"containers": [container]},
    }
    if node:
        manifest["spec"]["nodeName"] = node
    if owner:
        kind, owner_name = owner
        api_version = "batch/v1" if kind == "Job" else "apps/v1"
        manifest["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": owner_name,
                                                    "uid": f"seed-{kind.lower()}-{owner_name}",
                                                    "controller": True, "blockOwnerDeletion": True}]
    if emptydir:
        manifest["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    if phase:
        manifest["status"] = {"phase": phase}
    return manifest


def replicaset(name: str, replicas: int, *, namespace: str = "default", labels: dict | None = None) -> dict:
    """A ReplicaSet (no pods are created for it): PDBs count its replicas as expected pods."""
    labels = dict(labels or {"app": name})
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]}}},
    }


def daemonset(name: str, *, namespace: str = "default", labels: dict | None = None, env: dict | None = None,
              node_selector: dict | None = None, tolerations: list | None = None) -> dict:
    """A DaemonSet; the emulator's controller gives it one pod per eligible node."""
    labels = dict(labels or {"app": name})
    container = {"name": name, "image": f"registry.example/{name}:1",
                 "env": [{"name": k, "value": str(v)} for k, v in (env or {}).items()]}
    spec = {"containers": [container]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": spec},
                 "updateStrategy": {"type": "RollingUpdate"}},
    }


def pdb(name: str, match_labels: dict, *, namespace: str = "default", min_available=None, max_unavailable=None,
        disruptions_allowed: int | None = None) -> dict:
    """A PodDisruptionBudget. With min_available or max_unavailable the emulator computes its
    status; with neither, pass disruptions_allowed and the status stays as written (scripted)."""
    spec = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    manifest = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    if disruptions_allowed is not None:
        manifest["status"] = {"disruptionsAllowed": disruptions_allowed, "currentHealthy": 0,
                              "desiredHealthy": 0, "expectedPods": 0}
    return manifest


def load_manifests(path) -> list:
    """Objects from a multi-document YAML file; `kind: List` documents are flattened."""
    with open(path, encoding="utf-8") as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    objs = []
    for doc in docs:
        objs.extend((doc.get("items") or []) if doc.get("kind") == "List" else [doc])
    return objs


DEFAULT_OPERATOR_CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
        "all-1g.10gb": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                         "mig-devices": {"1g.10gb": 7}},
                        {"device-filter": ["0x20B010DE"], "devices": "all", "mig-enabled": True,
                         "mig-devices": {"1g.5gb": 7}}],
        "all-3g.40gb": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                         "mig-devices": {"3g.40gb": 2}}],
        "all-balanced": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                          "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}],
    },
}


def gpu_operator(namespace: str = "gpu-operator", *, mig_strategy: str = "single", mig_manager: bool = True,
                 config_name: str = "default-mig-parted-config", config: dict | None = None,
                 device_plugin: bool = True, gfd: bool = True, config_default: str = "all-disabled") -> list:
    """The GPU Operator's ClusterPolicy `cluster-policy` and its MIG config ConfigMap (see operator.py)."""
    policy = {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
        "spec": {"mig": {"strategy": mig_strategy},
                 "migManager": {"enabled": mig_manager, "config": {"name": config_name, "default": config_default}},
                 "devicePlugin": {"enabled": device_plugin}, "gfd": {"enabled": gfd}, "driver": {"enabled": True}},
        "status": {"namespace": namespace, "state": "ready"},
    }
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": config_name or "default-mig-parted-config", "namespace": namespace},
                 "data": {"config.yaml": yaml.safe_dump(config or DEFAULT_OPERATOR_CONFIG, sort_keys=False)}}
    return [namespace_(namespace), policy, configmap]


def dra_driver(namespace: str = "nvidia-dra-driver-gpu", *, dynamic_mig: bool = False,
               node_selector: dict | None = None) -> list:
    """NVIDIA's DRA driver: its kubelet-plugin DaemonSet and the mig.nvidia.com DeviceClass (see operator.py)."""
    env = [{"name": "FEATURE_GATES", "value": "DynamicMIG=true" if dynamic_mig else ""}]
    labels = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": namespace},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"nodeSelector": node_selector or {"nvidia.com/gpu.present": "true"},
                                       "containers": [{"name": "gpus", "image": "dra-driver-nvidia-gpu",
                                                       "env": env}]}}},
    }
    deviceclass = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
                   "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                                 "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}
    return [namespace_(namespace), daemonset, deviceclass]


namespace_ = namespace
