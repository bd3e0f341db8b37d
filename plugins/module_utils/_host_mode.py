# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""MIG mode on a host: which GPUs must change, whether it is safe, the change, the reset, the report.

Private to the collection and free of Ansible imports: the mig_mode module and
the boot-time restore (tools/gpuops-mig-restore) both run it. As with the
layout (_host_layout), everything is read and checked before the first change:
a GPU that cannot take its mode, or processes in the way without ``force``,
change nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ApplyError, NvmlError, RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_selection import explicitly_selected, select_gpus
from ansible_collections.gpuops.mig.plugins.module_utils._migparted import ConfigEntry, Resolution
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    MODE_PERSISTENT_ARCHITECTURES,
    RESET_HINTS,
    SBIN_DIRS,
    Nvml,
    busy_devices,
    describe_busy,
    error_name,
    find_program,
    mode_name,
    reset_gpus,
    terminate_processes,
)

ENABLED, DISABLED = 1, 0
# Keys of a GPU's record that stay inside the engine (the rest is reported).
_INTERNAL = ("needs_set", "to_destroy", "blocking_pids", "label", "architecture", "desired")


class ModeRequest(object):
    """The mode each GPU should have: {index: 0/1}, the GPUs named one by one, and for a
    config the resolution of its entries (what _host_layout plans the geometry from)."""

    def __init__(self, wanted: dict[int, int], explicit: Collection[int] = frozenset(),
                 resolution: Resolution | None = None, gpus: dict[int, dict[str, Any]] | None = None) -> None:
        self.wanted = wanted
        self.explicit = explicit
        self.resolution = resolution
        self.gpus = gpus


def request_from_selection(nvml: Nvml, mode: str, selectors: list[str]) -> ModeRequest:
    """A ModeRequest for ``mode`` ("enabled"/"disabled") on the GPUs the selectors name."""
    identities = [nvml.gpu(i) for i in range(nvml.gpu_count())]
    selected = select_gpus(identities, selectors)
    value = ENABLED if mode == "enabled" else DISABLED
    return ModeRequest(dict((g["index"], value) for g in selected), explicitly_selected(identities, selectors))


def request_from_config(nvml: Nvml, entries: Sequence[ConfigEntry], allow_unmatched: bool = False,
                        force: bool = False) -> ModeRequest:
    """A ModeRequest from a mig-parted config or inline layouts (GPUs no entry selects are left alone).

    The whole config is validated for the GPUs it selects, geometry included, before
    anything changes, with mig_config's messages: a layout no placement can hold is
    refused here, not after the mode has been changed.
    """
    resolution, gpus = host_layout.resolve(nvml, entries, allow_unmatched)
    host_layout.plan_host(nvml, resolution, gpus, force=force, check_mode=True)
    return request_from_resolution(resolution, gpus)


def request_from_resolution(resolution: Resolution, gpus: dict[int, dict[str, Any]]) -> ModeRequest:
    """A ModeRequest for a config already resolved (and validated) against this host's GPUs."""
    return ModeRequest(dict((t.gpu.index, ENABLED if t.mig_enabled else DISABLED) for t in resolution.targets),
                       resolution=resolution, gpus=gpus)


def plan(nvml: Nvml, request: ModeRequest, force: bool = False, non_capable: str = "skip") -> list[dict[str, Any]]:
    """Read every GPU of the request; raise RefusedError (changing nothing) if one cannot take its mode.

    Returns the per-GPU records that apply(), reset_pending() and report() work on.
    """
    records, problems = [], []
    for index in sorted(request.wanted):
        gpu = nvml.gpu(index)
        desired = request.wanted[index]
        record = {
            "index": gpu["index"], "uuid": gpu["uuid"], "name": gpu["name"], "pci_bus_id": gpu["pci_bus_id"],
            "label": gpu["label"], "architecture": gpu["architecture"],
            "mig_mode_persists_across_reboot": gpu["mig_mode_persists_across_reboot"],
            "desired": desired, "changed": False, "skipped": None, "destroyed": [], "terminated_pids": [],
            "activation_status": None,
            "reset": {"attempted": False, "ok": None, "reason": None, "message": None},
        }
        records.append(record)
        mode = nvml.mig_mode(index)
        if mode is None:
            record["mig_mode_before"] = record["mig_mode"] = None
            record["skipped"] = "not MIG-capable"
            if desired == ENABLED and (non_capable == "fail" or index in request.explicit):
                problems.append("%s is not MIG-capable" % gpu["label"])
            continue
        current, pending = mode
        record["mig_mode_before"] = {"current": mode_name(current), "pending": mode_name(pending)}
        record["needs_set"] = pending != desired
        record["blocking_pids"] = []
        if record["needs_set"]:
            problem = _in_the_way(nvml, record, current, force)
            if problem:
                problems.append(problem)
    if problems:
        raise RefusedError("Nothing was changed. " + " | ".join(problems), details={"gpus": public(records)})
    return records


