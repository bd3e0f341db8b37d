#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_facts
short_description: Gather NVIDIA GPU and MIG facts through NVML
version_added: 0.1.0
description:
  - Reads, through NVML (C(pynvml) from C(nvidia-ml-py)), every GPU's identity, MIG capability,
    current and pending MIG mode, GPU instances with their compute instances, MIG device UUIDs and
    processes, and the MIG profiles the GPU supports with their possible placements.
  - Results land in C(ansible_facts.gpuops_mig).
  - With O(checkpoint=true) it also exports the exact MIG layout (every GPU instance and compute instance
    at its placement) as inline layouts that M(gpuops.mig.mig_config) takes back, to put a node back as it
    was, for example after a reboot (mig-parted's C(checkpoint) and C(restore)).
  - Works on hosts without a MIG-capable GPU, and on hosts without an NVIDIA driver, where it reports
    C(driver.present=false) instead of failing unless O(fail_on_missing_driver=true).
  - Fails on a host whose Python (the one Ansible runs there) cannot import C(pynvml), and says so. Without
    C(nvidia-ml-py) nothing about the GPUs can be known, so it does not report a host without GPUs.
    M(gpuops.mig.mig_preflight) can install it (C(mig_preflight_install_nvml=true)).
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - nvidia-ml-py (import C(pynvml)) on the managed host
  - an NVIDIA driver on the managed host
extends_documentation_fragment:
  - gpuops.mig._attributes
  - gpuops.mig._attributes.ACTIONGROUP_MIG
  - gpuops.mig._attributes.FACTS
  - gpuops.mig._gpu_selection
  - gpuops.mig._driver
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  profiles:
    description:
      - Include, per MIG-capable GPU, the GPU-instance profiles it supports and their placements.
    type: bool
    default: true
  checkpoint:
    description:
      - Also return C(ansible_facts.gpuops_mig.checkpoint), the exact layout of the selected MIG-capable GPUs
        in the form of the O(gpuops.mig.mig_config#module:layouts) option, with every placement pinned.
      - Give it back with O(gpuops.mig.mig_config#module:layouts) (and O(gpuops.mig.mig_mode#module:layouts)
        first, for the MIG mode) to restore the same devices at the same placements.
    type: bool
    default: false
  fail_on_missing_driver:
    description:
      - Fail when no NVIDIA driver is found, instead of reporting it as a fact (a missing C(nvidia-ml-py) always
        fails).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Read the MIG layout of every GPU
  gpuops.mig.mig_facts:

- name: Show MIG devices of GPU 0
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpuops_mig.gpus[0].gpu_instances }}"

- name: Record the exact MIG layout (checkpoint)
  gpuops.mig.mig_facts:
    checkpoint: true

- name: Keep it on the controller
  ansible.builtin.copy:
    content: "{{ ansible_facts.gpuops_mig.checkpoint | to_nice_yaml }}"
    dest: "checkpoints/{{ inventory_hostname }}.yml"
    mode: "0644"
  delegate_to: localhost

- name: Later, restore it (after a reboot the MIG devices are gone)
  gpuops.mig.mig_config:
    layouts: "{{ lookup('ansible.builtin.file', 'checkpoints/' ~ inventory_hostname ~ '.yml') | from_yaml }}"

