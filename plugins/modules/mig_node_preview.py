#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_node_preview
short_description: Read a node once, check it can take part in a MIG rollout, and decide what the rollout does to it
version_added: 0.2.0
description:
  - The read-only first step of the M(gpuops.mig.mig_node) role (and the whole of M(gpuops.mig.mig_preflight)),
    as one task. It runs M(gpuops.mig.mig_node_info) on the node once, then decides on the controller, in Python,
    the preflight checks (driver present and recent enough for every GPU model, MIG-capable GPUs,
    C(nvidia-ml-py) importable, the NVIDIA Container Toolkit), where the layout comes from (inline, a mig-parted
    config or file, a ConfigMap of the cluster, a plan from C(playbooks/plan.yml)), and the node's path,
    V(converged), V(reconfigure) (the collection's modules change the GPUs) or V(mig-manager) (the GPU
    Operator's mig-manager does).
  - Nothing changes, except that with O(preflight.install_nvml=true) a missing C(nvidia-ml-py) is installed with
    M(ansible.builtin.pip) and the node read again.
  - Built for the roles; its messages name the role variables its options come from (C(mig_node_*),
    C(mig_preflight_*)). The Kubernetes objects it decides on are read by the role once per batch with
    M(gpuops.mig.mig_cluster_info) and passed in.
  - As a task of a role with C(meta/argument_specs.yml), it first checks the role's variables against the
    role's argument spec (entry point C(main)), as Ansible's own role validation does, and fails naming the
    host when one is wrong. A play can then import the role with C(rolespec_validate=false) and spare every
    node that separate task, as C(playbooks/site.yml) does.
author:
  - gpuops.mig contributors (@gpuops)
extends_documentation_fragment:
  - gpuops.mig._attributes
attributes:
  check_mode:
    support: full
    details: Read-only; the same in check mode (a pip install is only reported).
  diff_mode:
    support: none
  idempotent:
    support: full
  action:
    description: An action plugin on the controller that runs M(gpuops.mig.mig_node_info) on the node.
    support: full
options:
  decide:
    description: V(false) checks the node only (what M(gpuops.mig.mig_preflight) does); no layout is needed.
    type: bool
    default: true
  role_variables:
    description:
      - Take every setting below that the task does not give from the variables of the M(gpuops.mig.mig_node) role
        the task runs in, as the role's argument spec checks and types them (C(mig_node_kubernetes),
        C(mig_node_k8s_node_name), C(mig_node_config), C(mig_node_config_file), C(mig_node_layouts),
        C(mig_node_config_configmap), C(mig_node_config_configmap_key),
        C(mig_node_config_name), C(mig_node_config_from_label), C(mig_node_allow_unmatched), C(mig_node_force),
        C(mig_node_mig_strategy), C(mig_node_operator_mode), C(mig_node_reboot_method), C(mig_node_reboot_command),
        C(mig_node_driver_root), C(mig_node_drain), C(mig_node_pod_resources_socket),
        C(mig_node_persist_root) as O(host_root), C(mig_node_sharing), C(mig_node_device_plugin_config_map),
        C(mig_node_device_plugin_config_name),
        C(mig_node_dynamic_take_back), C(mig_node_gpu_clients),
        C(mig_node_operand_components), and O(restore) from
        C(mig_node_persist*) and C(mig_node_reset_gpus)); an empty string counts as not set.
      - The role's own task uses it, so that the role's variables are templated once per node, for the check and
        the settings together.
      - Fails outside the M(gpuops.mig.mig_node) role.
    type: bool
    default: false
  kubernetes:
    description: The host is a Kubernetes node (O(nodes) must hold it).
    type: bool
    default: false
  k8s_node_name:
    description: The host's Kubernetes node name. Defaults to the inventory hostname.
    type: str
  nodes:
    description: The Kubernetes Node objects (from M(kubernetes.core.k8s_info), read once for the batch).
    type: list
    elements: dict
    default: []
  cluster_policies:
    description: The GPU Operator's ClusterPolicy objects (none without the operator).
    type: list
    elements: dict
    default: []
  gpu_clusters:
    description:
      - The GPU Operator's GPUCluster objects (C(nvidia.com/v1alpha1), its DRA stack, which runs no mig-manager).
        Where there is no ClusterPolicy, a node under a GPUCluster gets a static layout applied by the collection;
        a GPUCluster with the C(DynamicMIG) feature gate is refused.
    type: list
    elements: dict
    default: []
    version_added: 0.2.0
  daemonsets:
    description: The cluster's DaemonSets, where NVIDIA's DRA kubelet plugin is looked for.
    type: list
    elements: dict
    default: []
  configmaps:
    description: The ConfigMap objects that may hold the MIG config, per namespace (a dict of namespace to list of ConfigMaps).
    type: dict
    default: {}
  config:
    description: A mig-parted config (text or data), from C(mig_node_config); empty is not set.
    type: raw
    default: {}
  config_file:
    description: A mig-parted file on the controller (found as the file lookup finds it), from C(mig_node_config_file).
    type: path
    default: ""
  layouts:
    description: Inline layouts, as M(gpuops.mig.mig_config) takes them, from C(mig_node_layouts).
    type: list
    elements: dict
    default: []
  configmap:
    description:
      - The ConfigMap that holds the config (else the GPU Operator's), from C(mig_node_config_configmap),
        written C([namespace/]name); without a namespace, the GPU Operator's, else C(gpu-operator).
    type: str
    default: ""
  configmap_key:
    description: The ConfigMap key that holds the config.
    type: str
    default: config.yaml
  plan:
    description: This node's entry of a plan from C(playbooks/plan.yml) (C(layouts), C(config_label)); it wins.
    type: dict
  config_name:
    description: The config of a mig-parted config to apply; empty takes the node's C(nvidia.com/mig.config) label.
    type: str
    default: ""
  config_from_label:
    description: Take the config name from the node's C(nvidia.com/mig.config) label when O(config_name) is empty.
    type: bool
    default: true
  allow_unmatched:
    description: As M(gpuops.mig.mig_config)'s O(gpuops.mig.mig_config#module:allow_unmatched).
    type: bool
    default: false
  force:
    description:
      - Plan as M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config) will apply with O(gpuops.mig.mig_config#module:force=true),
        so that MIG devices with processes that must go are planned to be destroyed instead of refusing the node.
      - From C(mig_node_force).
    type: bool
    default: false
  strategy:
    description: The declared MIG strategy (V(none), V(single), V(mixed)); empty takes the GPU Operator's, else V(mixed).
    type: str
    choices: ["", none, single, mixed]
    default: ""
  operator_mode:
    description:
      - On a GPU Operator node, V(auto), V(mig-manager) or V(takeover) (see the M(gpuops.mig.mig_node) role).
      - V(dynamic-dra) and V(dynamic-hami) hand the node to a dynamic MIG partitioner (with or without the
        GPU Operator), NVIDIA's DRA driver with its C(DynamicMIG) feature gate or HAMi's device plugin in its
        C(mig) operating mode. The layout is then MIG mode on with no MIG device, whatever layout source is
        set. The partitioner's DaemonSet is looked for in O(daemonsets) and must have a nodeSelector.
    type: str
    choices: [auto, mig-manager, takeover, dynamic-dra, dynamic-hami]
    default: auto
  dynamic_take_back:
    description:
      - A node this collection handed to a dynamic partitioner (annotation C(gpuops.mig/handed-off)) is left alone
        by a static run unless this is true; then it is taken back (the partitioner's plugin sent away and its
        devices gone, mig-manager's deploy label as before the hand-off) and the static layout decided for it.
    type: bool
    default: false
  cordoned_annotation:
    description: The annotation with which the collection marks a node it cordoned.
    type: str
    default: gpuops.mig/cordoned
  reboot_method:
    description: Checked here so that a bad setting stops the rollout before any change.
    type: str
    choices: [reboot, command]
    default: reboot
  reboot_command:
    description: Must be set for O(reboot_method=command).
    type: str
    default: ""
  restore:
    description: The boot-time restore to compare with the installed one (M(gpuops.mig.mig_node_info)'s O(gpuops.mig.mig_node_info#module:restore)).
    type: dict
  driver_root:
    description: Where the NVIDIA driver is (V(auto), V(/) or a driver container's root).
    type: str
    default: auto
  drain:
    description:
      - Which pods the change evicts, said in the decision (C(drain)) and the summary. V(devices) (V(true)) only the
        pods holding MIG devices the plan destroys or sitting on GPUs whose mode changes, where the kubelet's
        allocations could be read, else the whole node; V(node) every pod a whole-node drain takes; V(none) (V(false))
        none. Outside Kubernetes, V(none).
    type: raw
    default: true
  pod_resources_socket:
    description: The kubelet's PodResources socket on the node.
    type: str
    default: /var/lib/kubelet/pod-resources/kubelet.sock
  lease:
    description:
      - The node's Lease (C(gpuops-mig-<node>), as M(gpuops.mig.mig_cluster_info) reads it), if any. One whose
        holder stopped renewing it is released by this run (the decision's C(steady_work) has C(lease)).
      - An owed record (C(gpuops.mig/owed)) on a Kubernetes node is acted on only when its run is
        the one this Lease names (its holder, or its last holder once released); else the node is
        refused.
    type: dict
  gpu_clients:
    description:
      - The host services a rollout stops (C(mig_node_gpu_clients)). An owed record that names
        another service refuses the node; nothing in it is started.
    type: list
    elements: str
    default: [nvsm.service, nvsm-mqtt.service, nvsm-core.service, nvsm-api-gateway.service,
              nvsm-notifier.service, nv_peer_mem.service, nvidia-dcgm.service, dcgm.service,
              dcgm-exporter.service]
    version_added: 0.2.0
  operand_components:
    description:
      - The C(nvidia.com/gpu.deploy.*) components a rollout pauses
        (C(mig_node_operand_components)). An owed record that names another label refuses the
        node; no label in it is set.
    type: list
    elements: str
    default: [device-plugin, gpu-feature-discovery, dcgm-exporter, dcgm, nvsm, client]
    version_added: 0.2.0
  dra_allocations:
    description:
      - Where NVIDIA's DRA driver serves the node, which pod holds which device from its ResourceClaims, as
        M(gpuops.mig.mig_cluster_info) returns it for the node (RV(gpuops.mig.mig_cluster_info#module:dra_allocations));
        handed to M(gpuops.mig.mig_node_info), where it joins the kubelet's answer. Only with Kubernetes.
    type: dict
    version_added: 0.2.0
  host_root:
    description:
      - The host's root (the mig_node role's C(mig_node_persist_root)); empty means C(/).
      - On a host outside Kubernetes, a rollout records what it must put back in
        C(var/lib/gpuops-mig/owed.json) under it; a record left by a run that did not finish is
        repaired first (the decision's C(repair)). Its hold is C(run/gpuops-mig/lock) there
        (RV(host_files)).
    type: str
    default: ''
  sharing:
    description:
      - "How the device plugin time-slices the layout's MIG devices: C({profile: {strategy, replicas, rename,
        fail_requests_greater_than_one}}) or V(none) (the mig_node role's C(mig_node_sharing)). Checked against the
        layout, the MIG strategy and the device plugin's config ConfigMap (RV(sharing))."
    type: raw
    default: {}
  device_plugin_config_map:
    description:
      - The ConfigMap the device plugin reads its per-node configs from (without the GPU Operator), as
        C([namespace/]name); no namespace, the GPU Operator's. Under the GPU Operator its ClusterPolicy's
        C(devicePlugin.config.name).
    type: str
    default: ""
  device_plugin_config_name:
    description:
      - The entry of that ConfigMap for the node (the C(nvidia.com/device-plugin.config) label). With O(sharing),
        the entry written (empty, C(gpuops-mig-<digest of its content>)); without, an existing entry, whose
        time-slicing validation then expects.
    type: str
    default: ""
  preflight:
    description: The preflight checks; left out, only a missing driver or C(nvidia-ml-py) fails the node.
    type: dict
    suboptions:
      require_mig_capable:
        description: Fail a node without MIG-capable GPUs.
        type: bool
        default: true
      min_driver_versions:
        description: The minimum driver per GPU model, a list of C(pattern) and C(version); the first matching pattern applies.
        type: list
        elements: dict
        default: []
      container_toolkit_command:
        description: Prints the NVIDIA Container Toolkit's version; empty skips the toolkit check.
        type: str
        default: ""
      container_toolkit_min_version:
        description: The oldest toolkit accepted.
        type: str
        default: "0"
      install_nvml:
        description: Install O(preflight.nvml_package) with pip when C(import pynvml) fails.
        type: bool
        default: false
      nvml_package:
        description: The pip requirement that provides C(pynvml).
        type: str
        default: nvidia-ml-py
      pip_extra_args:
        description: Extra pip arguments.
        type: str
        default: ""
"""

EXAMPLES = r"""
- name: Check a GPU host, as the mig_preflight role does
  gpuops.mig.mig_node_preview:
    decide: false
    preflight:
      min_driver_versions: [{pattern: H100, version: 525.85.12}]
  register: check

- name: What would the rollout do to a host outside Kubernetes?
  gpuops.mig.mig_node_preview:
    layouts:
      - gpus: all
        devices: {3g.40gb: 2}
  register: preview

- name: Say it
  ansible.builtin.debug:
    msg: "{{ preview.decision.path }}: {{ preview.msg }}"
"""

RETURN = r"""
msg:
  description: The decision in one sentence (with O(decide=false), the preflight's line).
  returned: success
  type: str
ready:
  description: The preflight's line, for example C(gpu-1 driver 570.124.06, 2 MIG-capable GPU(s) of 2 (NVIDIA H100 80GB HBM3).).
  returned: success
  type: str
facts:
  description: The driver and GPUs, as M(gpuops.mig.mig_facts) reports them (without profiles).
  returned: always
  type: dict
container_toolkit:
  description: The toolkit check's result (M(gpuops.mig.mig_node_info)'s RV(gpuops.mig.mig_node_info#module:container_toolkit)).
  returned: success
  type: dict
problems:
  description: Why the node cannot take part, one message each.
  returned: failure
  type: list
  elements: str
decision:
  description:
    - The path (C(path)), the MIG mode and geometry changes, the strategy and operator mode, the labels a converged
      node still needs (C(converged_labels)), what a converged node still has to put right (C(steady_work)), and
      a C(summary). See C(plugins/plugin_utils/_node_decision.py).
  returned: success and O(decide=true)
  type: dict
host_files:
  description:
    - "Where a host outside Kubernetes keeps its records, under O(host_root): C(lock), the hold of
      M(gpuops.mig.mig_node_lease) (O(gpuops.mig.mig_node_lease#module:lock_file)), and C(owed), what a
      rollout must put back."
  returned: success
  type: dict
  sample: {lock: /run/gpuops-mig/lock, owed: /var/lib/gpuops-mig/owed.json}
info:
  description: M(gpuops.mig.mig_node_info)'s result without RV(facts).
  returned: success and O(decide=true)
  type: dict
source:
  description: The layout as the modules take it (C(config) or C(layouts), and C(origin) when it has one).
  returned: success and O(decide=true)
  type: dict
source_kind:
  description: Where the layout came from (C(mig_node_config), C(mig_node_config_file), C(mig_node_layouts), C(configmap), C(gpuops_mig_plan)).
  returned: success and O(decide=true)
  type: str
config_name:
  description: The config name applied (empty for inline layouts).
  returned: success and O(decide=true)
  type: str
config_label:
  description: The name the node's C(nvidia.com/mig.config) label gets.
  returned: success and O(decide=true)
  type: str
node:
  description: The Kubernetes Node object (null outside Kubernetes).
  returned: success and O(decide=true)
  type: dict
labels:
  description: The node's labels.
  returned: success and O(decide=true)
  type: dict
operator:
  description: What the GPU Operator manages on the node (C(present) false without it), and NVIDIA's DRA driver (C(dra)).
  returned: success and O(decide=true)
  type: dict
sharing:
  description:
    - The device plugin's config for the node's layout - C(managed) false when neither O(sharing) nor
      O(device_plugin_config_name) is set; else C(policy) (the shared profiles), C(entry), C(configmap),
      C(namespace), C(data) (entries to write) and C(label) (the C(nvidia.com/device-plugin.config) value to
      set, null when the node has it).
  returned: success and O(decide=true)
  type: dict
"""
