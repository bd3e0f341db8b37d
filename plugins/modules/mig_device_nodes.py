#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_device_nodes
short_description: Make /dev/nvidia-caps current for the MIG devices the driver holds, as nvidia-modprobe does
version_added: 0.1.0
description:
  - A process reaches a MIG device through the capability device nodes C(/dev/nvidia-caps/nvidia-cap<minor>) of its
    GPU instance and compute instance, which a container runtime injects. The driver describes each capability in
    C(/proc/driver/nvidia/capabilities) (C(mig/config), C(mig/monitor), C(gpu<N>/mig/gi<G>/access),
    C(gpu<N>/mig/gi<G>/ci<C>/access), each with C(DeviceFileMinor), C(DeviceFileMode) and C(DeviceFileModify)) but never creates
    the nodes; C(nvidia-modprobe) does, on demand. After a MIG change they can be missing for the new instances,
    and still there for the ones that are gone.
  - This module makes C(/dev/nvidia-caps) what the driver lists, as C(nvidia-modprobe -f <capability file>) does
    for each one - a missing node created as a character device with the C(nvidia-caps) major of C(/proc/devices)
    and the driver's minor and mode, one of the wrong kind or numbers replaced, a wrong mode put right (where
    C(DeviceFileModify) is 1) - and removes the C(nvidia-cap<minor>) nodes of capabilities the driver no longer
    lists. Other entries are left alone. C(changed) only when something changed.
  - A host whose driver lists no capability (no driver, no MIG) is left alone.
  - Under the GPU Operator its driver container owns the device nodes; the M(gpuops.mig.mig_node) role does not
    call this module there. The boot-time restore (M(gpuops.mig.mig_boot_restore)) does the same after it
    recreates the layout at boot.
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
options:
  root:
    description:
      - The host's root directory; C(proc/) and C(dev/nvidia-caps) are read and written under it. V(/) on a host;
        another directory for a simulated host (the simulator keeps the driver's C(/proc) there).
    type: path
    default: /
"""

EXAMPLES = r"""
- name: Make /dev/nvidia-caps current after the MIG geometry changed
  gpuops.mig.mig_device_nodes:
  become: true
"""

RETURN = r"""
device_nodes:
  description: What changed (in check mode, would change), one line per node.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-cap21 created (gpu0/mig/gi2/access)", "nvidia-cap12 removed (no such capability)"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_caps as nvidia_caps
from ansible_collections.gpuops.mig.plugins.module_utils._common import fail_from
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError


def main():
    module = AnsibleModule(argument_spec=dict(root=dict(type="path", default="/")), supports_check_mode=True)
    try:
        lines = nvidia_caps.refresh(module.params["root"], module.check_mode)
    except GpuopsError as e:
        fail_from(module, e, changed=False, device_nodes=[])
    module.exit_json(changed=bool(lines), device_nodes=lines,
                     msg="; ".join(lines) if lines else "/dev/nvidia-caps already matches the driver's capabilities.")


if __name__ == "__main__":
    main()