def _in_the_way(nvml, record, current, force):
    """Record what blocks the mode change; return a message if that is not allowed."""
    index = record["index"]
    if record["desired"] == DISABLED and current == ENABLED:
        layout = nvml.layout(index)
        record["to_destroy"] = layout
        busy = busy_devices(layout)
        if busy:
            record["blocking_pids"] = sorted(set(p["pid"] for _gi, ci in busy for p in ci["processes"]))
            if not force:
                return ("%s has MIG devices with processes; disabling MIG would destroy them "
                        "(set force=true to terminate them)" % describe_busy(record["label"], busy))
    else:
        procs = nvml.gpu_processes(index)
        if procs:
            record["blocking_pids"] = [p["pid"] for p in procs]
            if not force:
                return ("%s has processes (PIDs %s); changing its MIG mode needs it idle "
                        "(drain it, or set force=true to terminate them)"
                        % (record["label"], ", ".join(str(p) for p in record["blocking_pids"])))
    return None


def apply(nvml: Nvml, records: list[dict[str, Any]], check_mode: bool = False, force_timeout: float = 10.0) -> None:
    """Set the mode of every GPU that needs it (destroying its MIG devices first when disabling).

    A failure after the first change raises ApplyError whose report says, per GPU,
    what was done; the next run continues from there.
    """
    for record in records:
        if record["skipped"] or not record["needs_set"]:
            continue
        record["changed"] = True
        if check_mode:
            record["destroyed"] = record.get("to_destroy", [])
            continue
        try:
            _set_mode(nvml, record, force_timeout)
        except NvmlError as e:
            if e.recreated:     # the put-back of a failed destroy (Nvml.destroy_gpu_instance)
                record["recreated"] = list(e.recreated)
            raise ApplyError("MIG mode change failed part-way: %s. %s" % (e, _next_run(records)),
                             public(records)) from e


def _set_mode(nvml, record, force_timeout):
    if record["blocking_pids"]:
        still = terminate_processes(record["blocking_pids"], force_timeout)
        record["terminated_pids"] = [p for p in record["blocking_pids"] if p not in still]
        if still:
            raise NvmlError("%s: processes %s survived SIGKILL" % (record["label"], still))
    for gi in record.get("to_destroy", []):
        nvml.destroy_gpu_instance(record["index"], gi["id"])
        record["destroyed"].append(gi)
    record["activation_status"] = nvml.set_mig_mode(record["index"], record["desired"] == ENABLED)


def _next_run(records):
    done = _done_text(records, "Done before the failure")
    if done is None:
        return "Nothing was changed; the next run tries again."
    return "%s The next run sets the modes still missing." % done


def _done_text(records, heading):
    """'<heading>: GPU 0 (...): ...; GPU 1 (...): ...' for what the run changed, per GPU (None:
    nothing). Compute instances put back after a failed destroy count: their MIG device UUIDs
    are new."""
    done = []
    for r in records:
        parts = []
        if r["terminated_pids"]:
            parts.append("%d process(es) terminated" % len(r["terminated_pids"]))
        if r["destroyed"]:
            parts.append("%d MIG device(s) destroyed" % len(r["destroyed"]))
        if r.get("recreated"):
            parts.append("compute instances put back with new MIG device UUIDs %s"
                         % ", ".join(r["recreated"]))
        if r["activation_status"] is not None:
            parts.append("MIG mode set to %s" % mode_name(r["desired"]))
        elif parts:
            parts.append("mode not set")
        if parts:
            done.append("%s: %s" % (r["label"], ", ".join(parts)))
    if not done:
        return None
    return "%s: %s." % (heading, "; ".join(done))


def reset_command(nvml: Nvml, records: list[dict[str, Any]], nvidia_smi: str = "nvidia-smi") -> tuple[str, dict[str, str]]:
    """(executable, environment) that reset_pending() runs, checked before any change.

    ``nvidia_smi`` is the configured program (check_program's rules). Under a driver root the
    root's own nvidia-smi stands in for the default name (Driver.smi_command); otherwise it is
    looked up in PATH and the sbin directories. When a GPU of ``records`` will be left with a
    pending mode (an Ampere GPU whose mode changes, or one whose new mode is already pending),
    a program that is not there or cannot be executed raises RefusedError, so nothing changes
    for a reset that could not run.
    """
    executable, env = nvml.driver.smi_command(nvidia_smi)
    try:
        return find_program(executable, "nvidia_smi", SBIN_DIRS), env
    except RefusedError as e:
        waiting = [r["label"] for r in records if _reset_expected(r)]
        if waiting:
            raise RefusedError("Nothing was changed. %s (reset=true, and %s would wait for a GPU reset)"
                               % (e, ", ".join(waiting)), details={"gpus": public(records)})
        return executable, env


def _reset_expected(record):
    """Whether the GPU's mode will still be pending after apply(): what a reset is for."""
    if record["skipped"]:
        return False
    current = 1 if record["mig_mode_before"]["current"] == "enabled" else 0
    if current == record["desired"]:
        return False
    # Hopper and newer switch at once; Ampere keeps the new mode pending until a reset.
    return not record["needs_set"] or record["architecture"] in MODE_PERSISTENT_ARCHITECTURES


