#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_mode
short_description: Enable or disable NVIDIA MIG mode on selected GPUs
version_added: 0.1.0
description:
  - Sets MIG mode through NVML on the selected GPUs and reports, per GPU and in total, whether a GPU
    reset or a reboot is still needed before the mode is current.
  - On Ampere GPUs (A100, A30) the new mode stays pending until the GPU is reset or the host reboots.
    With O(reset=true) the module resets the pending GPUs itself (C(nvidia-smi -r -i <bus id>)), but
    only when no process runs on them. On Hopper and newer the mode takes effect at once, and is lost
    at reboot.
  - The module never reboots. When a reset is refused (passthrough VM, clients holding the GPU), it
    reports C(reboot_required=true) so a role or playbook can decide to reboot.
  - Disabling MIG on a GPU that has MIG devices destroys them first. If any of them has processes,
    the module fails before changing anything, naming the GPU, the device and the PIDs, unless
    O(force=true).
  - Every selected GPU and every option is checked before the first change; a bad selection, a GPU that
    cannot take the mode, or an O(nvidia_smi) that could not run the reset changes nothing.
  - Disabling MIG destroys each GPU instance's compute instances, then the GPU instance. When that fails
    part-way, the compute instances already destroyed are created again at the same profiles and placements
    (new MIG device UUIDs) before the module fails, so no GPU instance is left without its MIG devices; if that
    fails too, the message names the GPU instance left so, and the next run destroys it.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - nvidia-ml-py (import C(pynvml)) on the managed host
  - root, or the mig/config capability, on the managed host
extends_documentation_fragment:
  - gpuops.mig._attributes
  - gpuops.mig._attributes.ACTIONGROUP_MIG
  - gpuops.mig._gpu_selection
  - gpuops.mig._config_source
  - gpuops.mig._driver
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  mode:
    description:
      - The MIG mode the GPUs selected by O(gpus) should have.
      - Instead of O(mode), give a config (O(config), O(config_file) or O(layouts)). Each GPU then gets the
        mode of the entry that selects it (C(mig-enabled)), and GPUs no entry selects are left alone.
        That is how to prepare a GPU for M(gpuops.mig.mig_config) with the same config.
      - Exactly one of O(mode), O(config), O(config_file) and O(layouts) is required.
    type: str
    choices: [enabled, disabled]
  reset:
    description:
      - Reset GPUs whose new mode is still pending, when no process runs on them.
      - Host services that hold the GPU (nvidia-persistenced, DCGM, nvsm, fabric manager) and the
        C(nvidia_drm) kernel module make the reset fail; stop them first (the C(gpuops.mig.node)
        role does), or reboot.
    type: bool
    default: false
  force:
    description:
      - Terminate (SIGTERM, then SIGKILL after O(force_timeout) seconds) the processes that stand in the
        way of the change, that is processes on MIG devices that must be destroyed and processes on
        GPUs whose mode must change, instead of failing.
      - Use only when losing those workloads is acceptable.
    type: bool
    default: false
  force_timeout:
    description:
      - Seconds to wait after SIGTERM before SIGKILL when O(force=true).
      - A negative, NaN or infinite value fails the module before any change.
    type: float
    default: 10
  reset_timeout:
    description:
      - Seconds each GPU reset (C(nvidia-smi -r -i <bus id>), O(reset=true)) may take. A reset
        still running then is killed and reported with C(reset.reason=timed_out) and
        C(action_required=reboot) (a GPU that does not answer needs a reboot); the GPUs after it
        are not tried (C(reset.reason=not_tried)), and RV(msg) and a warning say what the run
        had changed before it and what the next run does.
      - Raise it where resets take longer (GPUs behind NVSwitch, many GPUs at once).
      - A value below 1, NaN or infinite fails the module before any change.
    type: float
    default: 120
    version_added: 0.2.0
  nvidia_smi:
    description:
      - The C(nvidia-smi) used for GPU resets. Looked up in E(PATH) and the usual sbin directories by default.
      - With a driver under a driver root (see O(driver_root)), the root's own C(nvidia-smi) runs with
        E(LD_PRELOAD) set to the root's C(libnvidia-ml.so.1), as the GPU Operator's validator runs it.
      - A single program, a name or an absolute path. It runs without a shell, so arguments, a relative path and
        shell syntax (C(;), C(|), C(&), C($), backticks, C(<), C(>)) are refused before any change, in check mode
        too.
      - With O(reset=true), when a GPU will wait for a reset (an Ampere GPU whose mode changes, or one whose new
        mode is already pending), an C(nvidia-smi) that is not there or not executable fails the module before any
        change.
    type: str
    default: nvidia-smi
  non_capable:
    description:
      - What to do with selected GPUs that are not MIG-capable when O(mode=enabled).
      - V(skip) leaves them alone (as mig-parted does for C(devices=all)); V(fail) fails before any change.
      - GPUs selected by index, UUID or bus ID always fail.
    type: str
    choices: [skip, fail]
    default: skip
