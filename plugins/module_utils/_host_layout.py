# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""MIG geometry on a host: read it from NVML, plan it with _gpu_layout, apply the plan.

Private to the collection and free of Ansible imports: the mig_config module
and the boot-time restore (tools/gpuops-mig-restore) both run it. The order is
always the same: resolve the config for every GPU, read and plan every GPU,
and only then change anything, so bad input changes nothing.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._errors import (
    ApplyError,
    ConfigError,
    NvmlError,
    RefusedError,
)
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import mig_device_name
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml, terminate_processes

# Compute-instance profile constants by SM-slice count (NVML_COMPUTE_INSTANCE_PROFILE_*).
_CI_CONSTANT = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


# -- input -------------------------------------------------------------------

def load_entries(config: str | bytes | Mapping[str, Any] | None = None, config_file: str | None = None,
                 config_name: str | None = None, layouts: list[Mapping[str, Any]] | None = None,
                 origin: str | None = None) -> tuple[migparted.ConfigEntry, ...]:
    """ConfigEntry values from a mig-parted config (inline or a file) or inline layouts.

    ``origin`` names where an inline config or layouts came from (e.g. a ConfigMap), for
    messages."""
    if layouts is not None:
        return migparted.entries_from_layouts(layouts, origin=origin or "layouts")
    if config_file is not None:
        parsed = migparted.load_config(migparted.read_config_file(config_file), origin=config_file)
    else:
        parsed = migparted.load_config(config, origin=origin or "mig-parted config")
    return parsed.select(config_name)


def resolve(nvml: Nvml, entries: Sequence[migparted.ConfigEntry],
            allow_unmatched: bool = False) -> tuple[migparted.Resolution, dict[int, dict[str, Any]]]:
    """Match entries to this host's GPUs; returns (Resolution, {index: gpu identity})."""
    gpus = {}
    host = []
    for index in range(nvml.gpu_count()):
        gpu = nvml.gpu(index)
        gpus[index] = gpu
        host.append(migparted.HostGpu(index=index, pci_device_id=gpu["pci_device_id"],
                                      mig_capable=nvml.mig_mode(index) is not None, name=gpu["name"]))
    resolution = migparted.resolve_targets(entries, host, allow_unmatched=allow_unmatched)
    if not allow_unmatched:
        # An entry that selects nothing is fine when its device-filter names
        # another GPU model (one config serves a mixed fleet); otherwise it is
        # almost certainly a mistake.
        for entry in resolution.unmatched:
            if not entry.device_filter:
                raise ConfigError("%s selects no MIG-capable GPU on this host" % entry.label)
        if entries and not resolution.targets and not resolution.skipped:
            raise ConfigError("no entry of the config selects a GPU on this host: %s"
                              % migparted.unmatched_text(resolution.unmatched, host))
    return resolution, gpus


