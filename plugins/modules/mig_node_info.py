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
  - With O(read_allocations) (the default) it also reads which pod holds which GPU or MIG device from the
    kubelet (RV(allocations)), and names the holders beside each device in RV(facts). The geometry plan does
    not count those pods as busy (only processes), since a rollout moves the pods off before the change;
    M(gpuops.mig.mig_config) does count them.
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
  - gpuops.mig._pod_resources
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
  owed_file:
    description:
      - On a host outside Kubernetes, the file in which a rollout records what it must put back (the host
        services it stopped); its text is returned in RV(owed) for the M(gpuops.mig.mig_node) role's repair.
    type: path
    version_added: 0.2.0
  container_toolkit_command:
    description:
      - A command (run without a shell) that prints the NVIDIA Container Toolkit's version, for example
        C(nvidia-ctk --version). Its version or error is returned in RV(container_toolkit). Leave it out to skip.
      - A program and its arguments, split as a shell would split words; shell syntax (C(;), C(|), C(&), C($),
        backticks, C(<), C(>), line breaks) is refused, since no shell runs it.
      - It may run for 120 seconds; one that runs longer is killed and reported as the error in
        RV(container_toolkit).
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
  description:
    - The driver and the GPUs, as M(gpuops.mig.mig_facts) reports them (without profiles).
    - Each GPU and each of its compute instances also has C(pods), the holders the kubelet allocated it to,
      as C(namespace/pod/container) strings (a MIG device's list includes those holding its whole GPU); null
      when RV(allocations) was not read.
  returned: always
  type: dict
allocations:
  description:
    - One item per device ID a container holds, in the kubelet's order, each with C(device_uuid) (C(MIG-...)
      or C(GPU-...), without a time-slicing replica suffix), C(namespace), C(pod), C(container) and
      C(resource) (for example C(nvidia.com/mig-1g.10gb)). A container holding several replicas of one device
      appears once per replica.
    - On a node NVIDIA's DRA driver serves (O(dra_allocations)), one item per device of a ResourceClaim and pod it
      is reserved for, with C(resource) V(gpu.nvidia.com), an empty C(container) (a claim is the pod's), and
      C(pod_uid), C(claim), C(request) and C(device) (the device's name in its ResourceSlice).
    - Null when the kubelet's PodResources API was not read (see RV(allocations_error)); an empty list when it
      was read and no pod holds an NVIDIA device.
  returned: always
  type: list
  elements: dict
  sample:
    - {device_uuid: MIG-5c89e4e5-2f2a-5b2c-9d4e-0d0b1c3f6a11, namespace: ml, pod: train-0, container: main,
       resource: nvidia.com/mig-1g.10gb}
allocations_source:
  description:
    - Where RV(allocations) came from; V(podresources) (the kubelet), V(podresources+dra) (the kubelet and the
      DRA driver's ResourceClaims, O(dra_allocations)), V(dra) (the claims alone, the kubelet being unreadable);
      null when it is unknown.
  returned: always
  type: str
allocations_error:
  description:
    - Null when RV(allocations) was read; else why not, as a sentence (no socket, refused, no answer in time,
      an answer that does not decode, no C(grpcio) on the host, O(read_allocations=false), or DRA claims that
      cannot be mapped to devices, O(dra_allocations)).
  returned: always
  type: str
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
    - Unlike M(gpuops.mig.mig_config), a plan may destroy MIG devices allocated to pods (keeping them wherever
      the layout allows, and evicting as few pods as it can); its C(evicted_pods) names those pods.
  returned: always
  type: dict
change:
  description:
    - C(mode), C(geometry) and C(any) (either), each true when that part must change. Null without a layout.
  returned: always
  type: dict
owed:
  description:
    - With O(owed_file), C(path) and C(text) (at most 64 KiB) of that file; null when there is none.
  returned: always
  type: dict
evictions:
  description:
    - Which pods the change evicts, and why, from the kubelet's allocations (RV(allocations)) and the plans.
      Null without a layout or when the allocations were not read (then only a whole-node drain is safe).
    - C(pods) (each C(pod), C(namespace/name), with C(reasons), each with C(reason) V(device destroyed),
      V(GPU mode change) or V(reboot), C(gpu), C(detail), and for a destroyed device C(device) and C(uuid)),
      C(drain_node) (the change reboots the node, so every pod goes) and C(evicts_nothing).
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
    POD_RESOURCES_ARG_SPEC,
    allocations_of,
    fail_from,
)
from ansible_collections.gpuops.mig.plugins.module_utils._errors import DriverNotFound, GpuopsError, MissingLibrary
from ansible_collections.gpuops.mig.plugins.module_utils._input import FileRefused, read_file
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    Nvml,
    check_command_line,
    facts_without_driver,
    mig_device_counts,
    missing_driver_message,
    run_program,
)
from ansible_collections.gpuops.mig.plugins.module_utils import _evictions as evictions
from ansible_collections.gpuops.mig.plugins.module_utils._podresources import holders_by_device


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


def name_holders(facts, allocations):
    """Put beside each GPU and MIG device of ``facts`` the pods holding it (None when not known)."""
    holders = holders_by_device(allocations) if allocations is not None else None
    for gpu in facts["gpus"]:
        whole = list(holders.get(gpu["uuid"], ())) if holders is not None else None
        gpu["pods"] = whole
        for gi in gpu.get("gpu_instances") or ():
            for ci in gi["compute_instances"]:
                ci["pods"] = None if holders is None else list(holders.get(ci["mig_device_uuid"], ())) + whole


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


RESTORE_DEFAULTS = {"root": "", "config_dir": boot_restore.DEFAULT_CONFIG_DIR, "lib_dir": boot_restore.DEFAULT_ENGINE_DIR,
                    "script": boot_restore.DEFAULT_SCRIPT, "unit_dir": boot_restore.DEFAULT_UNIT_DIR,
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


def container_toolkit(command):
    """The NVIDIA Container Toolkit's version from ``command`` (run without a shell), or why there is none."""
    argv = shlex.split(command)
    try:
        rc, out, err = run_program(argv)     # at most PROGRAM_TIMEOUT seconds
    except OSError as e:                     # cannot run, or killed at its timeout
        return {"command": command, "rc": None, "version": None, "error": str(e)}
    found = re.search(r"[0-9]+[.][0-9]+[.][0-9]+", out or "")
    error = None if rc == 0 else ((err or out or "").strip() or "exit status %d" % rc)
    return {"command": command, "rc": rc, "version": found.group(0) if found and rc == 0 else None, "error": error}


OWED_LIMIT = 65536


def read_owed_file(path):
    """The text of the host's owed record (None when there is none), bounded: it is the role's,
    not free text. Read as config_file is (a regular file only: a FIFO there would hang the
    read); anything else, a larger file or one that is not UTF-8 text, is reported unreadable."""
    if not path or not os.path.lexists(path):
        return None
    try:
        return {"path": path, "text": read_file(path, "owed_file", OWED_LIMIT)}
    except FileRefused as e:
        return {"path": path, "text": "unreadable: %s" % e}


def gpu_holders(facts, holders):
    """{GPU index: every pod holding the GPU or one of its MIG devices} (the pods a mode change or reset
    evicts); None when the kubelet was not read."""
    if holders is None:
        return None
    out = {}
    for gpu in facts["gpus"]:
        found = list(holders.get(gpu["uuid"], ()))
        for gi in gpu.get("gpu_instances") or ():
            for ci in gi["compute_instances"]:
                found.extend(holders.get(ci["mig_device_uuid"], ()))
        out[gpu["index"]] = tuple(found)
    return out


def host_mig_manager(module, root):
    """NVIDIA's nvidia-mig-manager.service on this host (none where there is no systemctl)."""
    systemctl = module.get_bin_path("systemctl")
    text = None
    if systemctl:
        try:
            rc, out, _err = run_program([systemctl] + list(nvidia_units.SHOW_ARGS))
        except OSError:     # cannot run, or killed at its timeout: the state is not known
            rc, out = None, None
        text = out if rc == 0 else None
    return nvidia_units.state(text, root)


def plan_node(nvml, p, facts=None, holders=None):
    """The mode and geometry plans for the declared layout, what they add up to, and which pods the change
    evicts (holders: {device UUID: pods} from the kubelet; None when not read: evictions is None)."""
    entries = host_layout.load_entries(p["config"], p["config_file"], p["config_name"], p["layouts"],
                                       origin=p["config_origin"])
    resolution, gpus = host_layout.resolve(nvml, entries, p["allow_unmatched"])
    # A device allocated to a pod may go here: the rollout evicts the pods each plan's evicted_pods names.
    work = host_layout.plan_host(nvml, resolution, gpus, p["force"], check_mode=True, evict_pods=True, holders=holders)
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
        "evictions": None if holders is None else evictions.host_evictions(
            work, mode, gpu_pods=gpu_holders(facts, holders)).as_dict(),
    }


def main():
    argument_spec = dict(
        config_origin=dict(type="str"),
        force=dict(type="bool", default=False),
        restore=dict(type="dict"),
        fail_on_missing_driver=dict(type="bool", default=True),
        container_toolkit_command=dict(type="str"),
        owed_file=dict(type="path"),
    )
    argument_spec.update(CONFIG_SOURCE_ARG_SPEC)
    argument_spec.update(DRIVER_ARG_SPEC)
    argument_spec.update(POD_RESOURCES_ARG_SPEC)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=CONFIG_SOURCE_EXCLUSIVE)
    p = module.params
    declared = any(p[key] is not None for key in ("config", "config_file", "layouts"))
    result = dict(changed=False, mode=None, geometry=None, change=None, wants_mig=None, planned=None, restore=None,
                  evictions=None, owed=read_owed_file(p["owed_file"]), container_toolkit=None, host_mig_manager=None)
    if p["container_toolkit_command"]:
        try:
            check_command_line(p["container_toolkit_command"], "container_toolkit_command")
        except GpuopsError as e:
            fail_from(module, e)
        result["container_toolkit"] = container_toolkit(p["container_toolkit_command"])
    # The kubelet's allocations before NVML (the planner keeps what pods hold); after the commands this
    # module runs, since gRPC's threads are best not forked.
    allocations = allocations_of(module)
    holders = holders_by_device(allocations["allocations"]) if allocations["allocations"] is not None else None
    nvml = Nvml(driver_root=p["driver_root"])
    try:
        with nvml:
            result["facts"] = read_facts(nvml)
            if declared:
                result.update(plan_node(nvml, p, result["facts"], holders))
    except (MissingLibrary, DriverNotFound) as e:
        if p["fail_on_missing_driver"]:
            fail_from(module, e)
        module.exit_json(**dict(result, facts=facts_without_driver(missing_driver_message(e), nvml.simulate),
                                **allocations))
    except GpuopsError as e:
        fail_from(module, e)
    result.update(allocations)
    name_holders(result["facts"], result["allocations"])
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
