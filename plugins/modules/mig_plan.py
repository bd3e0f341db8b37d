#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_plan
short_description: Plan the MIG layout of a fleet from demand, on the controller
version_added: 0.1.0
description:
  - Plans per node the MIG layout that meets a demand for MIG devices with the least disruption, from the
    facts M(gpuops.mig.mig_facts) gathered on every node. Nothing on any host is changed; it runs on the
    controller (an action plugin) and needs no connection.
  - "Objectives in order: meet the demand (as much as fits); never destroy a busy MIG device (one with
    processes); touch the fewest nodes (each touched node is drained); destroy the fewest MIG devices; keep free
    memory slices in large contiguous ranges."
  - Exact (a dynamic program over every reachable layout of every GPU) while the search stays within
    O(exact_limit); beyond it a greedy set multicover over nodes, whose report gives a lower bound on the nodes
    any plan must touch. See docs/planning.md.
  - Returns the layouts as inline layouts (what O(gpuops.mig.mig_config#module:layouts) and the roles accept)
    and as a mig-parted v1 config per node, the vars that C(playbooks/site.yml -e @file) applies, a report
    and a table for people.
  - Before the plan is returned, each node's layouts and mig-parted config are read with the
    parser M(gpuops.mig.mig_config) uses and resolved on the node's GPUs, and its config label is
    checked as a Kubernetes label value; a plan the modules would refuse is never returned (the
    task fails saying why). Facts that list a GPU index twice on one node fail the task.
  - "Arguments may come from a literal, play vars, C(group_vars), extra vars or a template (ansible-core 2.19's
    tagged values included). Odd input fails the task naming the option and showing what it got, and nothing is
    planned. A scalar where a list or a mapping is expected fails (C(demand: 5), C(hosts: gpu-a),
    C(policy: \"nodes=a\")). docs/planning.md lists every limit."
author:
  - gpuops.mig contributors (@gpuops)
extends_documentation_fragment:
  - gpuops.mig._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
  action:
    description: Runs on the controller as an action plugin.
    support: full
options:
  demand:
    description:
      - "Free MIG devices wanted beyond what running pods hold. A mapping of MIG device name to count
        (C({\"1g.10gb\": 12})), or a list of items."
      - "An item is C(profile) (a MIG device name) or a size: C(memory_gib) with C(compute_slices) (default 1),
        mapped per GPU model to its smallest fitting base profile. C(count) (default 1). Optionally C(group)
        (an inventory group, see O(node_groups)) or C(nodes) (a list of inventory hosts) that must supply it."
      - An unknown profile, a size no GPU has, or a count that is not a non-negative integer (or a string of up to
        18 ASCII digits, with no sign and no white space) fails the task; so do C(memory_gib)
        that is not a finite number above 0 and at most 1048576, C(compute_slices) not an integer
        from 1 to 64, and a C(strict) or C(spare) that is not a boolean.
      - A count beyond what the fleet can hold is not an error; the report shows it unmet.
    type: raw
  pods:
    description:
      - Pod manifests (the C(resources) of M(kubernetes.core.k8s_info)). Unscheduled pods that are not finished
        add demand; pods bound to a node count as devices in use there (the plan keeps at least that many of the
        profile on the node).
      - C(spec), C(status) and each container's C(resources), C(limits), C(requests) must be mappings,
        C(spec.containers) a list, C(spec.nodeName) a string and a MIG or GPU quantity a whole number.
      - A pod asking for a profile no GPU offers is reported under C(report.unresolved), never dropped.
    type: list
    elements: dict
  claims:
    description:
      - ResourceClaim manifests (the C(resources) of M(kubernetes.core.k8s_info), C(resource.k8s.io/v1) or
        C(v1beta1)) for NVIDIA's DRA driver. A claim not yet allocated whose request asks the DeviceClass
        C(mig.nvidia.com) for an exact count adds that many of the profile its CEL selector names
        (C(device.attributes['gpu.nvidia.com'].profile == '1g.10gb')); one without a single profile is reported
        under C(report.unresolved). Allocated claims add nothing.
    type: list
    elements: dict
    version_added: 0.2.0
  workloads:
    description:
      - Kueue Workload manifests (the C(resources) of M(kubernetes.core.k8s_info), C(kueue.x-k8s.io/v1beta2) or
        C(v1beta1)). A Workload waiting for admission (condition C(Admitted) not C(True), not C(Finished), not
        deactivated, not being deleted) has no pods yet, so each of its C(spec.podSets) adds C(count) pending pods of
        its C(template), read as O(pods) reads pending pods (C(nvidia.com/mig-<profile>) and C(nvidia.com/gpu),
        the strategy and sharing applied).
      - Admitted Workloads add nothing (their pods are in O(pods)), nor do Workloads owned by a Pod (Kueue's pod
        integration, whose pods exist already).
      - A Workload that cannot be read (a C(count) or a quantity that is not a whole number, a part that is not
        a mapping) is skipped with a warning naming it, and the plan goes on without it.
    type: list
    elements: raw
    version_added: 0.2.0
  strategy:
    description:
      - The device plugin's MIG strategy. V(mixed) reads C(nvidia.com/mig-<profile>) (C(.) stands for C(+));
        C(nvidia.com/gpu) is a whole GPU (pending ones are kept free as whole GPUs).
        V(single) reads C(nvidia.com/gpu) as a MIG device (see O(single_profile)).
    type: str
    default: mixed
    choices: [mixed, single]
  single_profile:
    description:
      - Under O(strategy=single), the profile of a pending pod whose nodeSelector C(nvidia.com/gpu.product)
        does not name one (C(<model>-MIG-<profile>)). Without it such pods are unresolved. Not empty.
    type: str
  sharing:
    description:
      - "How the device plugin time-slices MIG devices, as the mig_node role's C(mig_node_sharing)
        (C({profile: {replicas: n, ...}}) or C(none)). A pod's request for a time-sliced profile, or for
        its C(.shared) resource, counts replicas; C(replicas) of them fit on one device."
      - A request for a C(.shared) resource of a profile not listed here is unresolved.
    type: raw
  hosts:
    description:
      - Inventory hosts whose C(ansible_facts.gpuops_mig) form the fleet. Default the play's hosts.
      - A host without those facts (unreachable, failed) fails the task unless O(policy) has C(skip_unreachable).
      - Mutually exclusive with O(fleet).
    type: list
    elements: str
  fleet:
    description:
      - "The fleet given directly, C({host: gpuops_mig facts}). Mutually exclusive with O(hosts)."
    type: dict
  policy:
    description:
      - C(nodes) (list) the only nodes that may be touched; C(spare) (mapping of profile to count) free devices to
        keep beyond the demand (ranked below the demand); C(whole_gpus) (int) GPUs with MIG off to keep free
        (the plan never takes them below this, nor below what is free now); C(skip_unreachable) (bool) plan without
        nodes that gave no facts.
      - Another key, C(nodes) not a list of strings, a count that is not a non-negative integer, or a
        C(skip_unreachable) that is not a boolean (the string V(false) included) fails the task.
    type: dict
    default: {}
  node_groups:
    description:
      - "Groups for demand items with C(group), C({name: [hosts]}), each a list of host names. Default the
        inventory's groups."
    type: dict
  allocations:
    description:
      - Which pod holds which MIG device on each node, as M(gpuops.mig.mig_node_info) returns it (its registered
        result, with C(allocations) and C(allocations_error)), per inventory host.
      - A device a pod holds counts as busy, like one running processes, so the plan keeps it (and a node's
        other devices of that profile may be reshaped). Each node of the plan then says what its change evicts
        (C(evicted_pods), C(evictions)); a node whose map could not be read has C(pod_map_unknown), why.
      - Leave it out to plan from processes and pod counts only (no node says what it evicts).
    type: dict
    version_added: 0.2.0
  k8s_node_names:
    description: Kubernetes node name to inventory host, where they differ (strings).
    type: dict
    default: {}
  exact_limit:
    description:
      - Work bound (DP relaxations) for the exact search before the heuristic takes over.
      - C(0) runs the heuristic at once. A negative value fails the task.
    type: int
    default: 400000
  config_label_prefix:
    description:
      - Prefix of each node's config name (the rest is C(-) and a 10-digit digest of its layouts); the rollout puts
        the name in the node's C(nvidia.com/mig.config) label.
      - 1 to 52 letters, digits, C(-), C(_) or C(.), starting with a letter or a digit; anything else fails the task.
    type: str
    default: gpuops-plan
seealso:
  - module: gpuops.mig.mig_facts
  - module: gpuops.mig.mig_config
  - module: gpuops.mig.mig_generate_config
"""

EXAMPLES = r"""
- name: Plan twelve 1g.10gb and four 3g.40gb devices, touching only the inference nodes
  gpuops.mig.mig_plan:
    demand: {"1g.10gb": 12, "3g.40gb": 4}
    policy:
      nodes: "{{ groups['inference'] }}"
      whole_gpus: 2
  register: plan

- name: Demand from the pending pods, by size on one group
  gpuops.mig.mig_plan:
    demand:
      - {memory_gib: 20, compute_slices: 2, count: 3, group: training}
    pods: "{{ pods.resources }}"
"""

RETURN = r"""
plan:
  description:
    - Per node C(layouts), C(config_label), C(touched), C(gpus) (before, after, destroyed, created) and
      C(supplies); C(report); C(mig_parted) (a v1 config per node).
    - With O(allocations), per node C(evicted_pods) (C(namespace/name) of the pods its change evicts, which are those
      on a GPU whose MIG mode changes and GPU pods the kubelet lists no device for yet) and C(evictions) (each
      C(pod), C(reason), C(detail)); or C(pod_map_unknown), why the node's pod map is not known.
  returned: success
  type: dict
vars:
  description:
    - What C(site.yml -e @file) reads. C(gpuops_mig_plan) with C(version) 1, C(nodes) (per inventory host
      C(layouts), C(config_label), C(touched)) and C(report).
  returned: success
  type: dict
report:
  description:
    - C(demand) rows (requested, met, unmet, reason), C(unresolved) requests, C(demand_met), C(unmet_devices),
      C(nodes_touched), C(devices_destroyed), C(devices_created), C(busy_devices_kept), C(gpus_left_whole),
      C(skipped_nodes), C(notes), C(method) (exact or greedy) and, for greedy, C(nodes_touched_lower_bound).
  returned: success
  type: dict
table:
  description: The plan as lines of text.
  returned: success
  type: list
  elements: str
mig_parted:
  description: Per node a mig-parted v1 config whose one config, named by the node's C(config_label), is the plan.
  returned: success
  type: dict
"""
