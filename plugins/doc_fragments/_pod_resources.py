# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """Paired with POD_RESOURCES_ARG_SPEC in plugins/module_utils/_common.py (private)."""

    DOCUMENTATION = r"""
options:
  read_allocations:
    description:
      - Read which pod holds which GPU or MIG device from the kubelet's PodResources API (gRPC
        C(v1.PodResourcesLister/List) on O(pod_resources_socket)), within 5 seconds.
      - NVIDIA's device plugin names devices by UUID (C(MIG-...), C(GPU-...)); a time-slicing replica
        C(<UUID>::<n>) counts as one allocation of that UUID. A whole GPU's allocation counts for every MIG
        device on it. Device IDs of other plugins are left out.
      - It needs the Python packages C(grpcio) and C(protobuf) (3.20 or later) on the managed host, and only
        when the socket exists. When the API cannot be read (no socket, refused, no answer in time, an answer
        that does not decode, no C(grpcio)), nothing fails; RV(allocations) is null and RV(allocations_error)
        says why.
      - V(false) skips the read (RV(allocations_error) says so).
    type: bool
    default: true
  pod_resources_socket:
    description:
      - The kubelet's PodResources socket (a kubelet with another C(--root-dir) has it under that directory).
    type: path
    default: /var/lib/kubelet/pod-resources/kubelet.sock
  dra_allocations:
    description:
      - Where NVIDIA's DRA driver (C(gpu.nvidia.com)) serves the node, which pod holds which device according to
        the ResourceClaims allocated there, as M(gpuops.mig.mig_cluster_info) returns it for the node in
        RV(gpuops.mig.mig_cluster_info#module:dra_allocations) (C(allocations), C(allocations_source),
        C(allocations_error)). The controller reads it, so the host needs no access to the Kubernetes API.
      - It joins the kubelet's answer (RV(allocations_source) V(podresources+dra)), or stands alone where the
        kubelet cannot be read (V(dra)). When it says the claims could not be mapped to devices
        (C(allocations) null), the whole map is unknown, RV(allocations) is null and RV(allocations_error)
        gives that reason.
      - Leave it out on a node the DRA driver does not serve. Only with O(read_allocations).
    type: dict
    version_added: 0.2.0
"""
