# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pods of a node the mig_node role's steps touch, on the controller: the pods a drain evicts, the
device plugin and GFD pods restarted after a change, the smoke workloads that check the new devices.
Plain data in and out (pods as the API serves them); plugins/filter/node_pods.py wraps it.
"""

from __future__ import annotations

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def _meta(pod):
    return (pod or {}).get("metadata") or {}


def _ref(pod, labels=None):
    metadata = {"name": _meta(pod).get("name"), "namespace": _meta(pod).get("namespace")}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


def uses_gpu(pod):
    """Whether a container (or init container) of the pod asks for an NVIDIA GPU or MIG device."""
    spec = (pod or {}).get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for names in (resources.get("limits") or {}, resources.get("requests") or {}):
            if any(name.startswith(GPU_RESOURCE_PREFIXES) for name in names):
                return True
    return False


def pods_to_evict(pods, gpu_pods_only, evict_label):
    """The pods a whole-node drain evicts (every pod but DaemonSet and mirror pods; with gpu_pods_only only
    those that use GPUs), as patches that give each the label evict_label=true (k8s_drain then evicts
    exactly the labelled ones, through the Eviction API)."""
    chosen = []
    for pod in pods or ():
        owners = [ref.get("kind") for ref in _meta(pod).get("ownerReferences") or []]
        mirror = "kubernetes.io/config.mirror" in (_meta(pod).get("annotations") or {})
        if "DaemonSet" in owners or mirror or (gpu_pods_only and not uses_gpu(pod)):
            continue
        chosen.append(_ref(pod, {evict_label: "true"}))
    return chosen


def plugin_pods(pods, selectors):
    """The device plugin and GFD pods among the node's pods: those matching any `key=value` selector."""
    wanted = [tuple(s.split("=", 1)) for s in selectors or () if "=" in s]
    chosen = []
    for pod in pods or ():
        labels = _meta(pod).get("labels") or {}
        if any(labels.get(key) == value for key, value in wanted):
            chosen.append(_ref(pod))
    return chosen


def smoke_pods(resources, node, image, command, namespace, label):
    """One pod per advertised resource, pinned to the (still cordoned) node with spec.nodeName, each asking
    for one device and expected to end Succeeded."""
    pods = []
    for index, resource in enumerate(sorted(resources or ()), start=1):
        container = {"name": "smoke", "image": image, "resources": {"limits": {resource: 1}}}
        if command:
            container["command"] = list(command)
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "gpuops-mig-smoke-%s-%d" % (node, index), "namespace": namespace,
                                  "labels": {label: node}, "annotations": {"gpuops.mig/resource": resource}},
                     "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}})
    return pods


def smoke_failure(pods, node, image, timeout):
    """Why the smoke workloads failed: each one's resource, name and phase."""
    parts = ["%s (%s): %s" % ((_meta(p).get("annotations") or {}).get("gpuops.mig/resource", "?"), _meta(p).get("name"),
                              ((p.get("status") or {}).get("phase") or "Pending")) for p in pods or ()]
    return "%s: smoke workloads (%s) did not succeed within %s s: %s" % (node, image, timeout, "; ".join(parts) or "none started")
