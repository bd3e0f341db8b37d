#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_cluster_info
short_description: What a MIG rollout reads from the Kubernetes cluster, in one pass
version_added: 0.2.0
description:
  - Reads, with the C(kubernetes.core) client, what the M(gpuops.mig.mig_node) role decides on besides the
    GPUs, in one module run (one Kubernetes client, one API discovery) instead of one
    M(kubernetes.core.k8s_info) run per kind. The role reads the cluster with it once per batch, and
    M(gpuops.mig.mig_node_preview) takes its result.
  - The NVIDIA GPU Operator's ClusterPolicies, its GPUClusters (C(nvidia.com/v1alpha1), the DRA stack of GPU Operator
    v26.7, which runs no mig-manager) and the DaemonSets of NVIDIA's DRA kubelet plugin and of HAMi's device
    plugin (a dynamic MIG partitioner a node may be handed to), with O(operator).
  - The Nodes, with O(nodes); without their C(status) unless O(node_status).
  - Every object comes without C(metadata.managedFields), the API server's field bookkeeping. Every node's
    preview is handed what this returns, so its size is paid once per node.
  - The ConfigMaps that may hold a MIG config, each read by its name, never by listing a namespace (other
    ConfigMaps there, C(kube-system/aws-auth) say, may hold credentials). These are the ones named in
    O(configmaps), and whenever a ClusterPolicy is found, the GPU Operator's mig-manager config (the ConfigMap the
    ClusterPolicy names, else C(<node>-mig-config) for each node of O(operator_config_nodes) and
    C(default-mig-parted-config)), and the device plugin's per-node configs the ClusterPolicy names
    (C(devicePlugin.config.name)).
  - What it returns holds cluster data; register it with C(no_log) where job logs are kept (AWX job events), as
    the M(gpuops.mig.mig_node) role does.
  - A kind the cluster does not serve (no ClusterPolicy CRD where the GPU Operator is not installed) reads as
    an empty list.
  - Changes nothing.
  - Where the module would run on the controller with the controller's own Python (C(delegate_to) V(localhost),
    as the roles do, without an C(ansible_python_interpreter) that points elsewhere), the action plugin reads
    the cluster in the controller's process instead, with the same C(kubernetes.core) client, as the
    C(kubernetes.core.k8s) lookup does. That spares a Python start and the client's import, about 0.4 s per
    read. The task's C(environment) applies the same way. Anywhere else, and with C(async), the module runs.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - kubernetes >= 24.2.0 (the Python client, as for M(kubernetes.core.k8s_info))
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  action:
    description: Has an action plugin, which reads on the controller where the module would run there.
    support: full
  check_mode:
    description: Can run in C(check_mode).
    support: full
    details: Read-only; runs the same way in check mode.
  diff_mode:
    description: Returns what changed in diff mode.
    support: none
  idempotent:
    description: When run twice in a row with the same arguments, the second run reports no change.
    support: full
options:
  operator:
    description: Read the GPU Operator's ClusterPolicies, and the DaemonSets of all namespaces to find NVIDIA's DRA kubelet plugin and HAMi's device plugin.
    type: bool
    default: true
  nodes:
    description: Read the Nodes.
    type: bool
    default: true
  node_status:
    description:
      - Return each Node's C(status) too (allocatable resources, conditions, the image list). The rollout's
        decision needs only C(metadata) and C(spec).
    type: bool
    default: false
  configmaps:
    description:
      - ConfigMaps to read, by name, each written C([namespace/]name) or given as C({name, namespace});
        an empty namespace is the GPU Operator's (C(status.namespace) of its ClusterPolicy, else
        V(gpu-operator)). A ConfigMap that does not exist is left out of the result, and so is a
        value of neither form.
    type: list
    elements: raw
    default: []
  operator_config_nodes:
    description:
      - Nodes whose C(<node>-mig-config) ConfigMap is read from the GPU Operator's namespace when its ClusterPolicy
        names no mig-manager config (C(spec.migManager.config.name)). Only with O(operator).
    type: list
    elements: str
    default: []
  leases:
    description:
      - Names of C(coordination.k8s.io/v1) Leases to read from O(lease_namespace) (the nodes' holds of
        M(gpuops.mig.mig_node_lease)), returned in RV(leases). Read by name, never listed.
    type: list
    elements: str
    default: []
  lease_namespace:
    description: The namespace of O(leases).
    type: str
    default: default
  check_access:
    description:
      - Check with SelfSubjectAccessReviews that the identity may do what a rollout does (what
        C(rbac/rollout.yml) grants; leases in O(lease_namespace)), returned in RV(missing_access).
        M(gpuops.mig.mig_node) checks before a batch's first change.
    type: bool
    default: false
  dra_nodes:
    description:
      - Nodes for which to map, where NVIDIA's DRA driver (C(gpu.nvidia.com)) serves them, which pod holds which
        device, from the ResourceClaims allocated there and the node's ResourceSlices (C(resource.k8s.io/v1)),
        returned in RV(dra_allocations). The ResourceSlices of the driver and the ResourceClaims are listed once
        per run; a cluster that does not serve C(resource.k8s.io/v1) reads as one without the driver.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
