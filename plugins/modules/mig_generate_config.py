#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_generate_config
short_description: A mig-parted config from the GPUs the fleet reports (like nvidia-mig-parted generate-config)
version_added: 0.1.0
description:
  - From the profiles the fleet's GPUs report through M(gpuops.mig.mig_facts), builds a mig-parted v1 config
    with C(all-disabled), C(all-enabled), C(all-<profile>) at the profile's maximum count (C(+) in a profile
    becomes C(.) in the name) and C(all-balanced) (7-slice GPUs 2 x 1g + 1 x 2g + 1 x 3g, 4-slice GPUs
    2 x 1g + 1 x 2g, base profiles, the 1g with the highest maximum count).
  - With several GPU models every entry has a C(device-filter), so one file serves a mixed fleet.
    The file applies with M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config) as they are.
  - Runs on the controller (an action plugin).
  - The GPU facts are checked as the modules would see the GPUs. The task fails naming the GPU and the field unless
    C(index) is a non-negative integer, C(mig_capable) a boolean, C(pci_device_id) a PCI ID C(0xDDDDVVVV) and
    C(supported_profiles) a list of mappings, each with C(name) a MIG profile name (C(<g>g.<m>gb), then C(+attr) or
    one C(-attr)) whose C(<g>) is its C(sm_slices), C(id) an integer from 0 to 1023, C(sm_slices), C(memory_slices)
    and C(max_count) integers from 1 to 64 and C(placements) offsets from 0 to 63, the whole list describing a GPU.
  - Before the config is returned, its YAML text is read back with the parser M(gpuops.mig.mig_config) uses and
    every config is resolved on one GPU of each model; a config the modules would refuse is never returned (the
    task fails saying why).
  - "Arguments may come from a literal, play vars, C(group_vars) or a template (ansible-core 2.19's tagged values
    included). A scalar where a list is expected (C(gpus: 5), C(hosts: gpu-a)) fails the task naming the option.
    docs/planning.md lists every limit."
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
  hosts:
    description:
      - Inventory hosts whose C(ansible_facts.gpuops_mig) are read (default the play's hosts); each must have them.
      - A list; a string (even C(a,b)) fails the task.
      - Mutually exclusive with O(gpus).
    type: list
    elements: str
  gpus:
    description:
      - GPU facts given directly (C(ansible_facts.gpuops_mig.gpus) of one or more hosts), a list of mappings.
    type: list
    elements: dict
seealso:
  - module: gpuops.mig.mig_config
"""

EXAMPLES = r"""
- name: Read the GPUs
  gpuops.mig.mig_facts:

- name: Generate the config for the fleet
  gpuops.mig.mig_generate_config:
  run_once: true
  register: generated

- name: Or from GPU facts kept in vars (a literal list works the same)
  gpuops.mig.mig_generate_config:
    gpus: "{{ hostvars['gpu-01'].ansible_facts.gpuops_mig.gpus }}"
  run_once: true
  register: generated_one_host

- name: Write it on the controller
  ansible.builtin.copy:
    content: "{{ generated.content }}"
    dest: "{{ playbook_dir }}/mig-parted-generated.yaml"
    mode: "0644"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
config:
  description: The mig-parted v1 config as a mapping.
  returned: success
  type: dict
content:
  description: The same config as YAML text.
  returned: success
  type: str
config_names:
  description: The config names, in order.
  returned: success
  type: list
  elements: str
models:
  description: The GPU models found (C(pci_device_id), C(name)).
  returned: success
  type: list
  elements: dict
"""
