#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_config
short_description: Apply NVIDIA MIG geometry declaratively, keeping the devices that can stay
version_added: 0.1.0
description:
  - Sets the MIG devices (GPU instances and their compute instances) of each selected GPU from a
    mig-parted v1 config, or from inline per-GPU layouts.
  - Everything is validated before any GPU is touched (unknown profile for that GPU model, more
    instances than fit, a combination no placement can hold, an entry that selects no GPU, MIG
    disabled where devices are asked for); the error names the config, the entry and the GPU.
  - Per GPU it keeps every existing GPU instance the target can keep (with its MIG device UUIDs),
    destroys only what must go and creates the rest at explicit placements chosen so that
    everything fits. Among valid plans it prefers the one that destroys fewest devices, then the
    one that leaves the largest contiguous free range.
  - It never destroys a MIG device that has processes unless O(force=true); without it the module
    fails before any change, naming the GPU, the device and the PIDs.
  - A MIG device the kubelet allocated to a pod (O(read_allocations)) counts as busy too, even with
    no process on it; without O(force=true) the module fails before any change, naming the GPU, the
    device's UUID, and the pod (namespace/name) and container that hold it. When the kubelet's
    allocations cannot be read (no kubelet, no C(grpcio)) only processes count, as before, and
    RV(allocations_error) says why. On a node NVIDIA's DRA driver serves, the devices of the
    ResourceClaims given in O(dra_allocations) count the same way.
  - An NVML failure part-way leaves no half-made MIG device. A new GPU instance whose compute
    instances cannot all be created is destroyed again; a GPU instance that cannot be destroyed, or
    whose compute instances cannot be changed, gets back the compute instances already destroyed,
    at the same profiles and placements (new MIG device UUIDs). The message says so, or, when that
    fails too, names the GPU instance left short of compute instances; the next run converges from
    there (see docs/planner.md).
  - Inline layouts (O(layouts)) may pin GPU instances and their compute instances to exact
    placements, for example to restore the checkpoint M(gpuops.mig.mig_facts) exports (mig-parted's
    C(restore)). Pinned placements are checked against the GPU's possible placements before any
    change.
  - It does not change the MIG mode; use M(gpuops.mig.mig_mode) with the same config first. In
    check mode a GPU whose mode is not yet right is planned as if it were, and flagged with
    C(mode_mismatch).
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - nvidia-ml-py (import C(pynvml)) and PyYAML on the managed host
  - root, or the mig/config capability, on the managed host
extends_documentation_fragment:
  - gpuops.mig._attributes
  - gpuops.mig._attributes.ACTIONGROUP_MIG
  - gpuops.mig._config_source
  - gpuops.mig._driver
  - gpuops.mig._pod_resources
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  force:
    description:
      - Terminate (SIGTERM, then SIGKILL after O(force_timeout) seconds) processes on MIG devices
        the plan must destroy, instead of failing.
      - MIG devices allocated to pods are destroyed too; those pods are not evicted (drain them
        first).
    type: bool
    default: false
  force_timeout:
    description:
      - Seconds to wait after SIGTERM before SIGKILL when O(force=true).
      - A negative, NaN or infinite value fails the module before any change.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Apply a named config from the mig-parted file used with the GPU Operator
  gpuops.mig.mig_config:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-balanced

- name: Preview the plan without touching the GPUs
  gpuops.mig.mig_config:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-3g.20gb
  check_mode: true
  diff: true
  register: preview

- name: Inline layouts per GPU
  gpuops.mig.mig_config:
    layouts:
      - gpus: [0, 1]
        devices: {3g.40gb: 2}
      - gpus: [2]
        devices: {1g.10gb: 7}

- name: Pinned placements, one item per GPU instance (H100 80GB)
  gpuops.mig.mig_config:
    layouts:
      - gpus: [0]
        device_filter: "0x233010DE"
        devices:
          - profile: 3g.40gb
            placement: {start: 4, size: 4}
            compute_instances:
              - {profile: 2c.3g.40gb, placement: {start: 0}}
              - {profile: 1c.3g.40gb, placement: {start: 2}}
          - profile: 1g.10gb
            placement: {start: 0}
          - profile: 1g.10gb      # no placement: wherever the planner finds room

- name: Put back a checkpoint taken with mig_facts (MIG mode first, then the devices)
  gpuops.mig.mig_mode:
    layouts: "{{ saved_checkpoint }}"
