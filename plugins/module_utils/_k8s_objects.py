# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Kubernetes objects as the rollout reads them: which DaemonSet is NVIDIA's DRA kubelet plugin, and
objects trimmed to what the rollout decides on.

Shared by gpuops.mig.mig_cluster_info (which returns only what is needed: every host's preview
gets it, so its size is paid once per node) and plugin_utils/_node_decision.py. Private to the
collection; no Ansible imports.
"""

from __future__ import annotations

# NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): the name its chart gives its pods.
DRA_APP = "dra-driver-nvidia-gpu"


def is_dra_kubelet_plugin(daemonset):
    """Whether a DaemonSet runs NVIDIA's DRA kubelet plugin (by its pods' app label, else by its name)."""
    template = ((daemonset.get("spec") or {}).get("template") or {})
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    name = (daemonset.get("metadata") or {}).get("name") or ""
    return (pod_labels.get("app.kubernetes.io/name") == DRA_APP or name.endswith("dra-driver-kubelet-plugin")
            or (DRA_APP in name and name.endswith("kubelet-plugin")))


def trimmed(obj, keep_status=True):
    """The object without metadata.managedFields (the API server's field bookkeeping, often most of an
    object) and, unless keep_status, without its status (a Node's image list and conditions)."""
    obj = dict(obj)
    metadata = dict(obj.get("metadata") or {})
    metadata.pop("managedFields", None)
    obj["metadata"] = metadata
    if not keep_status:
        obj.pop("status", None)
    return obj
