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
  - Every selected GPU is checked before the first change; a bad selection or a GPU that cannot take
    the mode changes nothing.
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
    type: float
    default: 10
  nvidia_smi:
    description:
      - The C(nvidia-smi) used for GPU resets. Looked up in E(PATH) and the usual sbin directories by default.
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

from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as geometry
from ansible_collections.gpuops.mig.plugins.module_utils._common import (
    CONFIG_SOURCE_ARG_SPEC,
    CONFIG_SOURCE_EXCLUSIVE,
    GPU_SELECTION_ARG_SPEC,
    SelectionError,
    explicitly_selected,
    module_run_command,
    nvml_session,
    select_gpus,
)
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import LayoutError
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    RESET_HINTS,
    RESET_REQUIRED,
    busy_devices,
    describe_busy,
    mode_name,
    reset_gpus,
    terminate_processes,
)


class MigModeManager(object):
    """Read the GPUs, work out what must change, check it is safe, then act."""

    def __init__(self, module, nvml):
        self.module = module
        self.nvml = nvml
        self.params = module.params
        self.results = []

    def fail(self, msg, **kwargs):
        self.module.fail_json(msg=msg, **kwargs)

    # read + decide -----------------------------------------------------------
    def _wanted(self):
        """{index: 0/1} for the GPUs to act on, from ``mode`` + ``gpus`` or from a config."""
        nvml, p = self.nvml, self.params
        if p["mode"] is not None:
            identities = [nvml.gpu(i) for i in range(nvml.gpu_count())]
            try:
                selected = select_gpus(identities, p["gpus"])
            except SelectionError as e:
                self.fail(str(e))
            return dict((g["index"], 1 if p["mode"] == "enabled" else 0) for g in selected)
        try:
            entries = geometry.load_entries(p["config"], p["config_file"], p["config_name"], p["layouts"])
            resolution, _gpus = geometry.resolve(nvml, entries, p["allow_unmatched"])
        except LayoutError as e:
            self.fail(str(e))
        return dict((t.gpu.index, 1 if t.mig_enabled else 0) for t in resolution.targets)

    def plan(self):
        nvml = self.nvml
        wanted = self._wanted()
        problems = []
        for index in sorted(wanted):
            gpu = nvml.gpu(index)
            desired = wanted[index]
            entry = {
                "index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"],
                "pci_bus_id": gpu["pci_bus_id"], "label": gpu["label"],
                "architecture": gpu["architecture"],
                "mig_mode_persists_across_reboot": gpu["mig_mode_persists_across_reboot"],
                "desired": desired, "changed": False, "skipped": None, "destroyed": [], "terminated_pids": [],
                "activation_status": None,
                "reset": {"attempted": False, "ok": None, "reason": None, "message": None},
            }
            mode = nvml.mig_mode(gpu["index"])
            if mode is None:
                entry["mig_mode_before"] = entry["mig_mode"] = None
                entry["skipped"] = "not MIG-capable"
                if desired == 1 and (self.params["non_capable"] == "fail" or self._explicit(gpu)):
                    problems.append("%s is not MIG-capable" % gpu["label"])
                self.results.append(entry)
                continue
            current, pending = mode
            entry["mig_mode_before"] = {"current": mode_name(current), "pending": mode_name(pending)}
            entry["needs_set"] = pending != desired
            entry["blocking_pids"] = []
            if entry["needs_set"]:
                problem = self._check_in_the_way(entry, current)
                if problem:
                    problems.append(problem)
            self.results.append(entry)
        if problems:
            self.fail("Nothing was changed. " + " | ".join(problems), gpus=self._public())

    def _explicit(self, gpu):
        if not self.params["mode"]:
            return False  # with a config, the config's own rules decide (resolve_targets)
        identities = [self.nvml.gpu(i) for i in range(self.nvml.gpu_count())]
        return gpu["index"] in explicitly_selected(identities, self.params["gpus"])

    def _check_in_the_way(self, entry, current):
        """Record what blocks the mode change; return a message if that is not allowed."""
        index = entry["index"]
        if entry["desired"] == 0 and current == 1:
            layout = self.nvml.layout(index)
            entry["to_destroy"] = layout
            busy = busy_devices(layout)
            if busy:
                entry["blocking_pids"] = sorted(set(p["pid"] for _gi, ci in busy for p in ci["processes"]))
                if not self.params["force"]:
                    return ("%s has MIG devices with processes; disabling MIG would destroy them "
                            "(set force=true to terminate them)" % describe_busy(entry["label"], busy))
        else:
            procs = self.nvml.gpu_processes(index)
            if procs:
                entry["blocking_pids"] = [p["pid"] for p in procs]
                if not self.params["force"]:
                    return ("%s has processes (PIDs %s); changing its MIG mode needs it idle "
                            "(drain it, or set force=true to terminate them)"
                            % (entry["label"], ", ".join(str(p) for p in entry["blocking_pids"])))
        return None

    # act ---------------------------------------------------------------------
    def apply(self):
        nvml = self.nvml
        for entry in self.results:
            if entry["skipped"] or not entry["needs_set"]:
                continue
            entry["changed"] = True
            if self.module.check_mode:
                entry["destroyed"] = entry.get("to_destroy", [])
                continue
            if entry["blocking_pids"]:
                still = terminate_processes(entry["blocking_pids"], self.params["force_timeout"])
                entry["terminated_pids"] = [p for p in entry["blocking_pids"] if p not in still]
                if still:
                    self.fail("%s: processes %s survived SIGKILL" % (entry["label"], still), gpus=self._public())
            for gi in entry.get("to_destroy", []):
                nvml.destroy_gpu_instance(entry["index"], gi["id"])
                entry["destroyed"].append(gi)
            entry["activation_status"] = nvml.set_mig_mode(entry["index"], entry["desired"] == 1)

        if self.params["reset"] and not self.module.check_mode:
            self._reset_pending()

    def _reset_pending(self):
        pending = []
        for entry in self.results:
            if entry["skipped"]:
                continue
            current, _pending = self.nvml.mig_mode(entry["index"])
            if current != entry["desired"]:
                if self.nvml.gpu_processes(entry["index"]):
                    entry["reset"].update(attempted=False, ok=False, reason="in_use",
                                          message="processes run on the GPU; not resetting it")
                    continue
                pending.append(entry)
        if not pending:
            return
        smi = self.module.get_bin_path(self.params["nvidia_smi"], opt_dirs=["/usr/sbin", "/sbin"]) \
            or self.params["nvidia_smi"]
        outcome = reset_gpus([e["pci_bus_id"] for e in pending], module_run_command(self.module), smi)
        self.nvml.forget_handles()
        for entry in pending:
            ok, reason, message = outcome[entry["pci_bus_id"]]
            entry["reset"].update(attempted=True, ok=ok, reason=reason, message=message)
            entry["changed"] = entry["changed"] or ok

    # report ------------------------------------------------------------------
    def finish(self):
        for entry in self.results:
            if entry["skipped"]:
                entry["action_required"] = "none"
                entry["hint"] = None
                continue
            if self.module.check_mode:
                before = entry["mig_mode_before"]
                after = dict(before)
                if entry["needs_set"]:
                    after["pending"] = mode_name(entry["desired"])
                    if entry["architecture"] not in ("ampere",):
                        after["current"] = mode_name(entry["desired"])
                entry["mig_mode"] = after
            else:
                current, pending = self.nvml.mig_mode(entry["index"])
                entry["mig_mode"] = {"current": mode_name(current), "pending": mode_name(pending)}
            still_pending = entry["mig_mode"]["current"] != mode_name(entry["desired"])
            reset = entry["reset"]
            if not still_pending:
                entry["action_required"], entry["hint"] = "none", None
            elif entry["activation_status"] == RESET_REQUIRED or (reset["attempted"] and not reset["ok"]):
                entry["action_required"] = "reboot"
                entry["hint"] = RESET_HINTS.get(reset["reason"] or "not_supported")
            else:
                entry["action_required"] = "reset"
                entry["hint"] = ("a GPU reset applies the pending mode (reset=true), or a reboot"
                                 if not reset["reason"] else RESET_HINTS[reset["reason"]])
        public = self._public()
        result = dict(
            changed=any(e["changed"] for e in self.results),
            gpus=public,
            reset_required=any(e["action_required"] == "reset" for e in self.results),
            reboot_required=any(e["action_required"] == "reboot" for e in self.results),
        )
        if self.module._diff:
            result["diff"] = {
                "before": self._render("mig_mode_before"),
                "after": self._render("mig_mode"),
                "before_header": "MIG mode (before)",
                "after_header": "MIG mode (after)",
            }
        return result

    def _render(self, key):
        lines = []
        for e in self.results:
            mode = e.get(key)
            if mode is None:
                lines.append("%s: not MIG-capable" % e["label"])
            else:
                lines.append("%s: current=%s pending=%s" % (e["label"], mode["current"], mode["pending"]))
        return "\n".join(lines) + "\n"

    def _public(self):
        hidden = ("needs_set", "to_destroy", "blocking_pids", "label", "architecture", "desired")
        return [dict((k, v) for k, v in e.items() if k not in hidden) for e in self.results]


def main():
    argument_spec = dict(
        mode=dict(type="str", choices=["enabled", "disabled"]),
        reset=dict(type="bool", default=False),
        force=dict(type="bool", default=False),
        force_timeout=dict(type="float", default=10),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
        non_capable=dict(type="str", choices=["skip", "fail"], default="skip"),
    )
    argument_spec.update(GPU_SELECTION_ARG_SPEC)
    argument_spec.update(CONFIG_SOURCE_ARG_SPEC)
    exclusive = [("mode",) + CONFIG_SOURCE_EXCLUSIVE[0]]
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=exclusive, required_one_of=exclusive)
    with nvml_session(module) as nvml:
        manager = MigModeManager(module, nvml)
        manager.plan()
        manager.apply()
        result = manager.finish()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
