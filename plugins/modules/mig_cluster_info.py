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
  - The NVIDIA GPU Operator's ClusterPolicies and the DaemonSets of NVIDIA's DRA kubelet plugin, with
    O(operator).
  - The Nodes, with O(nodes); without their C(status) unless O(node_status).
  - Every object comes without C(metadata.managedFields), the API server's field bookkeeping. Every node's
    preview is handed what this returns, so its size is paid once per node.
  - The ConfigMaps of the namespaces that may hold a MIG config, with O(configmap_namespaces), and the GPU
    Operator's namespace whenever a ClusterPolicy is found.
  - A kind the cluster does not serve (no ClusterPolicy CRD where the GPU Operator is not installed) reads as
    an empty list.
  - Changes nothing.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - kubernetes >= 24.2.0 (the Python client, as for M(kubernetes.core.k8s_info))
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
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
    description: Read the GPU Operator's ClusterPolicies, and the DaemonSets of all namespaces to find NVIDIA's DRA kubelet plugin.
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
  configmap_namespaces:
    description:
      - Namespaces whose ConfigMaps are read. An empty string stands for the GPU Operator's namespace
        (C(status.namespace) of its ClusterPolicy, else V(gpu-operator)).
      - With O(operator), the operator's namespace is read too whenever a ClusterPolicy is found (its
        mig-manager's config lives there).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Read the cluster once for the whole batch
  gpuops.mig.mig_cluster_info:
    configmap_namespaces: [kube-system]
  delegate_to: localhost
  run_once: true
  register: cluster

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
daemonsets:
  description: The DaemonSets of NVIDIA's DRA kubelet plugin, in any namespace.
  returned: with O(operator)
  type: list
  elements: dict
nodes:
  description: The Node objects (C(status) only with O(node_status)).
  returned: with O(nodes)
  type: list
  elements: dict
configmaps:
  description: The ConfigMap objects read, by namespace.
  returned: always
  type: dict
  sample: {"gpu-operator": [{"kind": "ConfigMap", "metadata": {"name": "default-mig-parted-config"}}]}
operator_namespace:
  description: The GPU Operator's namespace (from its ClusterPolicy, else V(gpu-operator)).
  returned: always
  type: str
"""

import copy

from ansible_collections.kubernetes.core.plugins.module_utils.ansiblemodule import AnsibleModule
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.service import K8sService

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import is_dra_kubelet_plugin, trimmed

DEFAULT_OPERATOR_NAMESPACE = "gpu-operator"


def argument_spec():
    spec = copy.deepcopy(AUTH_ARG_SPEC)
    spec.update(
        operator=dict(type="bool", default=True),
        nodes=dict(type="bool", default=True),
        node_status=dict(type="bool", default=False),
        configmap_namespaces=dict(type="list", elements="str", default=[]),
    )
    return spec


def operator_namespace(cluster_policies):
    for policy in cluster_policies:
        namespace = (policy.get("status") or {}).get("namespace")
        if namespace:
            return namespace
    return DEFAULT_OPERATOR_NAMESPACE


def configmap_namespaces(requested, cluster_policies, operator_ns):
    """The namespaces to read ConfigMaps from, in a stable order, each once."""
    wanted = [namespace or operator_ns for namespace in requested]
    if cluster_policies:
        wanted.append(operator_ns)
    return sorted(set(wanted))


def read(service, params):
    def find(kind, api_version, namespace=None, keep_status=True):
        return [trimmed(obj, keep_status) for obj in service.find(kind, api_version, namespace=namespace)["resources"]]

    # What was not read is left out rather than returned empty: no ClusterPolicy read is not "no GPU Operator"
    # (site.yml then reads it itself before deciding whether to deploy a device plugin).
    result = dict(configmaps={})
    if params["operator"]:
        result["cluster_policies"] = find("ClusterPolicy", "nvidia.com/v1")
        result["daemonsets"] = [ds for ds in find("DaemonSet", "apps/v1", keep_status=False) if is_dra_kubelet_plugin(ds)]
    if params["nodes"]:
        result["nodes"] = find("Node", "v1", keep_status=params["node_status"])
    policies = result.get("cluster_policies") or []
    result["operator_namespace"] = operator_namespace(policies)
    for namespace in configmap_namespaces(params["configmap_namespaces"], policies, result["operator_namespace"]):
        result["configmaps"][namespace] = find("ConfigMap", "v1", namespace)
    return result


def main():
    module = AnsibleK8SModule(module_class=AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True)
    try:
        service = K8sService(get_api_client(module), module)
        module.exit_json(changed=False, **read(service, module.params))
    except CoreException as err:
        module.fail_from_exception(err)


if __name__ == "__main__":
    main()
