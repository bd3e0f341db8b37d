#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_cdi_refresh
short_description: Regenerate the host's CDI spec of its NVIDIA devices after a MIG change
version_added: 0.1.0
description:
  - A CDI spec lists the devices a container runtime may inject (the device plugin's C(cdi-annotations) and
    C(cdi-cri) device list strategies use it). C(nvidia-ctk cdi generate) describes the devices of the moment it
    runs, so after a MIG change the spec still names the old MIG devices, and pods fail with
    C(CreateContainerError), until it is regenerated.
  - This module regenerates the spec the host uses - the first of O(spec_paths) under O(root)
    that exists - with C(nvidia-ctk cdi generate), to the same path and format, and replaces it
    only when it differs (C(changed)).
    A host without any of them uses no CDI spec, and nothing is done.
  - The new spec is generated outside the spec directory first, and renamed into place keeping the old file's mode.
  - C(nvidia-ctk cdi generate) may run for 120 seconds; one that runs longer is killed and the
    module fails, leaving the spec as it was.
  - Under the GPU Operator its toolkit regenerates the spec itself; the M(gpuops.mig.mig_node) role does not call
    this module there.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - the NVIDIA Container Toolkit (C(nvidia-ctk)) on the managed host
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
  spec_paths:
    description: Where the spec may be, in order; the first that exists is regenerated.
    type: list
    elements: path
    default: [/etc/cdi/nvidia.yaml, /var/run/cdi/nvidia.yaml]
  root:
    description:
      - The host's root directory, prefixed to each of O(spec_paths). V(/) on a host; another
        directory for a simulated host (as O(gpuops.mig.mig_device_nodes#module:root)).
    type: path
    default: /
  command:
    description: The C(nvidia-ctk) to run (a name on C(PATH), or a path).
    type: str
    default: nvidia-ctk
"""

EXAMPLES = r"""
- name: Regenerate the CDI spec after the MIG geometry changed
  gpuops.mig.mig_cdi_refresh:
  become: true
"""

RETURN = r"""
spec:
  description: The spec regenerated (under O(root)), null when the host has none of O(spec_paths).
  returned: always
  type: str
  sample: /etc/cdi/nvidia.yaml
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _cdi as cdi
from ansible_collections.gpuops.mig.plugins.module_utils._common import fail_from
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import PROGRAM_TIMEOUT, timed_run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            spec_paths=dict(type="list", elements="path", default=list(cdi.DEFAULT_SPEC_PATHS)),
            root=dict(type="path", default="/"),
            command=dict(type="str", default="nvidia-ctk"),
        ),
        supports_check_mode=True,
    )
    paths = cdi.spec_paths(module.params["root"], module.params["spec_paths"])
    path = cdi.spec_in_use(paths)
    if path is None:
        module.exit_json(changed=False, spec=None, msg="No CDI spec here (%s): nothing to regenerate."
                         % ", ".join(paths))
    try:
        changed = cdi.refresh(path, timed_run(PROGRAM_TIMEOUT), module.params["command"],
                              module.check_mode)
    except GpuopsError as e:
        fail_from(module, e, changed=False, spec=path)
    module.exit_json(changed=changed, spec=path,
                     msg="%s %s." % (path, "regenerated" if changed else "already lists the current devices"))


if __name__ == "__main__":
    main()