- name: Restore the devices at their placements
  gpuops.mig.mig_config:
    layouts: "{{ saved_checkpoint }}"
"""

RETURN = r"""
gpus:
  description:
    - Per targeted GPU, C(index), C(uuid), C(name), C(entry) (which config entry selected it),
      C(mig_enabled), C(mode_mismatch), C(changed), C(target) (device name to count), C(plan)
      (C(keep), C(change), C(destroy), C(create) with placements, C(result), C(destroyed_devices),
      C(created_devices), C(evicted_pods) (the pods holding a device the plan destroys, with
      C(pod), C(reason) and C(devices); empty, since this module never destroys a device allocated
      to a pod)), C(done) (the steps carried out), and after a real run C(devices) (the resulting
      GPU instances with their MIG device UUIDs) and C(mig_devices) (device name to count).
  returned: always
  type: list
  elements: dict
skipped_gpus:
  description:
    - GPUs an entry selected but that are not MIG-capable (left alone).
    - Not called C(skipped), a key that would make Ansible treat the whole task as skipped.
  returned: always
  type: list
  elements: str
unmatched:
  description: Entries that selected no GPU on this host (for example a device-filter for another model).
  returned: always
  type: list
  elements: str
allocations:
  description:
    - Which pods hold which devices, as M(gpuops.mig.mig_node_info) returns it (read before
      planning); null when not read.
  returned: always
  type: list
  elements: dict
allocations_source:
  description: V(podresources), V(podresources+dra) or V(dra) (see O(dra_allocations)), or null when RV(allocations) was not read.
  returned: always
  type: str
allocations_error:
  description: Why RV(allocations) was not read (then only processes made a device busy); null when it was.
  returned: always
  type: str
failed_part_way:
  description: On a failure after changes began, per GPU what was done and what was not.
  returned: failure
  type: list
  elements: dict
refusals:
  description:
    - On a refusal before any change (the message begins C(Nothing was changed)), per refused GPU
      its C(gpu) index, C(message) and C(reason); V(allocated) when the only thing in the way is
      MIG devices that pods hold (C(devices), each with its C(uuid), C(device), C(pods) as
      C(namespace/pod/container)), V(other) for anything else (a device with processes, a target
      that does not fit, the MIG mode).
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils._common import (
    CONFIG_SOURCE_ARG_SPEC,
    CONFIG_SOURCE_EXCLUSIVE,
    DRIVER_ARG_SPEC,
    POD_RESOURCES_ARG_SPEC,
    allocations_of,
    nvml_session,
)
from ansible_collections.gpuops.mig.plugins.module_utils._input import seconds
from ansible_collections.gpuops.mig.plugins.module_utils._podresources import holders_by_device


def main():
    argument_spec = dict(
        force=dict(type="bool", default=False),
        force_timeout=dict(type="float", default=10),
    )
    argument_spec.update(CONFIG_SOURCE_ARG_SPEC)
    argument_spec.update(DRIVER_ARG_SPEC)
    argument_spec.update(POD_RESOURCES_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=CONFIG_SOURCE_EXCLUSIVE,
                           required_one_of=CONFIG_SOURCE_EXCLUSIVE)
    p = module.params
    # Read before planning: a device a pod holds is kept like one with processes.
    allocations = allocations_of(module)
    with nvml_session(module, **allocations) as nvml:
        seconds(p["force_timeout"], "force_timeout")
        entries = host_layout.load_entries(p["config"], p["config_file"], p["config_name"], p["layouts"])
        resolution, gpus = host_layout.resolve(nvml, entries, p["allow_unmatched"])
        # force destroys a device a pod holds too (the pod is not evicted; the rollout evicts
        # first).
        work = host_layout.plan_host(nvml, resolution, gpus, p["force"], module.check_mode, evict_pods=p["force"],
                                     holders=holders_by_device(allocations["allocations"]))
        if not module.check_mode:
            host_layout.apply_host(nvml, work, p["force_timeout"], destroy_allocated=p["force"])
            host_layout.reread(nvml, work)
        result = dict(
            changed=any(host_layout.item_changed(item) for item in work),
            gpus=host_layout.report(work),
            skipped_gpus=["%s (%s)" % (gpu.label, entry.label) for gpu, entry in resolution.skipped],
            unmatched=[entry.label for entry in resolution.unmatched],
            **allocations
        )
        if module._diff:
            result["diff"] = host_layout.diff(work, module.check_mode)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
