# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """Paired with DRIVER_ARG_SPEC in plugins/module_utils/_common.py (private)."""

    DOCUMENTATION = r"""
options:
  driver_root:
    description:
      - Where the NVIDIA driver (C(libnvidia-ml.so.1) and C(nvidia-smi)) is on the managed host.
      - V(auto) uses the host's own driver when C(libnvidia-ml.so.1) is on its library path; otherwise
        the root of the GPU Operator's driver container, as named by the operator validator's
        C(/run/nvidia/validations/driver-ready) file, or else C(/run/nvidia/driver).
      - V(/) means the host's own driver only.
      - Any other path is a driver root (the operator chart's C(hostPaths.driverInstallDir)).
        C(libnvidia-ml.so.1) is looked for in the root itself and in its C(usr/lib64),
        C(usr/lib/x86_64-linux-gnu), C(usr/lib/aarch64-linux-gnu), C(lib64), C(lib/x86_64-linux-gnu)
        and C(lib/aarch64-linux-gnu), and C(nvidia-smi) in its C(/), C(usr/bin), C(usr/sbin), C(bin) and
        C(sbin), as the operator does.
      - When no driver is found, the error names every place that was tried.
      - An empty value is refused (it names no place); give V(auto), V(/) or a directory.
    type: str
    default: auto
"""