"""

EXAMPLES = r"""
- name: Read the cluster once for the whole batch
  gpuops.mig.mig_cluster_info:
    configmaps:
      - mig-configs/fleet-mig-config
  delegate_to: localhost
  run_once: true
  register: cluster
  no_log: true

- name: Say whether the GPU Operator runs
  ansible.builtin.debug:
    msg: "{{ cluster.cluster_policies | length }} ClusterPolicy, {{ cluster.nodes | length }} node(s)"
"""

RETURN = r"""
cluster_policies:
  description: The ClusterPolicy objects (C(nvidia.com/v1)); empty without the CRD.
  returned: with O(operator)
  type: list
  elements: dict
gpu_clusters:
  description: The GPUCluster objects (C(nvidia.com/v1alpha1)); empty without the CRD.
  returned: with O(operator)
  type: list
  elements: dict
  version_added: 0.2.0
daemonsets:
  description: The DaemonSets of NVIDIA's DRA kubelet plugin and of HAMi's device plugin, in any namespace.
  returned: with O(operator)
  type: list
  elements: dict
operator:
  description:
    - The GPU Operator and NVIDIA's DRA driver as the rollout sees them, cluster-wide - C(present) (a ClusterPolicy
      is found); with it C(name), C(namespace), C(device_plugin) and C(gfd) (the operator runs them),
      C(mig_strategy), C(mig_manager); C(gpu_cluster) (the GPUCluster of the operator's DRA stack, null without
      one or beside a ClusterPolicy) and C(dra). The same view M(gpuops.mig.mig_node_preview) returns as its
      C(operator), here for no node in particular (C(mig_manager.on_node) false, no node labels read).
    - Computed by the action plugin on the controller, whichever way the cluster was read.
  returned: with O(operator)
  type: dict
  version_added: 0.2.0
nodes:
  description: The Node objects (C(status) only with O(node_status)).
  returned: with O(nodes)
  type: list
  elements: dict
configmaps:
  description: The ConfigMap objects read, by namespace (each namespace a ConfigMap was asked from, with those found).
  returned: always
  type: dict
  sample: {"gpu-operator": [{"kind": "ConfigMap", "metadata": {"name": "default-mig-parted-config"}}]}
operator_namespace:
  description: The GPU Operator's namespace (from its ClusterPolicy, else V(gpu-operator)).
  returned: always
  type: str
leases:
  description: The Leases of O(leases) that exist, by name.
  returned: always
  type: dict
missing_access:
  description:
    - With O(check_access), what the identity may not do, as
      C(verb resource.group[/sub] [in namespace]).
  returned: when O(check_access)
  type: list
  elements: str
  sample: ["create pods/eviction", "update leases.coordination.k8s.io in default"]
access_msg:
  description: With O(check_access), a sentence saying what is missing; empty when nothing is.
  returned: when O(check_access)
  type: str
dra_allocations:
  description:
    - By node of O(dra_nodes) that NVIDIA's DRA driver serves (a ResourceSlice of C(gpu.nvidia.com) names it),
      which pod holds which device, as M(gpuops.mig.mig_node_info) takes it in its C(dra_allocations) option
      C(allocations) (one item per device of a ResourceClaim allocated there and pod the claim is reserved for,
      with C(device_uuid) from the device's C(uuid) attribute, C(namespace), C(pod), C(pod_uid), C(claim),
      C(request), C(device)), C(allocations_source) (V(dra)) and C(allocations_error).
    - Where the claims cannot be mapped (a result naming a device no ResourceSlice of the node publishes, a
      device without a C(uuid), a claim reserved for something other than a pod, a malformed object), or the
      API does not give the slices or claims, C(allocations) is null and C(allocations_error) names the node, the
      claim and the device. The rollout then drains the whole node.
    - The claims themselves are not returned.
  returned: with O(dra_nodes)
  type: dict
  version_added: 0.2.0
"""

from ansible_collections.kubernetes.core.plugins.module_utils.ansiblemodule import AnsibleModule
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.service import K8sService

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_api import bounded
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import cluster_read_spec, read_cluster


def main():
    module = AnsibleK8SModule(module_class=AnsibleModule, argument_spec=cluster_read_spec(AUTH_ARG_SPEC), supports_check_mode=True)
    try:
        # Each request with a timeout and retries (module_utils/_k8s_api.py).
        service = K8sService(bounded(get_api_client, module), module)
        module.exit_json(changed=False, **read_cluster(service, module.params))
    except CoreException as err:
        module.fail_from_exception(err)


if __name__ == "__main__":
    main()
