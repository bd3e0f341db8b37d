"""Manifests to seed a test cluster: `cluster.seed(node("gpu-1"), pod("web-1", node="gpu-1"))`.

Each helper returns a plain manifest dict that tests may edit before seeding.
"""

from __future__ import annotations

import yaml

from .allocations import POD_RESOURCES_ANNOTATION
from . import operator as gpu_operator_emulation
from .deviceplugin import NVML_STATE_ANNOTATION


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


namespace_manifest = namespace  # for helpers whose `namespace` parameter shadows the function


def node(name: str, labels: dict | None = None, *, unschedulable: bool = False, taints: list | None = None,
         allocatable: dict | None = None, nvml_state: str | None = None, pod_resources: str | None = None) -> dict:
    """A Ready node. `nvml_state` links it to a simulated GPU state file (see deviceplugin.py);
    `pod_resources` (a socket path) also has devices assigned to its pods and served there (allocations.py)."""
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
    if pod_resources:
        manifest["metadata"].setdefault("annotations", {})[POD_RESOURCES_ANNOTATION] = str(pod_resources)
    return manifest


def pod(name: str, *, node: str | None = None, namespace: str = "default", labels: dict | None = None,
        owner: tuple | None = None, emptydir: bool = False, phase: str | None = None,
        limits: dict | None = None, claims: list | None = None) -> dict:
    """A pod bound to `node`. owner=("ReplicaSet", "web-7d9f") makes it controller-owned;
    `limits` such as {"nvidia.com/gpu": 1} become the container's resource limits; `claims` names
    ResourceClaims (resourceClaimName) its container uses (see resource_claim)."""
    container = {"name": "main", "image": "registry.example/app:1"}
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"containers": [container]},
    }
    if claims:
        manifest["spec"]["resourceClaims"] = [{"name": "c%d" % i, "resourceClaimName": claim}
                                              for i, claim in enumerate(claims)]
        container.setdefault("resources", {})["claims"] = [{"name": "c%d" % i} for i in range(len(claims))]
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
    """A DaemonSet; kube-controller-manager's DaemonSet controller gives it one pod per eligible
    node, and kwok starts them."""
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
    """A PodDisruptionBudget. With min_available or max_unavailable the disruption controller
    computes its status; with neither, pass disruptions_allowed (scripted): the harness's seed
    (tests/support/controlplane/client.py) makes it maxUnavailable of that many, which the
    disruption controller turns into the same budget while the owners are healthy."""
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


# ----- NVIDIA GPU Operator and DRA driver ------------------------------------------------------------

# The operator's default-mig-parted-config (its asset, which it writes back on every reconcile).
A100_40GB, A100_80GB = gpu_operator_emulation.A100_40GB, gpu_operator_emulation.A100_80GB
H100_80GB, A30 = gpu_operator_emulation.H100_80GB, gpu_operator_emulation.A30
DEFAULT_MIG_PARTED_CONFIG = gpu_operator_emulation.MIG_PARTED_ASSET

CLUSTER_POLICY_CRD = "clusterpolicies.nvidia.com"


def cluster_policy_crd() -> dict:
    """The CustomResourceDefinition clusterpolicies.nvidia.com (the API server serves ClusterPolicy
    while it exists)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CLUSTER_POLICY_CRD, "labels": {"app.kubernetes.io/component": "gpu-operator"}},
        "spec": {
            "group": "nvidia.com", "scope": "Cluster",
            "names": {"kind": "ClusterPolicy", "listKind": "ClusterPolicyList", "plural": "clusterpolicies",
                      "singular": "clusterpolicy"},
            "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {"type": "object",
                                                         "x-kubernetes-preserve-unknown-fields": True}}}],
        },
        "status": {
            "acceptedNames": {"kind": "ClusterPolicy", "listKind": "ClusterPolicyList", "plural": "clusterpolicies",
                              "singular": "clusterpolicy"},
            "conditions": [{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                           {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}],
            "storedVersions": ["v1"],
        },
    }


def gpu_operator(namespace: str = "gpu-operator", *, mig_strategy: str | None = "single", mig_manager: bool = True,
                 config_name: str = "", config: dict | None = None,
                 device_plugin: bool = True, gfd: bool = True, config_default: str = "all-disabled",
                 driver: bool = True, env: dict | None = None) -> list:
    """What a GPU Operator install leaves behind, for the operator stand-in (operator.py):
    the CRD, the namespace, a ConfigMap of the user's `config_name` (key config.yaml, the mig-parted
    `config`, by default DEFAULT_MIG_PARTED_CONFIG) and the ClusterPolicy `cluster-policy` (without
    mig.strategy when mig_strategy is None, as CRs written by hand or by OLM may be; migManager.env from
    `env`, WITH_REBOOT=false unless given). Seed them in this order.

    config_name empty is the chart's default install: no ConfigMap of the user's; the operator writes
    default-mig-parted-config from its asset and mig-manager generates <node>-mig-config. A `config`
    needs a config_name of the user's: the operator would overwrite it in default-mig-parted-config."""
    if config is not None and config_name in ("", gpu_operator_emulation.DEFAULT_MIG_CONFIG_MAP):
        raise ValueError("seed.gpu_operator: a config needs a ConfigMap of the user's (config_name); the operator "
                         "rewrites %s from its own asset" % gpu_operator_emulation.DEFAULT_MIG_CONFIG_MAP)
    text = yaml.safe_dump(config if config is not None else DEFAULT_MIG_PARTED_CONFIG, sort_keys=False)
    env = dict({"WITH_REBOOT": "false"}, **(env or {}))
    policy = {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "labels": {"app.kubernetes.io/component": "gpu-operator"}},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "mig": {"strategy": mig_strategy} if mig_strategy is not None else {},
            "migManager": {"enabled": mig_manager, "config": {"name": config_name, "default": config_default},
                           "env": [{"name": k, "value": str(v)} for k, v in env.items()]},
            "devicePlugin": {"enabled": device_plugin},
            "gfd": {"enabled": gfd},
            "driver": {"enabled": driver},
            "toolkit": {"enabled": True},
            "validator": {"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]}},
            "cdi": {"enabled": True},
            "daemonsets": {"updateStrategy": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "1"}},
        },
        "status": {"namespace": namespace, "state": "ready"},
    }
    objs = [cluster_policy_crd(), namespace_manifest(namespace)]
    if config_name and config_name != gpu_operator_emulation.DEFAULT_MIG_CONFIG_MAP:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": config_name, "namespace": namespace},
                     "data": {"config.yaml": text}})
    objs.append(policy)
    return objs