"""

EXAMPLES = r"""
- name: Enable MIG on every GPU and reset the ones that need it when idle
  gpuops.mig.mig_mode:
    mode: enabled
    reset: true
  register: mig

- name: Reboot only when a reset could not make the mode current
  ansible.builtin.reboot:
  when: mig.reboot_required

- name: Give each GPU the mode a mig-parted config asks for
  gpuops.mig.mig_mode:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-balanced
    reset: true

- name: Turn MIG off on GPUs 2 and 3 (fails if MIG devices there are busy)
  gpuops.mig.mig_mode:
    gpus: [2, 3]
    mode: disabled
"""

RETURN = r"""
reset_required:
  description: Whether at least one GPU still has a pending mode that a GPU reset would apply.
  returned: always
  type: bool
reboot_required:
  description: Whether at least one GPU still has a pending mode that needs a reboot (reset refused or impossible).
  returned: always
  type: bool
msg:
  description:
    - When a GPU reset timed out (O(reset_timeout)), what it left, also given as a warning - the
      reset that timed out, what the run had changed before it, the modes still pending, and what
      the next run does.
  returned: when a GPU reset timed out
  type: str
gpus:
  description:
    - Per selected GPU, C(index), C(uuid), C(name), C(pci_bus_id), C(changed), C(skipped) (reason or null),
      C(mig_mode_before) and C(mig_mode) (C(current) and C(pending)), C(destroyed) (GPU instances removed),
      C(terminated_pids), C(activation_status), C(reset) (C(attempted), C(ok), C(reason), C(message)),
      C(action_required) (V(none), V(reset) or V(reboot)), C(hint) and C(mig_mode_persists_across_reboot).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_mode as host_mode
from ansible_collections.gpuops.mig.plugins.module_utils._common import (
    CONFIG_SOURCE_ARG_SPEC,
    CONFIG_SOURCE_EXCLUSIVE,
    DRIVER_ARG_SPEC,
    GPU_SELECTION_ARG_SPEC,
    nvml_session,
)
from ansible_collections.gpuops.mig.plugins.module_utils._input import seconds
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    RESET_TIMEOUT,
    check_program,
    timed_run,
)


def main():
    argument_spec = dict(
        mode=dict(type="str", choices=["enabled", "disabled"]),
        reset=dict(type="bool", default=False),
        force=dict(type="bool", default=False),
        force_timeout=dict(type="float", default=10),
        reset_timeout=dict(type="float", default=RESET_TIMEOUT),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
        non_capable=dict(type="str", choices=["skip", "fail"], default="skip"),
    )
    argument_spec.update(GPU_SELECTION_ARG_SPEC)
    argument_spec.update(CONFIG_SOURCE_ARG_SPEC)
    argument_spec.update(DRIVER_ARG_SPEC)
    exclusive = [("mode",) + CONFIG_SOURCE_EXCLUSIVE[0]]
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=exclusive, required_one_of=exclusive)
    p = module.params
    with nvml_session(module) as nvml:
        check_program(p["nvidia_smi"], "nvidia_smi")
        seconds(p["force_timeout"], "force_timeout")
        seconds(p["reset_timeout"], "reset_timeout", least=1)
        if p["mode"] is not None:
            request = host_mode.request_from_selection(nvml, p["mode"], p["gpus"])
        else:
            entries = host_layout.load_entries(p["config"], p["config_file"], p["config_name"], p["layouts"])
            request = host_mode.request_from_config(nvml, entries, p["allow_unmatched"], p["force"])
        records = host_mode.plan(nvml, request, p["force"], p["non_capable"])
        smi = None
        if p["reset"]:  # checked before the first change, in check mode too
            smi = host_mode.reset_command(nvml, records, p["nvidia_smi"])
        host_mode.apply(nvml, records, module.check_mode, p["force_timeout"])
        if p["reset"] and not module.check_mode:
            host_mode.reset_pending(nvml, records, timed_run(p["reset_timeout"]), smi)
        result = host_mode.report(nvml, records, module.check_mode)
        timed_out = host_mode.reset_timeout_message(records)
        if timed_out:
            result["msg"] = timed_out
            module.warn(timed_out)
        if module._diff:
            result["diff"] = host_mode.diff(records)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