def checkpoint_layouts(gpus: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The exact layout of GPUs described by Nvml.describe(), as inline layouts mig_config takes back.

    One layout per MIG-capable GPU: its index, its PCI device ID as device_filter (so the
    checkpoint is refused on a different GPU model at that index), its current MIG mode,
    and when MIG is enabled every GPU instance as a devices item pinned at its placement
    with its compute instances at theirs (a single compute instance spanning the GPU
    instance is left implicit). GPU instances without a compute instance hold no MIG
    device and are left out.
    """
    layouts = []
    for gpu in gpus:
        if not gpu.get("mig_capable"):
            continue
        pci = gpu["pci_device_id"]
        item = {"gpus": [gpu["index"]],
                "device_filter": "0x%08X" % pci if isinstance(pci, int) else migparted.normalize_pci_id(pci),
                "mig_enabled": bool(gpu["mig_enabled"])}
        if gpu["mig_enabled"]:
            devices = []
            for gi in sorted(gpu["gpu_instances"], key=lambda g: g["placement"]["start"]):
                cis = sorted(gi["compute_instances"], key=lambda c: c["placement"]["start"])
                if not cis:
                    continue
                device = {"profile": gi["profile"], "placement": dict(gi["placement"])}
                if not (len(cis) == 1 and cis[0]["profile"] == gi["profile"] and cis[0]["placement"]["start"] == 0):
                    device["compute_instances"] = [{"profile": ci["profile"], "placement": dict(ci["placement"])}
                                                   for ci in cis]
                devices.append(device)
            item["devices"] = devices
        layouts.append(item)
    return layouts


# -- reading -----------------------------------------------------------------

def derived_ci_profiles(gi_name: str, gi_sm_slices: int) -> tuple[layout.CiProfile, ...]:
    """Compute-instance profiles of a GI profile, by the rule NVIDIA's tools use.

    NVML lists CI profiles only for an existing GPU instance, so planning a new
    one needs the rule: c == g, or c < g with 2c <= g + 1; floor(g / c) of
    them, at starts that are multiples of c. The placements are assumed (see
    docs/simulator.md), and the driver rejects a wrong one before any change.
    """
    profiles = []
    for c, constant in sorted(_CI_CONSTANT.items()):
        if c > gi_sm_slices or (c < gi_sm_slices and 2 * c > gi_sm_slices + 1):
            continue
        starts = tuple(s for s in range(0, gi_sm_slices, c) if s + c <= gi_sm_slices)
        profiles.append(layout.CiProfile(id=constant, sm_slices=c, max_count=gi_sm_slices // c,
                                         placements=starts if c < gi_sm_slices else (0,),
                                         name=mig_device_name(c, gi_sm_slices, gi_name)))
    return tuple(profiles)


def read_geometry(nvml: Nvml, index: int) -> layout.GpuGeometry:
    """The GPU model's geometry as the planner needs it, from NVML's profile list."""
    profiles = nvml.gi_profiles(index)
    if not profiles:
        raise RefusedError("%s lists no MIG profiles (an older driver lists them only while MIG is enabled)"
                           % nvml.gpu(index)["label"])
    return geometry_from_profiles(profiles)


def geometry_from_profiles(profiles: Sequence[Mapping[str, Any]]) -> layout.GpuGeometry:
    """A GPU's geometry from its GPU-instance profiles as mig_facts reports them (supported_profiles)."""
    gi_profiles = []
    for p in profiles:
        nvml_name = p.get("nvml_name")
        aliases = (nvml_name,) if nvml_name and nvml_name != p["name"] else ()
        gi_profiles.append(layout.GiProfile(
            id=p["id"], name=p["name"], memory_slices=p["memory_slices"], sm_slices=p["sm_slices"],
            max_count=p["max_count"], placements=tuple(p["placements"]),
            ci_profiles=derived_ci_profiles(p["name"], p["sm_slices"]), aliases=aliases))
    memory_slices = max(p["memory_slices"] + max(p["placements"] or [0]) for p in profiles)
    sm_slices = max(p["sm_slices"] for p in profiles)
    return layout.GpuGeometry(memory_slices=memory_slices, sm_slices=sm_slices, profiles=tuple(gi_profiles))


def read_layout(nvml: Nvml, index: int, holders: dict[str, tuple[str, ...]] | None = None
                ) -> tuple[layout.GpuInstance, ...]:
    """The GPU's instances as planner values (ids, placements, PIDs, UUIDs).

    holders: {device UUID: ("namespace/pod/container", ...)} from the kubelet (_podresources); a MIG
    device's pods are its own and those holding its whole GPU by the GPU's UUID.
    """
    holders = holders or {}
    whole_gpu = holders.get(nvml.gpu(index)["uuid"], ()) if holders else ()
    instances = []
    for gi in nvml.layout(index):
        cis = tuple(layout.ComputeInstance(ci_id=ci["id"], profile_id=ci["profile_id"],
                                           start=ci["placement"]["start"],
                                           pids=tuple(p["pid"] for p in ci["processes"]),
                                           uuid=ci["mig_device_uuid"],
                                           pods=holders.get(ci["mig_device_uuid"], ()) + whole_gpu)
                    for ci in gi["compute_instances"])
        instances.append(layout.GpuInstance(gi_id=gi["id"], profile_id=gi["profile_id"],
                                            start=gi["placement"]["start"], compute_instances=cis))
    return tuple(instances)


# -- planning ----------------------------------------------------------------

class GpuWork(object):
    """Everything about one GPU between planning and reporting."""

    def __init__(self, target: migparted.GpuTarget, gpu: dict[str, Any], mode: tuple[int, int] | None) -> None:
        self.target = target
        self.gpu = gpu
        self.index = gpu["index"]
        self.label = gpu["label"]
        self.current_mode = mode          # (current, pending)
        self.geometry = None
        self.before = ()
        self.plan = None
        self.mode_mismatch = None         # text when the MIG mode is not what the entry wants
        self.done = []
        self.after = None


def plan_host(nvml: Nvml, resolution: migparted.Resolution, gpus: dict[int, dict[str, Any]], force: bool = False,
              check_mode: bool = False, evict_pods: bool = False,
              holders: dict[str, tuple[str, ...]] | None = None) -> list[GpuWork]:
    """Read and plan every targeted GPU; raise RefusedError before any change.

    evict_pods: plan as if the pods holding devices may be evicted (the plans name them in
    evicted_pods); for deciding what to evict. apply_host destroys a device a pod holds only when told.
    holders: which pods hold which device ({device UUID: holders}, see read_layout); None: not read.
    """
    work = []
    problems = []
    refusals = []       # per refused GPU, as data: the result key refusals (docs/dynamic.md)
    planned = {}
    for target in resolution.targets:
        gpu = gpus[target.gpu.index]
        mode = nvml.mig_mode(gpu["index"])
        item = GpuWork(target, gpu, mode)
        work.append(item)
        enabled_now = mode[0] == 1
        if target.mig_enabled != enabled_now:
            item.mode_mismatch = "%s: %s wants MIG %s, but it is %s%s" % (
                item.label, target.entry.label, "enabled" if target.mig_enabled else "disabled",
                "enabled" if enabled_now else "disabled",
                " (apply the mode first: gpuops.mig.mig_mode with the same config)")
            if not check_mode:
                problems.append(item.mode_mismatch)
                refusals.append(_refusal(item, item.mode_mismatch))
                continue
        if not target.mig_enabled:
            continue  # MIG off: no geometry to plan
        try:
            item.geometry = read_geometry(nvml, item.index)
            item.before = read_layout(nvml, item.index, holders) if enabled_now else ()
        except RefusedError as e:
            if item.mode_mismatch is None:
                problems.append("%s: %s: %s" % (item.label, target.entry.label, e))
                refusals.append(_refusal(item, problems[-1]))
            # else: check mode before the mode change on an older driver; the mode change is the
            # news.
            continue
        except layout.LayoutError as e:
            problems.append("%s: %s: %s" % (item.label, target.entry.label, e))
            refusals.append(_refusal(item, problems[-1]))
            continue
        planned[item.index] = item
    # One node: a pod holding devices on several GPUs is evicted once (layout.plan_node_gpus).
    requests = dict((i, (item.geometry, item.before, item.target.mig_devices, item.target.pinned))
                    for i, item in planned.items())
    plans = layout.plan_node_gpus(requests, force=force, evict_pods=evict_pods)
    for index, item in sorted(planned.items()):
        if isinstance(plans[index], layout.LayoutError):
            problems.append("%s: %s: %s" % (item.label, item.target.entry.label, plans[index]))
            refusals.append(_refusal(item, problems[-1], plans[index]))
        else:
            item.plan = plans[index]
    if problems:
        raise RefusedError("Nothing was changed. " + " | ".join(problems),
                           details={"refusals": refusals})
    return work


def _refusal(item, message, error=None):
    """One GPU's refusal as data. reason ``allocated``: only devices that pods hold stand in the
    way (``devices``, each with its ``pods``); ``other``: anything else (busy processes, a bad
    target, the mode)."""
    details = error.details if error is not None else {}
    allocated = details.get("allocated") or []
    only_pods = bool(allocated) and not details.get("busy")
    return {"gpu": item.index, "reason": "allocated" if only_pods else "other", "message": message,
            "devices": allocated}


# -- acting ------------------------------------------------------------------

def apply_host(nvml: Nvml, work: list[GpuWork], force_timeout: float = 10.0, destroy_allocated: bool = False) -> None:
    """Carry out the plans GPU by GPU: destroy, then create with explicit placements.

    A GPU instance whose compute instances cannot all be created is destroyed
    again, so no half-made device stays. On failure ApplyError.report lists
    per GPU what was done and what was not; a new run converges from there.
    A plan that destroys a device allocated to a pod is refused before any change (its pods must be
    evicted first), unless destroy_allocated (mig_config's force).
    """
    held = ["%s: MIG device %s is allocated to %s" % (item.label, ci.uuid or "GI %s CI %s" % (gi.gi_id, ci.ci_id),
                                                      ", ".join(ci.pods))
            for item in work if item.plan is not None for gi, ci in item.plan.destroyed_compute_instances() if ci.pods]
    if held and not destroy_allocated:
        raise RefusedError("Nothing was changed. %s; evict those pods first" % "; ".join(held))
    for item in work:
        if item.plan is None or not item.plan.changed:
            continue
        try:
            _apply_gpu(nvml, item, force_timeout)
        except NvmlError as e:
            # The adapter's message already names the GPU.
            raise ApplyError("MIG geometry failed part-way: %s. The next run continues from here." % e,
                             report(work, failed=item, error=str(e))) from e


def _apply_gpu(nvml, item, force_timeout):
    plan, index = item.plan, item.index
    busy_pids = sorted(set(p for _gi, ci in plan.destroyed_compute_instances() for p in ci.pids))
    if busy_pids:  # only reachable with force; planning refused otherwise
        survivors = terminate_processes(busy_pids, force_timeout)
        item.done.append({"action": "terminate", "pids": busy_pids})
        if survivors:
            raise NvmlError("processes %s survived SIGKILL" % survivors)
    # A kept GPU instance's compute instances change in one go (CI placements are inside
    # the GI, so nothing else frees room for them), and go back as they were on a failure.
    for change in plan.change:
        _change_compute_instances(nvml, item, change)
    for gi in plan.destroy:
        nvml.destroy_gpu_instance(index, gi.gi_id)   # puts its CIs back if the GI destroy fails
        item.done.append(_step("destroy_gi", item, gi))
    for gi in plan.create:
        profile = item.geometry.gi_profile(gi.profile_id)
        gi_id = nvml.create_gpu_instance(index, gi.profile_id, gi.start, profile.memory_slices)
        try:
            for ci in gi.compute_instances:
                nvml.create_compute_instance(index, gi_id, ci.profile_id, ci.start)
        except NvmlError as e:
            _remove_half_made(nvml, item, gi_id, e)
        item.done.append(_step("create_gi", item, gi, gi_id=gi_id))


def _change_compute_instances(nvml, item, change):
    """Replace compute instances inside a kept GPU instance; on a failure put the old ones back."""
    gi_id = change.gi.gi_id
    gone, made = [], []
    try:
        for ci in change.destroy:
            nvml.destroy_compute_instance(item.index, gi_id, ci.ci_id)
            gone.append(ci)
            item.done.append(_step("destroy_ci", item, change.gi, ci))
        for ci in change.create:
            made.append((ci, nvml.create_compute_instance(item.index, gi_id, ci.profile_id, ci.start)))
            item.done.append(_step("create_ci", item, change.gi, ci))
    except NvmlError as e:
        if not gone and not made:
            raise
        raise NvmlError("%s; %s" % (e, _undo_change(nvml, item, change, gone, made)), e.code, e.name) from e


def _undo_change(nvml, item, change, gone, made):
    """Destroy the compute instances just made and create the destroyed ones again; what happened."""
    where = nvml.describe_gpu_instance(item.index, change.gi.gi_id)
    kept = set(nvml.gpu_instance_uuids(item.index, change.gi.gi_id))
    try:
        for ci, ci_id in made:
            nvml.destroy_compute_instance(item.index, change.gi.gi_id, ci_id)
            item.done.append(_step("destroy_ci", item, change.gi, ci))
        for ci in gone:
            nvml.create_compute_instance(item.index, change.gi.gi_id, ci.profile_id, ci.start)
            item.done.append(_step("create_ci", item, change.gi, ci))
    except NvmlError as e:
        return ("putting its compute instances back as they were failed (%s): %s of %s may be left without some "
                "of its compute instances until the next run, which creates the ones the layout asks for"
                % (e, where, item.label))
    uuids = ""
    if gone:
        new = [u for u in nvml.gpu_instance_uuids(item.index, change.gi.gi_id) if u not in kept]
        uuids = ", new MIG device UUIDs%s" % (" " + ", ".join(new) if new else "")
    return ("its compute instances were put back as they were (same profiles and placements%s), "
            "so %s is whole" % (uuids, where))


def _remove_half_made(nvml, item, gi_id, error):
    """Destroy a GPU instance just created whose compute instances could not all be made; raise ``error``."""
    try:
        nvml.destroy_gpu_instance(item.index, gi_id)  # no GPU instance without its devices
    except NvmlError as cleanup:
        raise NvmlError("%s; removing the new %s again failed too (%s): it is left without some of its compute "
                        "instances until the next run, which destroys it or creates the ones the layout asks for"
                        % (error, nvml.describe_gpu_instance(item.index, gi_id), cleanup),
                        error.code, error.name) from error
    raise error


def _step(action, item, gi, ci=None, gi_id=None):
    profile = item.geometry.gi_profile(gi.profile_id)
    step = {"action": action, "gpu": item.index, "gi_id": gi_id if gi_id is not None else gi.gi_id,
            "profile": profile.name, "placement": {"start": gi.start, "size": profile.memory_slices}}
    if ci is not None:
        step["ci_id"] = ci.ci_id
        step["device"] = item.geometry.device_name(gi.profile_id, ci.profile_id)
    return step


# -- reporting ---------------------------------------------------------------

def item_changed(item: GpuWork) -> bool:
    """A GPU changes when its plan does, or (check mode) when its mode is not yet right."""
    return bool(item.mode_mismatch) or bool(item.plan is not None and item.plan.changed)


def reread(nvml: Nvml, work: list[GpuWork]) -> None:
    """Read the resulting layouts (UUIDs of new devices included)."""
    for item in work:
        if item.geometry is not None and nvml.mig_mode(item.index)[0] == 1:
            item.after = read_layout(nvml, item.index)


def report(work: list[GpuWork], failed: GpuWork | None = None, error: str | None = None) -> list[dict[str, Any]]:
    """Per GPU: what the plan is, what was done, and (after a failure) what was not."""
    out = []
    for item in work:
        entry = {
            "index": item.index,
            "uuid": item.gpu["uuid"],
            "name": item.gpu["name"],
            "entry": item.target.entry.label,
            "mig_enabled": item.target.mig_enabled,
            "mode_mismatch": item.mode_mismatch,
            "changed": item_changed(item),
            "target": dict(item.target.mig_devices),
            "plan": layout.plan_as_dict(item.geometry, item.plan) if item.plan is not None else None,
            "done": item.done,
        }
        if item.after is not None:
            entry["devices"] = layout.layout_as_list(item.geometry, item.after)
            entry["mig_devices"] = layout.device_counts(item.geometry, item.after)
        if failed is item:
            entry["error"] = error
            entry["not_done"] = "the rest of this GPU's plan, and every GPU after it"
        out.append(entry)
    return out


def diff(work: list[GpuWork], check_mode: bool) -> dict[str, str]:
    """Readable before/after layouts per GPU (after = the plan's result in check mode)."""
    before, after = [], []
    for item in work:
        if item.geometry is None:
            continue
        result = item.plan.result if (check_mode or item.after is None) and item.plan else (item.after or ())
        before.append("%s\n%s" % (item.label, _indent(layout.describe_layout(item.geometry, item.before))))
        after.append("%s\n%s" % (item.label, _indent(layout.describe_layout(item.geometry, result))))
    return {"before": "".join(before), "after": "".join(after),
            "before_header": "MIG layout (before)", "after_header": "MIG layout (after)"}


def _indent(text):
    return "".join("  %s\n" % line for line in text.splitlines()) or "  (no MIG devices)\n"