def reset_pending(nvml: Nvml, records: list[dict[str, Any]], run_command: Callable[..., tuple[int, str, str]],
                  nvidia_smi: tuple[str, dict[str, str]]) -> None:
    """Reset the GPUs whose new mode is still pending and that nothing runs on.

    ``run_command(argv, env)`` runs nvidia-smi; ``nvidia_smi`` is (executable, env)
    (Driver.smi_command). A reset that is refused, or an nvidia-smi that cannot run,
    leaves the mode pending and is reported, never raised: the mode change itself is done.
    """
    pending = []
    for record in records:
        if record["skipped"]:
            continue
        current, _pending = nvml.mig_mode(record["index"])
        if current == record["desired"]:
            continue
        if nvml.gpu_processes(record["index"]):
            record["reset"].update(attempted=False, ok=False, reason="in_use",
                                   message="processes run on the GPU; not resetting it")
            continue
        pending.append(record)
    if not pending:
        return
    outcome = reset_gpus([r["pci_bus_id"] for r in pending], run_command, nvidia_smi)
    nvml.forget_handles()
    for record in pending:
        ok, reason, message = outcome[record["pci_bus_id"]]
        record["reset"].update(attempted=reason != "not_tried", ok=ok, reason=reason,
                               message=message)
        record["changed"] = record["changed"] or ok


def reset_timeout_message(records: list[dict[str, Any]]) -> str | None:
    """After reset_pending() and report(): what a reset that timed out leaves, for a warning
    (None when no reset timed out). Names the reset, what the run had changed before it, and
    what comes next."""
    timed_out = [r for r in records if r["reset"]["reason"] == "timed_out"]
    if not timed_out:
        return None
    resets = "; ".join("%s: %s" % (r["label"], r["reset"]["message"]) for r in timed_out)
    pending = "; ".join(pending_labels(records)) or "none"
    done = _done_text(records, "Changed before it") or "The run changed nothing before it."
    return ("The GPU reset timed out: %s. %s Still pending: %s. A reboot applies the pending "
            "modes (reboot_required is true); the next run changes no mode again and, with "
            "reset=true, tries the reset again." % (resets, done, pending))


def report(nvml: Nvml, records: list[dict[str, Any]], check_mode: bool = False) -> dict[str, Any]:
    """The modes after the run and what each GPU still needs: none, a reset, or a reboot."""
    for record in records:
        if record["skipped"]:
            record["action_required"], record["hint"] = "none", None
            continue
        if check_mode:
            after = dict(record["mig_mode_before"])
            if record["needs_set"]:
                after["pending"] = mode_name(record["desired"])
                if record["architecture"] not in MODE_PERSISTENT_ARCHITECTURES:
                    after["current"] = mode_name(record["desired"])  # Hopper and newer switch at once
            record["mig_mode"] = after
        else:
            current, pending = nvml.mig_mode(record["index"])
            record["mig_mode"] = {"current": mode_name(current), "pending": mode_name(pending)}
        record["action_required"], record["hint"] = _still_needed(record)
    return {
        "changed": any(r["changed"] for r in records),
        "gpus": public(records),
        "reset_required": any(r["action_required"] == "reset" for r in records),
        "reboot_required": any(r["action_required"] == "reboot" for r in records),
    }


def _still_needed(record):
    if record["mig_mode"]["current"] == mode_name(record["desired"]):
        return "none", None
    reset = record["reset"]
    if error_name(record["activation_status"]) == "NVML_ERROR_RESET_REQUIRED" or (reset["attempted"] and not reset["ok"]):
        return "reboot", RESET_HINTS.get(reset["reason"] or "not_supported")
    if not reset["reason"]:
        return "reset", "a GPU reset applies the pending mode (reset=true), or a reboot"
    return "reset", RESET_HINTS[reset["reason"]]


def pending_labels(records: list[dict[str, Any]]) -> list[str]:
    """'GPU 0 (...) (wants enabled, current disabled)' for each GPU whose mode is still not current."""
    return ["%s (wants %s, current %s)" % (r["label"], mode_name(r["desired"]), r["mig_mode"]["current"])
            for r in records if not r["skipped"] and r["action_required"] != "none"]


def diff(records: list[dict[str, Any]]) -> dict[str, str]:
    """Readable before/after MIG modes per GPU."""
    return {"before": _render(records, "mig_mode_before"), "after": _render(records, "mig_mode"),
            "before_header": "MIG mode (before)", "after_header": "MIG mode (after)"}


def _render(records, key):
    lines = []
    for record in records:
        mode = record.get(key)
        if mode is None:
            lines.append("%s: not MIG-capable" % record["label"])
        else:
            lines.append("%s: current=%s pending=%s" % (record["label"], mode["current"], mode["pending"]))
    return "\n".join(lines) + "\n"


def public(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records as the module returns them."""
    return [dict((k, v) for k, v in r.items() if k not in _INTERNAL) for r in records]