GPU_CLUSTER_CRD = "gpuclusters.nvidia.com"


def gpu_cluster(namespace: str = "gpu-operator", *, dynamic_mig: bool = False) -> list:
    """GPU Operator v26.7's DRA stack (tech preview, NVIDIA/gpu-operator api/nvidia/v1alpha1/gpucluster_types.go):
    the CRD gpuclusters.nvidia.com and the singleton GPUCluster `gpu-cluster` (draDriver.featureGates with
    DynamicMIG when `dynamic_mig`). It has no mig-manager, device plugin or GFD; nothing of it is emulated
    beyond the object."""
    names = {"kind": "GPUCluster", "listKind": "GPUClusterList", "plural": "gpuclusters", "singular": "gpucluster"}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": GPU_CLUSTER_CRD, "labels": {"app.kubernetes.io/component": "gpu-operator"}},
        "spec": {"group": "nvidia.com", "scope": "Cluster", "names": names,
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
        "status": {"acceptedNames": names, "storedVersions": ["v1alpha1"],
                   "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}]},
    }
    cluster = {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
               "metadata": {"name": "gpu-cluster"},
               "spec": {"draDriver": {"featureGates": {"DynamicMIG": True} if dynamic_mig else {}}},
               "status": {"namespace": namespace, "state": "ready"}}
    return [crd, namespace_manifest(namespace), cluster]


DRA_DRIVER = "gpu.nvidia.com"
DRA_POD_LABEL = {"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}


def resource_claim(name: str, *, namespace: str = "default", device_class: str = "mig.nvidia.com", count: int = 1,
                   profile: str | None = None) -> dict:
    """A ResourceClaim (resource.k8s.io/v1) with one request `gpu` for `count` devices of the DeviceClass
    (seed.dra_driver's mig.nvidia.com or gpu.nvidia.com), with `profile` as a CEL selector on the MIG
    profile. The dra.py stand-in allocates it once a pod using it is bound to a node."""
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if profile:
        exactly["selectors"] = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '%s'" % profile}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def dra_driver(namespace: str = "nvidia-dra-driver-gpu", *, dynamic_mig: bool = False,
               node_selector: dict | None = None) -> list:
    """NVIDIA's DRA driver for GPUs as its chart installs it (kubelet plugin only): the namespace, the
    DaemonSet dra-driver-nvidia-gpu-kubelet-plugin (pods labelled app.kubernetes.io/name=dra-driver-nvidia-gpu;
    env FEATURE_GATES=DynamicMIG=true with dynamic_mig; the chart's default affinity on
    nvidia.com/gpu.present=true unless node_selector is given), its ServiceAccount and the DeviceClasses
    gpu.nvidia.com and mig.nvidia.com. The stand-in dra.py plays the plugin on nodes linked to a simulated
    GPU host."""
    labels = dict(DRA_POD_LABEL, **{"app.kubernetes.io/component": "kubelet-plugin"})
    env = [{"name": "NVIDIA_DRIVER_ROOT", "value": "/"}]
    if dynamic_mig:
        env.append({"name": "FEATURE_GATES", "value": "DynamicMIG=true"})
    spec = {"serviceAccountName": "dra-driver-nvidia-gpu-service-account",
            "containers": [{"name": "gpus", "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1",
                            "env": env}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    else:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": namespace, "labels": dict(labels)},
        "spec": {"selector": {"matchLabels": dict(labels)}, "updateStrategy": {"type": "RollingUpdate"},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": spec}},
    }

    def device_class(name, expression):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}

    # The chart's ServiceAccount: a real API server refuses the plugin's pods without it.
    account = {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": spec["serviceAccountName"], "namespace": namespace}}
    return [
        namespace_manifest(namespace), account, daemonset,
        device_class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com' && "
                                       "device.attributes['gpu.nvidia.com'].type == 'gpu'"),
        device_class("mig.nvidia.com", "device.driver == 'gpu.nvidia.com' && "
                                       "device.attributes['gpu.nvidia.com'].type == 'mig'"),
    ]