- name: Only H100 80GB GPUs, without the profile catalogue
  gpuops.mig.mig_facts:
    gpus: ["0x233010DE"]
    profiles: false
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    gpuops_mig:
      description: The host's GPUs and their MIG state.
      returned: always
      type: dict
      contains:
        driver:
          description:
            - Driver presence and versions (C(present), C(version), C(cuda_version), C(nvml_version), C(error)),
              and where it was found (C(root) null for the host's own driver, else the driver root such as
              C(/run/nvidia/driver); C(library) the C(libnvidia-ml.so.1) loaded).
          type: dict
          returned: always
          sample: {present: true, version: "570.124.06", cuda_version: "12.8", nvml_version: "12.570.124.06",
                   root: null, library: libnvidia-ml.so.1, error: null}
        simulated:
          description: Whether the GPUs are simulated (E(GPUOPS_MIG_SIMULATE) is set).
          type: bool
          returned: always
        gpu_count:
          description: Number of GPUs reported (after selection).
          type: int
          returned: always
        mig_capable_count:
          description: Number of MIG-capable GPUs among them.
          type: int
          returned: always
        gpus:
          description:
            - One entry per selected GPU with C(index), C(uuid), C(name), C(pci_bus_id), C(pci_device_id),
              C(memory_total_mib), C(architecture), C(compute_capability), C(mig_capable),
              C(mig_mode) (C(current) and C(pending), V(enabled) or V(disabled); null if not MIG-capable),
              C(mig_enabled), C(mig_mode_persists_across_reboot), C(gpu_instances) (C(id), C(profile),
              C(profile_id), C(placement), C(compute_instances) with C(id), C(profile), C(profile_id),
              C(placement), C(mig_device_uuid) and C(processes)), C(mig_devices) (device name to count),
              C(processes) and C(supported_profiles) (C(name), C(id), C(sm_slices), C(memory_slices),
              C(max_count), C(memory_mib), C(placements)).
          type: list
          elements: dict
          returned: always
        checkpoint:
          description:
            - The exact layout of the selected MIG-capable GPUs, as a value for the O(gpuops.mig.mig_config#module:layouts)
              option. One item per GPU with C(gpus) (its index), C(device_filter) (its PCI device ID, so the
              item selects nothing if another GPU model is at that index), C(mig_enabled) (the current mode) and,
              when MIG is enabled, C(devices), a list with one entry per GPU instance ordered by placement,
              C(profile), C(placement) (C(start) and C(size) in memory slices) and, unless the GPU instance has
              one compute instance spanning it, C(compute_instances) (C(profile) and C(placement) in SM slices).
            - GPU instances without a compute instance hold no MIG device and are left out.
          type: list
          elements: dict
          returned: when O(checkpoint=true)
          sample:
            - gpus: [0]
              device_filter: "0x233010DE"
              mig_enabled: true
              devices:
                - {profile: 3g.40gb, placement: {start: 0, size: 4},
                   compute_instances: [{profile: 1c.3g.40gb, placement: {start: 0, size: 1}},
                                       {profile: 2c.3g.40gb, placement: {start: 1, size: 2}}]}
                - {profile: 1g.10gb, placement: {start: 6, size: 1}}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils._common import (
    DRIVER_ARG_SPEC,
    GPU_SELECTION_ARG_SPEC,
    fail_from,
)
from ansible_collections.gpuops.mig.plugins.module_utils._errors import DriverNotFound, GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_selection import select_gpus
from ansible_collections.gpuops.mig.plugins.module_utils._host_layout import checkpoint_layouts
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    Nvml,
    facts_without_driver,
    mig_device_counts,
    missing_driver_message,
)


def gather(nvml_session, selectors, with_profiles, checkpoint=False):
    """The facts; a missing driver is a fact (driver.present false), other errors raise (a missing
    nvidia-ml-py too: a Python that cannot import pynvml knows nothing about the GPUs)."""
    facts = facts_without_driver(None, nvml_session.simulate)
    if checkpoint:
        facts["checkpoint"] = []
    try:
        with nvml_session as nvml:
            facts["driver"].update(present=True, version=nvml.driver_version(), root=nvml.driver.root,
                                   library=nvml.driver.library, cuda_version=nvml.cuda_driver_version(),
                                   nvml_version=nvml.nvml_version())
            identities = [nvml.gpu(i) for i in range(nvml.gpu_count())]
            for gpu in select_gpus(identities, selectors):
                info = nvml.describe(gpu["index"])
                if not with_profiles:
                    info.pop("supported_profiles")
                info["mig_devices"] = mig_device_counts(info["gpu_instances"])
                facts["gpus"].append(info)
            if checkpoint:
                facts["checkpoint"] = checkpoint_layouts(facts["gpus"])
    except DriverNotFound as e:
        facts["driver"].update(present=False, error=missing_driver_message(e))
        return facts
    facts["gpu_count"] = len(facts["gpus"])
    facts["mig_capable_count"] = sum(1 for g in facts["gpus"] if g["mig_capable"])
    return facts


def main():
    argument_spec = dict(
        profiles=dict(type="bool", default=True),
        checkpoint=dict(type="bool", default=False),
        fail_on_missing_driver=dict(type="bool", default=False),
    )
    argument_spec.update(GPU_SELECTION_ARG_SPEC)
    argument_spec.update(DRIVER_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    try:
        facts = gather(Nvml(driver_root=p["driver_root"]), p["gpus"], p["profiles"], p["checkpoint"])
    except GpuopsError as e:
        fail_from(module, e)
    if not facts["driver"]["present"] and p["fail_on_missing_driver"]:
        module.fail_json(msg="No usable NVIDIA driver on this host: %s" % facts["driver"]["error"],
                         ansible_facts={"gpuops_mig": facts})
    module.exit_json(changed=False, ansible_facts={"gpuops_mig": facts})


if __name__ == "__main__":
    main()
