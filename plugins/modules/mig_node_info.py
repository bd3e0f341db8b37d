#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_node_info
short_description: Everything a MIG rollout decides on for one node, in one read-only pass
version_added: 0.1.0
description:
  - Reads the node's GPUs once (one NVML session) and returns what the M(gpuops.mig.mig_node) role decides on
    the driver and GPUs (as M(gpuops.mig.mig_facts) reports them), the MIG mode change and the geometry change
    the declared layout needs (as M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config) would plan them in check
    mode), each GPU's MIG mode and device types after the change, and whether the boot-time restore installed
    by M(gpuops.mig.mig_boot_restore) is in step with the layout.
  - Without a layout (none of O(config), O(config_file), O(layouts)) it reads the driver and GPUs only, which is
    what the M(gpuops.mig.mig_preflight) role checks.
  - Changes nothing. A layout that cannot be applied (a config entry no GPU can hold, busy devices in the way
    without O(force)) fails here, with the messages of M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config),
    before anything on any node changes.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - nvidia-ml-py (C(import pynvml)) on the managed host
extends_documentation_fragment:
  - gpuops.mig._attributes
  - gpuops.mig._attributes.ACTIONGROUP_MIG
  - gpuops.mig._config_source
  - gpuops.mig._driver
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same way in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  config_origin:
    description:
      - Where O(config) or O(layouts) came from (for example C(ConfigMap gpu-operator/default-mig-parted-config)),
        named in every message about them.
    type: str
  container_toolkit_command:
    description:
      - A command (run without a shell) that prints the NVIDIA Container Toolkit's version, for example
        C(nvidia-ctk --version). Its version or error is returned in RV(container_toolkit). Leave it out to skip.
      - A program and its arguments, split as a shell would split words; shell syntax (C(;), C(|), C(&), C($),
        backticks, C(<), C(>), line breaks) is refused, since no shell runs it.
    type: str
    version_added: 0.2.0
  fail_on_missing_driver:
    description:
      - Fail when the NVIDIA driver or nvidia-ml-py cannot be used. With V(false) that is reported in
        RV(facts) (C(driver.present) false, C(driver.error) why) and nothing is planned, as
        M(gpuops.mig.mig_facts) does.
    type: bool
    default: true
    version_added: 0.2.0
  force:
    description: Plan as M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config) would with O(force=true).
    type: bool
    default: false
  restore:
    description:
      - The boot-time restore to compare with the one installed, as the options of
        M(gpuops.mig.mig_boot_restore) without the layout (C(reset), C(nvidia_smi), C(before), C(python),
        C(root), C(config_dir), C(lib_dir), C(script), C(unit_dir), C(wait_for_driver)). Leave it out to skip
        the comparison.
    type: dict
"""

EXAMPLES = r"""
- name: What would the rollout do on this node?
  gpuops.mig.mig_node_info:
    layouts:
      - gpus: all
        devices: {3g.40gb: 2}
  register: node

- name: Say it
  ansible.builtin.debug:
    msg: "{{ 'converged' if not node.change.any else 'mode: ' ~ node.change.mode ~ ', geometry: ' ~ node.change.geometry }}"
"""

RETURN = r"""
facts:
  description: The driver and the GPUs, as M(gpuops.mig.mig_facts) reports them (without profiles).
  returned: always
  type: dict
container_toolkit:
  description:
    - C(command), C(rc), C(version) (V(x.y.z), or null) and C(error) (null when the command ran), when
      O(container_toolkit_command) is given; else null.
  returned: always
  type: dict
mode:
  description: The MIG mode plan, as M(gpuops.mig.mig_mode) returns it in check mode. Null without a layout.
  returned: always
  type: dict
geometry:
  description:
    - The geometry plan per GPU, as M(gpuops.mig.mig_config) returns it in check mode (C(gpus)). Null without a
      layout.
  returned: always
  type: dict
change:
  description:
    - C(mode), C(geometry) and C(any) (either), each true when that part must change. Null without a layout.
  returned: always
  type: dict
wants_mig:
  description: Whether any GPU is to have MIG on after the change. Null without a layout.
  returned: always
  type: bool
planned:
  description:
    - Per GPU of the host, after the change; C(index), C(name), C(mig_enabled) and C(devices) (MIG device name
      to count). Null without a layout.
  returned: always
  type: list
  elements: dict
