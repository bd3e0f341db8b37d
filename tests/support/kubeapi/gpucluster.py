"""A simulated GPU Operator v26.7 running its DRA stack for a GPUCluster (nvidia.com/v1alpha1, tech preview).

Active while a GPUCluster exists and no ClusterPolicy does (operator.py plays the ClusterPolicy stack; the real
node-labelling controller acts for one stack per reconcile); with several GPUClusters the oldest counts. Each
pass of the cluster's reconcile loop does what these parts of NVIDIA/gpu-operator v26.7.0 do:

- controllers/state_manager.go `gpuClusterStateLabels` and controllers/nodelabeling_controller.go
  `updateGPUClusterStateLabels`: nodes with `nvidia.com/gpu.present=true` get the DRA stack's deploy labels
  STATE_LABELS (driver, dra-driver, dra-validator, dcgm-dra, dcgm-exporter-dra) set to "true" **only where the
  label is absent or empty**: any other value (`paused-for-mig-change`, `false`) is honoured, which is how an
  operand is paused on a node. A node whose gpu.present is not "true" loses them.
- internal/state/dra_driver.go and dcgm.go / dcgm_exporter.go as their golden files render them
  (internal/state/testdata/golden/gpucluster-*.yaml): the DaemonSets OPERANDS in the GPUCluster's
  status.namespace, each with the nodeSelector `nvidia.com/gpu.deploy.<component>: "true"` and the pod labels
  of the golden files, owned (controller reference) by the GPUCluster. The kubelet plugin gets FEATURE_GATES
  from spec.draDriver.featureGates (`Name=true|false`, sorted), so dra.py plays it, DynamicMIG included.

Not emulated: the driver, the DRA validator and the controller-side parts of the DRA driver (ComputeDomains,
its controller Deployment, the ValidatingAdmissionPolicy on ResourceSlices), DCGM holding the GPUs (nothing
in the simulated host is busy because a DCGM pod runs), the deferral of the kubelet plugin's removal while
pods hold gpu.nvidia.com claims (that path is the ClusterPolicy stack's mode flip), status conditions
(status.state stays as seeded), and the refusal of a GPUCluster beside a ClusterPolicy.
"""

from __future__ import annotations

import copy

from .operator import DEFAULT_NAMESPACE, DEPLOY, GPU_PRESENT, MANAGED_BY

STATE_LABELS = tuple(DEPLOY + name for name in ("driver", "dra-driver", "dra-validator", "dcgm-dra",
                                                "dcgm-exporter-dra"))
KUBELET_PLUGIN = "nvidia-dra-driver-kubelet-plugin"
# name, nodeSelector label, image, pod labels
OPERANDS = (
    (KUBELET_PLUGIN, DEPLOY + "dra-driver", "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0",
     {"app": KUBELET_PLUGIN, "app.kubernetes.io/component": KUBELET_PLUGIN,
      "app.kubernetes.io/name": "nvidia-dra-driver"}),
    ("nvidia-dcgm-dra", DEPLOY + "dcgm-dra", "nvcr.io/nvidia/cloud-native/dcgm",
     {"app": "nvidia-dcgm-dra"}),
    ("nvidia-dcgm-exporter-dra", DEPLOY + "dcgm-exporter-dra", "nvcr.io/nvidia/k8s/dcgm-exporter",
     {"app": "nvidia-dcgm-exporter-dra"}),
)


def active_gpu_cluster(cluster):
    """The GPUCluster the operator acts on (the oldest), or None; None too while a ClusterPolicy exists."""
    if cluster.list("ClusterPolicy"):
        return None
    found = cluster.list("GPUCluster")
    if not found:
        return None
    return min(found, key=lambda c: (c["metadata"].get("creationTimestamp", ""), c["metadata"]["name"]))


def reconcile(cluster):
    gpu_cluster = active_gpu_cluster(cluster)
    if gpu_cluster is None:
        return  # its operands go with it (ownerReference cascade)
    for node in cluster.list("Node"):
        patch = node_label_patch(node["metadata"].get("labels") or {})
        if patch:
            cluster.patch("Node", node["metadata"]["name"], {"metadata": {"labels": patch}})
    _sync_operands(cluster, gpu_cluster)


def node_label_patch(labels: dict) -> dict:
    """The DRA stack's deploy labels on one node (None values remove)."""
    if labels.get(GPU_PRESENT) != "true":
        return {k: None for k in labels if k in STATE_LABELS}
    return {k: "true" for k in STATE_LABELS if not labels.get(k)}


def namespace_of(gpu_cluster) -> str:
    return (gpu_cluster.get("status") or {}).get("namespace") or DEFAULT_NAMESPACE


def feature_gates(gpu_cluster) -> str:
    gates = (((gpu_cluster.get("spec") or {}).get("draDriver") or {}).get("featureGates") or {})
    return ",".join("%s=%s" % (name, "true" if value is True or str(value).lower() == "true" else "false")
                    for name, value in sorted(gates.items()))


def operand_daemonset(gpu_cluster, name, selector, image, pod_labels):
    namespace = namespace_of(gpu_cluster)
    container = {"name": "gpus" if name == KUBELET_PLUGIN else name, "image": image,
                 "securityContext": {"privileged": True}}
    gates = feature_gates(gpu_cluster)
    if name == KUBELET_PLUGIN and gates:
        container["env"] = [{"name": "FEATURE_GATES", "value": gates}]
    owner = [{"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "name": gpu_cluster["metadata"]["name"],
              "uid": gpu_cluster["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(pod_labels, **MANAGED_BY),
                     "ownerReferences": owner},
        "spec": {
            "selector": {"matchLabels": {"app": pod_labels["app"]}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": {
                "nodeSelector": {selector: "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "priorityClassName": "system-node-critical",
                "containers": [container]}},
        },
    }


def _sync_operands(cluster, gpu_cluster):
    namespace = namespace_of(gpu_cluster)
    if not cluster.find("Namespace", namespace):
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for name, selector, image, pod_labels in OPERANDS:
        manifest = operand_daemonset(gpu_cluster, name, selector, image, pod_labels)
        existing = cluster.find("DaemonSet", name, namespace)
        if existing is None:
            cluster.create(manifest)
        elif (existing.get("spec") or {}).get("template") != manifest["spec"]["template"] or \
                existing["metadata"].get("ownerReferences") != manifest["metadata"]["ownerReferences"]:
            updated = copy.deepcopy(existing)
            updated["metadata"]["ownerReferences"] = manifest["metadata"]["ownerReferences"]
            updated["spec"] = dict(existing.get("spec") or {}, template=manifest["spec"]["template"])
            cluster.replace(updated)