restore:
  description:
    - C(state) (V(present) when MIG is wanted, else V(absent)), C(installed) (the stamp found on the host, or
      null), C(wanted) (the stamp of the restore the layout asks for, or null), C(in_step), and C(driver_root),
      the driver root to install the restore with (where the driver was found).
    - C(in_step) is true only when the stamps match and every installed file (engine, launcher, unit, desired
      state) has the content (by its SHA-256 digest), owner and mode M(gpuops.mig.mig_boot_restore) would write,
      nothing else lies in the engine directory, and no other user than root could change the files, their
      directories or the interpreter; the same check that module makes.
    - Null when O(restore) is not given.
  returned: always
  type: dict
host_mig_manager:
  description:
    - NVIDIA's host service C(nvidia-mig-manager.service) (NVIDIA/mig-parted C(deployments/systemd)), which applies
      the config named in its C(override.conf) at every boot and so would revert a layout the collection manages.
    - C(unit), C(present) (its unit file is loaded), C(enabled), C(selected_config) (C(MIG_PARTED_SELECTED_CONFIG)
      of its drop-in C(override.conf), or null), C(override) and C(marker) (paths under the restore's C(root)),
      C(disabled_by_gpuops) (the M(gpuops.mig.mig_node) role switched it off and will switch it on again at
      hand-back).
    - Null when O(restore) is not given.
  returned: always
  type: dict
"""

import os
import re
import shlex
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_units as nvidia_units
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_mode as host_mode
from ansible_collections.gpuops.mig.plugins.module_utils._common import (
    CONFIG_SOURCE_ARG_SPEC,
    CONFIG_SOURCE_EXCLUSIVE,
    DRIVER_ARG_SPEC,
    fail_from,
)
from ansible_collections.gpuops.mig.plugins.module_utils._errors import DriverNotFound, GpuopsError, MissingLibrary
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    Nvml,
    check_command_line,
    facts_without_driver,
    mig_device_counts,
    missing_driver_message,
)


def read_facts(nvml):
    """The mig_facts view of the host (profiles left out)."""
    gpus = []
    for index in range(nvml.gpu_count()):
        info = nvml.describe(index)
        info.pop("supported_profiles", None)
        info["mig_devices"] = mig_device_counts(info["gpu_instances"])
        gpus.append(info)
    return {
        "driver": {"present": True, "version": nvml.driver_version(), "cuda_version": nvml.cuda_driver_version(),
                   "nvml_version": nvml.nvml_version(), "root": nvml.driver.root, "library": nvml.driver.library,
                   "error": None},
        "simulated": bool(nvml.simulate),
        "gpu_count": len(gpus),
        "mig_capable_count": sum(1 for g in gpus if g["mig_capable"]),
        "gpus": gpus,
    }


def planned_gpus(facts, geometry):
    """Each GPU's MIG mode and devices once the layout is applied (untouched GPUs as they are)."""
    targets = dict((g["index"], g) for g in geometry)
    planned = []
    for gpu in facts["gpus"]:
        target = targets.get(gpu["index"])
        if target is None:
            enabled, devices = bool(gpu.get("mig_enabled")), dict(gpu.get("mig_devices") or {})
        else:
            enabled = target["mig_enabled"]
            devices = dict((k, v) for k, v in target["target"].items() if v > 0) if enabled else {}
        planned.append({"index": gpu["index"], "name": gpu["name"], "mig_enabled": enabled, "devices": devices})
    return planned


RESTORE_DEFAULTS = {"root": "", "config_dir": "/etc/gpuops-mig", "lib_dir": "/usr/local/lib/gpuops-mig",
                    "script": "/usr/local/sbin/gpuops-mig-restore", "unit_dir": "/etc/systemd/system",
                    "reset": True, "nvidia_smi": "nvidia-smi", "before": list(boot_restore.DEFAULT_BEFORE)}


def restore_state(options, wants_mig, layout_params):
    """Is the boot-time restore on the host the one this layout asks for? (mig_boot_restore's defaults)"""
    params = dict(RESTORE_DEFAULTS)
    params.update((k, v) for k, v in options.items() if v is not None)
    installed = boot_restore.installed_stamp(boot_restore.paths_of(params)["config_dir"])
    if not wants_mig:
        return {"state": "absent", "installed": installed, "wanted": None, "in_step": installed is None}
    params.update(layout_params)
    python = params.get("python") or sys.executable
    files, wanted = boot_restore.bundle_for(params, python)
    # Every installed file by its digest, owner and mode, as mig_boot_restore checks it: a file changed
    # behind the stamp's back (code appended to the engine, say) is out of step too.
    in_step = installed == wanted and boot_restore.in_step(files, boot_restore.paths_of(params), python,
                                                           os.geteuid(), os.getegid())
    return {"state": "present", "installed": installed, "wanted": wanted, "in_step": in_step}


def container_toolkit(module, command):
    """The NVIDIA Container Toolkit's version from ``command`` (run without a shell), or why there is none."""
    argv = shlex.split(command)
    try:
        rc, out, err = module.run_command(argv, handle_exceptions=False)
    except OSError as e:
        return {"command": command, "rc": None, "version": None, "error": str(e)}
    found = re.search(r"[0-9]+[.][0-9]+[.][0-9]+", out or "")
    error = None if rc == 0 else ((err or out or "").strip() or "exit status %d" % rc)
    return {"command": command, "rc": rc, "version": found.group(0) if found and rc == 0 else None, "error": error}


def host_mig_manager(module, root):
    """NVIDIA's nvidia-mig-manager.service on this host (none where there is no systemctl)."""
    systemctl = module.get_bin_path("systemctl")
    text = None
    if systemctl:
        rc, out, _err = module.run_command([systemctl] + list(nvidia_units.SHOW_ARGS))
        text = out if rc == 0 else None
    return nvidia_units.state(text, root)


def plan_node(nvml, p):
    """The mode and geometry plans for the declared layout, and what they add up to."""
    entries = host_layout.load_entries(p["config"], p["config_file"], p["config_name"], p["layouts"],
                                       origin=p["config_origin"])
    resolution, gpus = host_layout.resolve(nvml, entries, p["allow_unmatched"])
    work = host_layout.plan_host(nvml, resolution, gpus, p["force"], check_mode=True)
    records = host_mode.plan(nvml, host_mode.request_from_resolution(resolution, gpus), p["force"])
    host_mode.apply(nvml, records, check_mode=True)
    mode = host_mode.report(nvml, records, check_mode=True)
    geometry = host_layout.report(work)
    change_mode = mode["changed"] or mode["reset_required"] or mode["reboot_required"]
    change_geometry = any(g["changed"] for g in geometry)
    return {
        "mode": mode,
        "geometry": {"gpus": geometry},
        "change": {"mode": change_mode, "geometry": change_geometry, "any": change_mode or change_geometry},
        "wants_mig": any(g["mig_mode"]["pending"] == "enabled" for g in mode["gpus"] if not g["skipped"]),
    }


def main():
    argument_spec = dict(
        config_origin=dict(type="str"),
        force=dict(type="bool", default=False),
        restore=dict(type="dict"),
        fail_on_missing_driver=dict(type="bool", default=True),
        container_toolkit_command=dict(type="str"),
    )
    argument_spec.update(CONFIG_SOURCE_ARG_SPEC)
    argument_spec.update(DRIVER_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=CONFIG_SOURCE_EXCLUSIVE)
    p = module.params
    declared = any(p[key] is not None for key in ("config", "config_file", "layouts"))
    result = dict(changed=False, mode=None, geometry=None, change=None, wants_mig=None, planned=None, restore=None,
                  container_toolkit=None, host_mig_manager=None)
    if p["container_toolkit_command"]:
        try:
            check_command_line(p["container_toolkit_command"], "container_toolkit_command")
        except GpuopsError as e:
            fail_from(module, e)
        result["container_toolkit"] = container_toolkit(module, p["container_toolkit_command"])
    nvml = Nvml(driver_root=p["driver_root"])
    try:
        with nvml:
            result["facts"] = read_facts(nvml)
            if declared:
                result.update(plan_node(nvml, p))
    except (MissingLibrary, DriverNotFound) as e:
        if p["fail_on_missing_driver"]:
            fail_from(module, e)
        module.exit_json(**dict(result, facts=facts_without_driver(missing_driver_message(e), nvml.simulate)))
    except GpuopsError as e:
        fail_from(module, e)
    if declared:
        result["planned"] = planned_gpus(result["facts"], result["geometry"]["gpus"])
        if p["restore"] is not None:
            # At boot the restore looks where the driver was found now (a driver container's root, say).
            driver_root = result["facts"]["driver"]["root"] or p["driver_root"]
            layout_params = dict(config=p["config"], layouts=p["layouts"], config_name=p["config_name"],
                                 allow_unmatched=p["allow_unmatched"], driver_root=driver_root)
            result["restore"] = dict(restore_state(p["restore"], result["wants_mig"], layout_params),
                                     driver_root=driver_root)
            result["host_mig_manager"] = host_mig_manager(module, p["restore"].get("root") or "/")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
