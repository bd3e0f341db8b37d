# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

# MIG layout model and minimal-disruption planner.
#
# Pure Python (stdlib only, no NVML, no Ansible) so it can be tested on its own
# and run at boot. The NVML adapter describes a GPU model as a GpuGeometry and
# its current state as GpuInstance/ComputeInstance values; plan_gpu() turns a
# mig-parted style target ({device name: count}) into a GpuPlan with explicit
# placements. docs/planner.md explains the search and its guarantees.
#
# Units: GI placements count memory slices, CI placements count SM slices
# inside their GI, as NVML reports them.

import itertools
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._errors import LayoutError

__all__ = [
    "LayoutError",
    "CiProfile",
    "GiProfile",
    "GpuGeometry",
    "DeviceType",
    "ComputeInstance",
    "GpuInstance",
    "GiChange",
    "GpuPlan",
    "PinnedGi",
    "pod_name",
    "resolve_pins",
    "normalize_target",
    "validate_target",
    "validate_layout",
    "plan_gpu",
    "check_plan",
    "device_counts",
    "describe_layout",
    "layout_as_list",
    "plan_as_dict",
    "largest_free_range",
]


# --------------------------------------------------------------------------
# GPU model description (filled from NVML by the adapter, or from test tables)
# --------------------------------------------------------------------------

def mig_device_name(ci_sm_slices: int, gi_sm_slices: int, gi_name: str) -> str:
    """The MIG device name: the GI name when the CI uses the whole GI, else '<c>c.<gi name>' (mig-parted's)."""
    if ci_sm_slices == gi_sm_slices:
        return gi_name
    return "%dc.%s" % (ci_sm_slices, gi_name)


@dataclass(frozen=True)
class CiProfile:
    """A compute-instance profile inside one GPU-instance profile."""

    id: int              # NVML CI profile id (equals the COMPUTE_INSTANCE_PROFILE_* constant)
    sm_slices: int       # c
    max_count: int       # how many fit in one GI of the parent profile
    placements: tuple    # legal start offsets, in SM slices inside the GI
    name: str            # MIG device name: "1c.3g.20gb"; the GI name when c == g

    def __post_init__(self):
        object.__setattr__(self, "placements", tuple(self.placements))


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile as NVML reports it for one GPU model."""

    id: int              # NVML profile ID (device specific: 9 is 3g on A100, other things elsewhere)
    name: str            # canonical name, e.g. "3g.20gb", "1g.5gb+me"
    memory_slices: int   # placement size
    sm_slices: int       # g
    max_count: int
    placements: tuple    # legal start offsets, in memory slices
    ci_profiles: tuple   # CiProfile, ...
    aliases: tuple = ()  # other accepted spellings (driver name drift such as 1g.23gb / 1g.24gb)

    def __post_init__(self):
        object.__setattr__(self, "placements", tuple(self.placements))
        object.__setattr__(self, "ci_profiles", tuple(self.ci_profiles))
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def ci_profile(self, ci_profile_id: int) -> CiProfile | None:
        for ci in self.ci_profiles:
            if ci.id == ci_profile_id:
                return ci
        return None


@dataclass(frozen=True)
class DeviceType:
    """One kind of MIG device: a CI profile inside a GI profile, under its canonical name."""

    name: str
    gi: GiProfile
    ci: CiProfile   # the CI profile used when creating this kind of device

    @property
    def is_full(self) -> bool:
        return self.ci.sm_slices == self.gi.sm_slices


@dataclass(frozen=True)
class GpuGeometry:
    """Everything the planner needs to know about one GPU model."""

    memory_slices: int   # 8 on A100/H100/H200/B200, 4 on A30
    sm_slices: int       # 7 or 4
    profiles: tuple      # GiProfile, ...
    # Indexes built once in __post_init__; not part of equality.
    _gi_by_id: dict = field(default=None, init=False, repr=False, compare=False)
    _types: dict = field(default=None, init=False, repr=False, compare=False)
    _spellings: dict = field(default=None, init=False, repr=False, compare=False)
    _name_of: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "profiles", tuple(self.profiles))
        gi_by_id, types, spellings, name_of = {}, {}, {}, {}
        for gi in self.profiles:
            if gi.id in gi_by_id:
                raise LayoutError("GPU geometry lists GPU instance profile ID %d twice" % gi.id)
            gi_by_id[gi.id] = gi
            _check_profile_fits(self, gi)
        # Canonical names first, so an alias never hides a real profile name.
        for gi in sorted(self.profiles, key=lambda p: p.id):
            for ci in sorted(gi.ci_profiles, key=lambda p: p.id):
                name = gi.name if ci.sm_slices == gi.sm_slices else ci.name
                if name in types and types[name].gi.id != gi.id:
                    raise LayoutError(
                        "GPU geometry names two GPU instance profiles %r (IDs %d and %d)"
                        % (name, types[name].gi.id, gi.id))
                # Two CI profile ids with one name (e.g. a revision): the lowest id creates.
                if name not in types:
                    types[name] = DeviceType(name, gi, ci)
                    spellings[name] = name
                name_of[(gi.id, ci.id)] = name
        for gi in self.profiles:
            for alias in gi.aliases:
                for ci in gi.ci_profiles:
                    canonical = name_of[(gi.id, ci.id)]
                    spelled = mig_device_name(ci.sm_slices, gi.sm_slices, alias)
                    spellings.setdefault(spelled, canonical)
        object.__setattr__(self, "_gi_by_id", gi_by_id)
        object.__setattr__(self, "_types", types)
        object.__setattr__(self, "_spellings", spellings)
        object.__setattr__(self, "_name_of", name_of)

    def gi_profile(self, profile_id: int) -> GiProfile | None:
        """The GiProfile with this NVML profile ID, or None."""
        return self._gi_by_id.get(profile_id)

    def device_type(self, name: str) -> DeviceType:
        """The DeviceType for a canonical name or alias; LayoutError listing valid names if unknown."""
        canonical = self._spellings.get(name) if isinstance(name, str) else None
        if canonical is None:
            raise LayoutError("unknown MIG profile %r for this GPU model; valid profiles: %s"
                              % (name, ", ".join(self.device_names())))
        return self._types[canonical]

    def device_name(self, gi_profile_id: int, ci_profile_id: int) -> str | None:
        """Canonical MIG device name of a CI profile inside a GI profile (None if unknown)."""
        return self._name_of.get((gi_profile_id, ci_profile_id))

    def device_names(self) -> list[str]:
        """All canonical device names, smallest first."""
        return [t.name for t in sorted(self._types.values(), key=_type_order)]


def _type_order(device_type):
    # GI by size, then its full device before its compute-instance forms.
    gi, ci = device_type.gi, device_type.ci
    return (gi.sm_slices, gi.memory_slices, gi.name, ci.sm_slices != gi.sm_slices, ci.sm_slices, ci.id)


def _check_profile_fits(geometry, gi):
    if gi.memory_slices < 1 or gi.sm_slices < 1 or gi.max_count < 1:
        raise LayoutError("GPU geometry: profile %s has non-positive sizes" % gi.name)
    for start in gi.placements:
        if start < 0 or start + gi.memory_slices > geometry.memory_slices:
            raise LayoutError("GPU geometry: profile %s placement %d:%d is outside %d memory slices"
                              % (gi.name, start, gi.memory_slices, geometry.memory_slices))
    if gi.sm_slices > geometry.sm_slices:
        raise LayoutError("GPU geometry: profile %s has more SM slices than the GPU" % gi.name)
    for ci in gi.ci_profiles:
        for start in ci.placements:
            if start < 0 or start + ci.sm_slices > gi.sm_slices:
                raise LayoutError("GPU geometry: compute profile %s placement %d:%d is outside its %dg GPU instance"
                                  % (ci.name, start, ci.sm_slices, gi.sm_slices))


# --------------------------------------------------------------------------
# What is on a GPU (now, or after a plan)
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class ComputeInstance:
    """A compute instance, i.e. one MIG device. ci_id is None until it is created."""

    ci_id: object        # int, or None for one the plan creates
    profile_id: int      # NVML CI profile id
    start: int           # placement start, SM slices inside the GI
    pids: tuple = ()     # processes running on it; non-empty means busy
    uuid: object = None  # "MIG-..." when known
    pods: tuple = ()     # "namespace/pod/container" it is allocated to (kubelet PodResources); non-empty means allocated

    def __post_init__(self):
        object.__setattr__(self, "pids", tuple(self.pids))
        object.__setattr__(self, "pods", tuple(self.pods))

    @property
    def busy(self) -> bool:
        """Processes run on it."""
        return bool(self.pids)

    @property
    def allocated(self) -> bool:
        """Kubernetes allocated it to a pod (which may not run anything on it yet)."""
        return bool(self.pods)

    @property
    def pod_names(self) -> tuple[str, ...]:
        """The pods ("namespace/pod") it is allocated to; several under time-slicing."""
        return tuple(sorted({pod_name(holder) for holder in self.pods}))


def pod_name(holder: str) -> str:
    """"namespace/pod" of a "namespace/pod/container" holder: a pod is evicted whole, whatever
    container holds the device (Kubernetes names contain no "/")."""
    return "/".join(str(holder).split("/")[:2])


@dataclass(frozen=True)
class GpuInstance:
    """A GPU instance with its compute instances. gi_id is None until it is created.

    compute_instances may be given as ComputeInstance values or as plain
    (ci_id, profile_id, start, pids) tuples.
    """

    gi_id: object        # int, or None for one the plan creates
    profile_id: int      # NVML GI profile ID
    start: int           # placement start, memory slices
    compute_instances: tuple = ()

    def __post_init__(self):
        cis = tuple(ci if isinstance(ci, ComputeInstance) else ComputeInstance(*ci)
                    for ci in self.compute_instances)
        object.__setattr__(self, "compute_instances", tuple(sorted(cis, key=_ci_order)))


def _ci_order(ci):
    return (ci.start, ci.profile_id, -1 if ci.ci_id is None else ci.ci_id)


def _gi_order(gi):
    return (gi.start, gi.profile_id, -1 if gi.gi_id is None else gi.gi_id)


@dataclass(frozen=True)
class GiChange:
    """A GPU instance that is kept while compute instances inside it change."""

    gi: GpuInstance      # the GI as it is now
    destroy: tuple       # its ComputeInstances to destroy
    create: tuple        # new ComputeInstances (ci_id None) to create in it


@dataclass(frozen=True)
class GpuPlan:
    """What to do on one GPU. Run every destroy before any create; within each
    group the order does not matter because every placement is explicit and the
    result is a valid layout. Destroy CIs before their GI."""

    keep: tuple          # GpuInstances kept as they are (with all their CIs and UUIDs)
    change: tuple        # GiChange: GI kept, some CIs destroyed and/or created inside it
    destroy: tuple       # GpuInstances destroyed together with all their CIs
    create: tuple        # new GpuInstances (gi_id None) with their new CIs (ci_id None)
    result: tuple        # the layout afterwards; new parts have None ids

    @property
    def changed(self) -> bool:
        return bool(self.change or self.destroy or self.create)

    @property
    def destroyed_devices(self) -> int:
        return (sum(len(gi.compute_instances) for gi in self.destroy)
                + sum(len(c.destroy) for c in self.change))

    @property
    def created_devices(self) -> int:
        return (sum(len(gi.compute_instances) for gi in self.create)
                + sum(len(c.create) for c in self.change))

    def destroyed_compute_instances(self) -> list[tuple[GpuInstance, ComputeInstance]]:
        """(GpuInstance, ComputeInstance) pairs for every MIG device the plan destroys."""
        pairs = [(gi, ci) for gi in self.destroy for ci in gi.compute_instances]
        pairs += [(c.gi, ci) for c in self.change for ci in c.destroy]
        return pairs

    @property
    def evicted_pods(self) -> tuple[tuple[str, tuple[tuple[GpuInstance, ComputeInstance], ...]], ...]:
        """The pods that must go because the plan destroys a device allocated to them, in name
        order: ((pod, ((GpuInstance, ComputeInstance), ...)), ...), each pod once whatever number
        of its devices go."""
        devices = {}
        for gi, ci in self.destroyed_compute_instances():
            for pod in ci.pod_names:
                devices.setdefault(pod, []).append((gi, ci))
        return tuple((pod, tuple(devices[pod])) for pod in sorted(devices))


# --------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------

def normalize_target(geometry: GpuGeometry, target: Any) -> dict[str, int]:
    """Map a mig-parted style {device name: count} to canonical names, dropping zeros.

    Aliases are folded into their canonical name. Raises LayoutError for an
    unknown name (listing the valid ones) or a count that is not a
    non-negative integer.
    """
    if not isinstance(target, Mapping):
        raise LayoutError("MIG devices must be a mapping of profile name to count, got %s"
                          % type(target).__name__)
    counts = {}
    for name, count in target.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LayoutError("count for MIG profile %r must be a non-negative integer, got %r" % (name, count))
        device_type = geometry.device_type(name)
        if count:
            counts[device_type.name] = counts.get(device_type.name, 0) + count
    order = {n: i for i, n in enumerate(geometry.device_names())}
    return dict(sorted(counts.items(), key=lambda item: order[item[0]]))


def validate_target(geometry: GpuGeometry, target: Mapping[str, int],
                    reserved: Sequence[GpuInstance] = ()) -> dict[str, int]:
    """Normalize a target and prove it fits on an empty GPU of this model.

    Returns the normalized {canonical name: count}. Raises LayoutError naming
    the problem: unknown profile, more instances than fit, too many SM slices,
    or a combination that no placement can hold.

    reserved: GpuInstances that will be there too (pinned placements, see
    resolve_pins); the target must fit in what they leave.
    """
    counts = normalize_target(geometry, target)
    reserved_mask, reserved_sm, reserved_count = _reservation(geometry, reserved)
    besides = " besides the pinned GPU instances" if reserved else ""
    gis_needed = {}
    for name, count in counts.items():
        device_type = geometry.device_type(name)
        per_gi = _capacity(device_type)
        if per_gi == 0:
            raise LayoutError("%s cannot be created on this GPU model (its compute profile has no usable placement)"
                              % name)
        gis = -(-count // per_gi)
        room = device_type.gi.max_count - reserved_count.get(device_type.gi.id, 0)
        if gis > room:
            if device_type.is_full:
                raise LayoutError("%s x%d requested, but this GPU model holds at most %d%s"
                                  % (name, count, room, besides))
            raise LayoutError("%s x%d needs %d GPU instances of %s (%d compute instances each), "
                              "but this GPU model holds at most %d%s"
                              % (name, count, gis, device_type.gi.name, per_gi, room, besides))
        gis_needed[device_type.gi.id] = gis_needed.get(device_type.gi.id, 0) + gis
    for gi_id, gis in gis_needed.items():
        gi = geometry.gi_profile(gi_id)
        room = gi.max_count - reserved_count.get(gi_id, 0)
        if gis > room:
            raise LayoutError("the requested devices need %d GPU instances of %s (one compute profile "
                              "per GPU instance), but this GPU model holds at most %d%s"
                              % (gis, gi.name, room, besides))
    sm_used = sum(geometry.gi_profile(gi_id).sm_slices * n for gi_id, n in gis_needed.items())
    if sm_used + reserved_sm > geometry.sm_slices:
        raise LayoutError("the requested devices (%s) need %d SM slices%s, but this GPU model has %d"
                          % (_counts_text(counts), sm_used,
                             " plus %d for the pinned GPU instances" % reserved_sm if reserved else "",
                             geometry.sm_slices))
    if _best_placement(geometry, reserved_mask, tuple(sorted(gis_needed.items())), {}) is None:
        raise LayoutError("no placement can hold %s%s on this GPU model (%d memory slices; %s)"
                          % (_counts_text(counts), besides, geometry.memory_slices,
                             "; ".join("%s at %s" % (geometry.gi_profile(g).name,
                                                     _placements_text(geometry.gi_profile(g)))
                                       for g, dummy in sorted(gis_needed.items()))))
    return counts


def _reservation(geometry, reserved):
    """(memory-slice mask, SM slices, {GI profile ID: count}) that reserved GpuInstances take."""
    mask, sm, count = 0, 0, {}
    for gi in reserved:
        profile = geometry.gi_profile(gi.profile_id)
        mask |= _span(gi.start, profile.memory_slices)
        sm += profile.sm_slices
        count[profile.id] = count.get(profile.id, 0) + 1
    return mask, sm, count


# --------------------------------------------------------------------------
# Pinned placements
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class PinnedGi:
    """A GPU instance asked for at a fixed placement (an inline layout item with a placement).

    profile: the GPU instance's profile name (its full device name, e.g. "3g.40gb").
    start, size: placement in memory slices; size None means "the profile's".
    compute_instances: ((device name, start or None), ...); empty means one compute
        instance spanning the GPU instance. Starts are SM slices inside the GI.
    label: where it was given, for messages (e.g. "layouts[0] (gpus: [0]) devices[1]").
    """

    profile: str
    start: int
    size: object = None
    compute_instances: tuple = ()
    label: str = ""

    def __post_init__(self):
        object.__setattr__(self, "compute_instances", tuple(tuple(ci) for ci in self.compute_instances))


def resolve_pins(geometry: GpuGeometry, pinned: Iterable[PinnedGi]) -> tuple[GpuInstance, ...]:
    """GpuInstances (no ids) for pinned GIs on this GPU model, proved to form a legal layout together.

    Raises LayoutError naming the pin (its label) when a profile is unknown or is not
    a GPU instance profile, a compute instance belongs to another GPU instance profile,
    a placement is not one the GPU offers or overlaps another pin, or the pins
    together exceed a profile's count or the SM slices.
    """
    resolved = []
    for pin in pinned:
        where = pin.label or "pinned %s" % pin.profile
        try:
            device_type = geometry.device_type(pin.profile)
        except LayoutError as e:
            raise LayoutError("%s: %s" % (where, e))
        gi = device_type.gi
        if not device_type.is_full:
            raise LayoutError("%s: %r is a compute-instance profile; give its GPU instance profile %r and list "
                              "%r under compute_instances" % (where, pin.profile, gi.name, pin.profile))
        if pin.size is not None and pin.size != gi.memory_slices:
            raise LayoutError("%s: placement size %d does not match %s, which takes %d memory slices"
                              % (where, pin.size, gi.name, gi.memory_slices))
        if pin.start not in gi.placements:
            raise LayoutError("%s: this GPU cannot hold %s at placement %d:%d (its placements: %s)"
                              % (where, gi.name, pin.start, gi.memory_slices, _placements_text(gi)))
        cis = []
        occupied = 0
        for name, start in pin.compute_instances or ((gi.name, None),):
            try:
                ci_type = geometry.device_type(name)
            except LayoutError as e:
                raise LayoutError("%s: %s" % (where, e))
            if ci_type.gi.id != gi.id:
                raise LayoutError("%s: %s is not a compute instance of %s" % (where, name, gi.name))
            if start is None:
                free = _fill_starts(ci_type.ci, occupied, 1)
                if not free:
                    raise LayoutError("%s: no room left in %s for %s" % (where, gi.name, name))
                start = free[0]
            elif start not in ci_type.ci.placements:
                raise LayoutError("%s: %s cannot start at SM slice %d inside %s (its placements: %s)"
                                  % (where, name, start, gi.name,
                                     ",".join("%d:%d" % (p, ci_type.ci.sm_slices) for p in ci_type.ci.placements)))
            occupied |= _span(start, ci_type.ci.sm_slices)
            cis.append(ComputeInstance(None, ci_type.ci.id, start))
        resolved.append((where, GpuInstance(None, gi.id, pin.start, tuple(cis))))
    # Each pin on its own, then pins against each other (overlaps, counts, SM slices).
    for where, gi in resolved:
        try:
            validate_layout(geometry, (gi,), allow_empty_gis=False)
        except LayoutError as e:
            raise LayoutError("%s: %s" % (where, e))
    used = 0
    for where, gi in resolved:
        mask = _span(gi.start, geometry.gi_profile(gi.profile_id).memory_slices)
        if used & mask:
            raise LayoutError("%s: placement %d:%d overlaps another pinned GPU instance"
                              % (where, gi.start, geometry.gi_profile(gi.profile_id).memory_slices))
        used |= mask
    layout = tuple(gi for _where, gi in resolved)
    try:
        validate_layout(geometry, layout, allow_empty_gis=False)
    except LayoutError as e:
        raise LayoutError("the pinned GPU instances together: %s" % e)
    return layout


def _counts_text(counts):
    return " + ".join("%s x%d" % item for item in counts.items()) or "nothing"


def _placements_text(gi):
    return ",".join("%d:%d" % (s, gi.memory_slices) for s in gi.placements)


# --------------------------------------------------------------------------
# Layout checks and views
# --------------------------------------------------------------------------

def validate_layout(geometry: GpuGeometry, gpu_instances: Iterable[GpuInstance], allow_empty_gis: bool = True) -> None:
    """Raise LayoutError unless the layout is legal for this GPU model.

    Checks profiles, legal and non-overlapping placements (GIs in memory
    slices, CIs in SM slices inside their GI), per-profile maximum counts and
    the SM-slice total. A GI without compute instances is reported when
    allow_empty_gis is False (a plan must never leave one behind).
    """
    used_memory = 0
    used_sm = 0
    per_profile = {}
    for gi in gpu_instances:
        where = "GI %s" % _id_text(gi.gi_id)
        profile = geometry.gi_profile(gi.profile_id)
        if profile is None:
            raise LayoutError("%s has profile ID %r, which this GPU model does not have" % (where, gi.profile_id))
        where = "GI %s (%s @%d:%d)" % (_id_text(gi.gi_id), profile.name, gi.start, profile.memory_slices)
        if gi.start not in profile.placements:
            raise LayoutError("%s: start %d is not a legal placement (legal: %s)"
                              % (where, gi.start, _placements_text(profile)))
        mask = _span(gi.start, profile.memory_slices)
        if used_memory & mask:
            raise LayoutError("%s overlaps another GPU instance" % where)
        used_memory |= mask
        used_sm += profile.sm_slices
        per_profile[profile.id] = per_profile.get(profile.id, 0) + 1
        if per_profile[profile.id] > profile.max_count:
            raise LayoutError("more than %d GPU instances of %s" % (profile.max_count, profile.name))
        if not gi.compute_instances and not allow_empty_gis:
            raise LayoutError("%s has no compute instance" % where)
        used_ci = 0
        per_ci_profile = {}
        for ci in gi.compute_instances:
            ci_profile = profile.ci_profile(ci.profile_id)
            if ci_profile is None:
                raise LayoutError("%s: CI %s has compute profile ID %r, which %s does not have"
                                  % (where, _id_text(ci.ci_id), ci.profile_id, profile.name))
            if ci.start not in ci_profile.placements:
                raise LayoutError("%s: CI %s (%s) start %d is not a legal placement"
                                  % (where, _id_text(ci.ci_id), ci_profile.name, ci.start))
            ci_mask = _span(ci.start, ci_profile.sm_slices)
            if used_ci & ci_mask:
                raise LayoutError("%s: CI %s (%s) overlaps another compute instance"
                                  % (where, _id_text(ci.ci_id), ci_profile.name))
            used_ci |= ci_mask
            per_ci_profile[ci_profile.id] = per_ci_profile.get(ci_profile.id, 0) + 1
            if per_ci_profile[ci_profile.id] > ci_profile.max_count:
                raise LayoutError("%s: more than %d compute instances of %s"
                                  % (where, ci_profile.max_count, ci_profile.name))
    if used_sm > geometry.sm_slices:
        raise LayoutError("the layout uses %d SM slices, but this GPU model has %d" % (used_sm, geometry.sm_slices))


def device_counts(geometry: GpuGeometry, gpu_instances: Iterable[GpuInstance]) -> dict[str, int]:
    """The mig-parted view of a layout: {canonical device name: count}, smallest first."""
    counts = {}
    for gi in gpu_instances:
        for ci in gi.compute_instances:
            name = geometry.device_name(gi.profile_id, ci.profile_id)
            if name is None:
                raise LayoutError("GI %s: unknown profile pair (GI profile %r, CI profile %r)"
                                  % (_id_text(gi.gi_id), gi.profile_id, ci.profile_id))
            counts[name] = counts.get(name, 0) + 1
    order = {n: i for i, n in enumerate(geometry.device_names())}
    return dict(sorted(counts.items(), key=lambda item: order[item[0]]))


def describe_layout(geometry: GpuGeometry, gpu_instances: Iterable[GpuInstance]) -> str:
    """Readable text, one line per GI, ordered by placement, for diffs.

    Example: ``GI 1  3g.20gb @0:4  [CI 0 3g.20gb MIG-...]``. Parts a plan will
    create show ``new`` instead of an id. Returns "" for an empty layout.
    """
    lines = []
    for gi in sorted(gpu_instances, key=_gi_order):
        profile = geometry.gi_profile(gi.profile_id)
        gi_name = profile.name if profile else "profile-%s" % gi.profile_id
        size = profile.memory_slices if profile else "?"
        parts = []
        for ci in gi.compute_instances:
            name = geometry.device_name(gi.profile_id, ci.profile_id) or "ci-profile-%s" % ci.profile_id
            text = "CI %s %s" % (_id_text(ci.ci_id), name)
            ci_profile = profile.ci_profile(ci.profile_id) if profile else None
            if ci_profile is not None and ci_profile.sm_slices != profile.sm_slices:
                text += " @%d:%d" % (ci.start, ci_profile.sm_slices)
            if ci.uuid:
                text += " %s" % ci.uuid
            if ci.pids:
                text += " (pids %s)" % ",".join(str(p) for p in ci.pids)
            if ci.pods:
                text += " (pods %s)" % ",".join(ci.pods)
            parts.append(text)
        lines.append("GI %s  %s @%d:%s  [%s]" % (_id_text(gi.gi_id), gi_name, gi.start, size, ", ".join(parts)))
    return "".join(line + "\n" for line in lines)


def layout_as_list(geometry: GpuGeometry, gpu_instances: Iterable[GpuInstance]) -> list[dict[str, Any]]:
    """JSON-friendly form of a layout (for module results)."""
    return [_gi_as_dict(geometry, gi) for gi in sorted(gpu_instances, key=_gi_order)]


def plan_as_dict(geometry: GpuGeometry, plan: GpuPlan) -> dict[str, Any]:
    """JSON-friendly form of a plan (for check mode)."""
    return {
        "keep": layout_as_list(geometry, plan.keep),
        "change": [dict(_gi_as_dict(geometry, c.gi, with_cis=False),
                        destroy=[_ci_as_dict(geometry, c.gi, ci) for ci in c.destroy],
                        create=[_ci_as_dict(geometry, c.gi, ci) for ci in c.create])
                   for c in plan.change],
        "destroy": layout_as_list(geometry, plan.destroy),
        "create": layout_as_list(geometry, plan.create),
        "result": layout_as_list(geometry, plan.result),
        "destroyed_devices": plan.destroyed_devices,
        "created_devices": plan.created_devices,
        "evicted_pods": [{"pod": pod, "reason": DEVICE_DESTROYED,
                          "devices": [_device_ref(geometry, gi, ci) for gi, ci in devices]}
                         for pod, devices in plan.evicted_pods],
    }


# Why a pod must go (plan_as_dict's evicted_pods, _evictions.node_evictions).
DEVICE_DESTROYED = "device destroyed"


def _device_ref(geometry, gi, ci):
    """A destroyed device as a pod's eviction names it."""
    return {"gi_id": gi.gi_id, "ci_id": ci.ci_id, "device": geometry.device_name(gi.profile_id, ci.profile_id),
            "uuid": ci.uuid, "pods": list(ci.pods)}


def _gi_as_dict(geometry, gi, with_cis=True):
    profile = geometry.gi_profile(gi.profile_id)
    data = {
        "gi_id": gi.gi_id,
        "profile": profile.name,
        "profile_id": gi.profile_id,
        "placement": {"start": gi.start, "size": profile.memory_slices},
    }
    if with_cis:
        data["compute_instances"] = [_ci_as_dict(geometry, gi, ci) for ci in gi.compute_instances]
    return data


def _ci_as_dict(geometry, gi, ci):
    ci_profile = geometry.gi_profile(gi.profile_id).ci_profile(ci.profile_id)
    return {
        "ci_id": ci.ci_id,
        "device": geometry.device_name(gi.profile_id, ci.profile_id),
        "profile_id": ci.profile_id,
        "placement": {"start": ci.start, "size": ci_profile.sm_slices},
        "uuid": ci.uuid,
        "pids": list(ci.pids),
        "pods": list(ci.pods),
    }


def _id_text(value):
    return "new" if value is None else str(value)


def _span(start, size):
    return ((1 << size) - 1) << start


def largest_free_range(geometry: GpuGeometry, gpu_instances: Iterable[GpuInstance]) -> int:
    """Length of the longest run of memory slices no GI uses."""
    mask = 0
    for gi in gpu_instances:
        mask |= _span(gi.start, geometry.gi_profile(gi.profile_id).memory_slices)
    return _longest_free_run(mask, geometry.memory_slices)


def _longest_free_run(mask, width):
    best = run = 0
    for bit in range(width):
        if mask >> bit & 1:
            run = 0
        else:
            run += 1
            best = max(best, run)
    return best


# --------------------------------------------------------------------------
# Placement search (shared by validation and planning)
# --------------------------------------------------------------------------

def _capacity(device_type):
    """How many devices of this type one GI holds (max_count limited by real placements)."""
    return len(_fill_starts(device_type.ci, 0, device_type.ci.max_count))


def _fill_starts(ci_profile, occupied, limit):
    """Most CI starts (at most limit) placeable without overlapping occupied, lowest first."""
    best = ()
    stack = [(0, 0, ())]
    starts = sorted(ci_profile.placements)
    while stack:
        index, mask, chosen = stack.pop()
        if len(chosen) > len(best):
            best = chosen
            if len(best) == limit:
                break
        for k in range(len(starts) - 1, index - 1, -1):
            span = _span(starts[k], ci_profile.sm_slices)
            if not (occupied | mask) & span:
                stack.append((k + 1, mask | span, chosen + (starts[k],)))
    return best


def _best_placement(geometry, occupied, requirement, memo):
    """Place new GIs; requirement is ((gi_profile_id, count), ...).

    Returns (largest free run, starts) with starts a tuple of (profile_id, start)
    sorted, choosing the largest free run and then the lowest starts; None if
    nothing fits. Memoised by (occupied mask, requirement).
    """
    key = (occupied, requirement)
    if key in memo:
        return memo[key]
    # Place big profiles first: they have the fewest legal starts.
    todo = []
    for gi_id, count in requirement:
        todo.extend([geometry.gi_profile(gi_id)] * count)
    todo.sort(key=lambda p: (-p.memory_slices, p.id))
    best = None

    def visit(index, mask, chosen, min_start):
        nonlocal best
        if index == len(todo):
            candidate = (_longest_free_run(mask, geometry.memory_slices), tuple(sorted(chosen)))
            if best is None or (-candidate[0], candidate[1]) < (-best[0], best[1]):
                best = candidate
            return
        profile = todo[index]
        for start in profile.placements:
            if start < min_start:
                continue
            span = _span(start, profile.memory_slices)
            if mask & span:
                continue
            same_next = index + 1 < len(todo) and todo[index + 1] is profile
            visit(index + 1, mask | span, chosen + [(profile.id, start)], start + 1 if same_next else 0)

    visit(0, occupied, [], 0)
    memo[key] = best
    return best


# --------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------

def plan_gpu(geometry: GpuGeometry, existing: Iterable[GpuInstance], target: Mapping[str, int], force: bool = False,
             pinned: Sequence[PinnedGi] = (), evict_pods: bool = False,
             evicted: Iterable[str] = ()) -> GpuPlan:
    """Plan the change from the existing layout to the target device counts.

    existing: GpuInstances now on the GPU (ids set, CIs with their pids and pods).
    target: {device name: count} as in mig-parted's mig-devices (aliases allowed).
    pinned: PinnedGi values: GPU instances (with their compute instances) that must
        end up at exactly these placements. Their devices count towards target; the
        rest of target is placed around them. An existing GI that is exactly a pin
        is kept (its CIs changed if they differ), and any other GI overlapping a pin
        goes.
    evict_pods: devices allocated to pods may be destroyed; their pods are in the
        plan's evicted_pods (the processes of those pods go with them, so this does
        not need force).
    evicted: pods ("namespace/pod") that go anyway (another GPU's change on the node
        evicts them): destroying their devices here evicts nobody more.

    The plan keeps every GI and CI it can: it evicts as few pods as possible,
    then destroys as few devices with processes and as few MIG devices as
    possible, and places new GIs so the largest contiguous range of free memory
    slices is as large as possible. Busy devices (CIs with pids and no pod) are
    destroyed only with force=True, allocated devices (CIs with pods) only with
    evict_pods=True; without it, a LayoutError names them. Everything is
    validated before a plan is returned.
    """
    pins = resolve_pins(geometry, pinned) if pinned else ()
    total = normalize_target(geometry, target)
    rest = dict(total)
    for name, count in device_counts(geometry, pins).items():
        if rest.get(name, 0) < count:
            raise LayoutError("the pinned GPU instances hold %s x%d, but the target asks for %d"
                              % (name, count, rest.get(name, 0)))
        rest[name] -= count
    counts = validate_target(geometry, {n: c for n, c in rest.items() if c}, reserved=pins)
    existing = tuple(sorted(existing, key=_gi_order))
    for gi in existing:
        if gi.gi_id is None or any(ci.ci_id is None for ci in gi.compute_instances):
            raise LayoutError("existing GPU instances and compute instances must have ids")
    if len({gi.gi_id for gi in existing}) != len(existing):
        raise LayoutError("existing GPU instance ids must be unique")
    validate_layout(geometry, existing, allow_empty_gis=True)
    evicted = frozenset(evicted)
    if pins:
        plan = _plan_with_pins(geometry, existing, counts, pins, force, evict_pods, evicted)
    else:
        plan = _Planner(geometry, existing, counts, force=force, evict_pods=evict_pods,
                        evicted=evicted).run()
    busy, allocated = _held_devices(plan, force, evict_pods)
    refusals = []
    if busy:
        refusals.append("the new layout cannot be reached without destroying MIG devices that are in use: %s. "
                        "Stop those processes or use force." % _devices_text(geometry, busy))
    if allocated:
        refusals.append("the new layout cannot be reached without destroying MIG devices allocated to pods: %s. "
                        "Evict those pods first, or plan with evict_pods to have them listed."
                        % _devices_text(geometry, allocated))
    if refusals:
        raise LayoutError(" ".join(refusals),
                          details={"busy": _devices_data(geometry, busy),
                                   "allocated": _devices_data(geometry, allocated)})
    check_plan(geometry, existing, total, plan, force=force, pinned=pins, evict_pods=evict_pods)
    return plan


def evicted_pod_names(plan: GpuPlan) -> frozenset:
    """The pods ("namespace/pod") a GPU's plan evicts."""
    return frozenset(pod for pod, dummy in plan.evicted_pods)


def plan_node_gpus(requests: Mapping[int, tuple], force: bool = False,
                   evict_pods: bool = False) -> dict[int, GpuPlan | LayoutError]:
    """plan_gpu for the GPUs of one node, a pod evicted once for the node (docs/rollout.md).

    requests: {GPU index: (geometry, existing, target, pinned)}. Returns {GPU index: GpuPlan,
    or the LayoutError that GPU's planning raised}. With evict_pods a pod holding devices on
    several GPUs counts once: each GPU is planned knowing the pods the others' plans already
    evict (GPU by GPU, then again while a GPU's plan can make the node's evicted pods fewer),
    so among plans that are equal for one GPU the one evicting a pod that goes anyway wins.
    """
    plans = {}
    gone = frozenset()

    def plan(index, evicted):
        geometry, existing, target, pinned = requests[index]
        return plan_gpu(geometry, existing, target, force=force, pinned=pinned,
                        evict_pods=evict_pods, evicted=evicted if evict_pods else ())

    for index in sorted(requests):
        try:
            plans[index] = plan(index, gone)
        except LayoutError as e:
            plans[index] = e
            continue
        gone |= evicted_pod_names(plans[index])
    planned = [i for i in sorted(plans) if isinstance(plans[i], GpuPlan)]
    for dummy in range(len(planned) if evict_pods else 0):
        better = False
        for index in planned:
            others = frozenset().union(*(evicted_pod_names(plans[i])
                                         for i in planned if i != index))
            again = plan(index, others)
            now = len(others | evicted_pod_names(plans[index]))
            if len(others | evicted_pod_names(again)) < now:
                plans[index], better = again, True
        if not better:
            break
    return plans


def _may_destroy(ci, force, evict_pods):
    """A device allocated to pods goes only when its pods may be evicted (its processes are theirs
    and go with them); a device with processes of no pod only with force."""
    if ci.pods:
        return evict_pods
    return force or not ci.pids


def _held_devices(plan, force, evict_pods):
    """(busy, allocated): the (GI, CI) pairs the plan destroys without leave, by what holds them."""
    held = [(gi, ci) for gi, ci in plan.destroyed_compute_instances() if not _may_destroy(ci, force, evict_pods)]
    return [pair for pair in held if not pair[1].pods], [pair for pair in held if pair[1].pods]


def _plan_with_pins(geometry, existing, counts, pins, force=False, evict_pods=False,
                    evicted=frozenset()):
    """The pinned GIs take their places (kept when one is already exactly there); the planner
    places the other devices (counts) in what is left, keeping what it can of the other GIs."""
    keep, change, destroy, create, result = [], [], [], [], []
    pinned_mask = 0
    matched = set()
    for pin in pins:
        pinned_mask |= _span(pin.start, geometry.gi_profile(pin.profile_id).memory_slices)
        same = next((gi for gi in existing if gi.profile_id == pin.profile_id and gi.start == pin.start), None)
        if same is None:
            create.append(pin)
            result.append(pin)
            continue
        matched.add(same.gi_id)
        wanted = [(ci.profile_id, ci.start) for ci in pin.compute_instances]
        kept = tuple(ci for ci in same.compute_instances if (ci.profile_id, ci.start) in wanted)
        dropped = tuple(ci for ci in same.compute_instances if ci not in kept)
        have = [(ci.profile_id, ci.start) for ci in kept]
        added = tuple(ci for ci in pin.compute_instances if (ci.profile_id, ci.start) not in have)
        if dropped or added:
            change.append(GiChange(same, dropped, added))
            result.append(GpuInstance(same.gi_id, same.profile_id, same.start, kept + added))
        else:
            keep.append(same)
            result.append(same)
    rest = []
    for gi in existing:
        if gi.gi_id in matched:
            continue
        if _span(gi.start, geometry.gi_profile(gi.profile_id).memory_slices) & pinned_mask:
            destroy.append(gi)
        else:
            rest.append(gi)
    # The pins' own destructions evict their pods whatever the rest does: the rest may take those
    # pods' other devices.
    evicted = evicted | frozenset(pod for gi in destroy for ci in gi.compute_instances
                                  for pod in ci.pod_names)
    evicted |= frozenset(pod for c in change for ci in c.destroy for pod in ci.pod_names)
    around = _Planner(geometry, tuple(rest), counts, reserved=pins, force=force, evict_pods=evict_pods,
                      evicted=evicted).run()
    return GpuPlan(
        keep=tuple(sorted(keep + list(around.keep), key=_gi_order)),
        change=tuple(sorted(change + list(around.change), key=lambda c: _gi_order(c.gi))),
        destroy=tuple(sorted(destroy + list(around.destroy), key=_gi_order)),
        create=tuple(sorted(create + list(around.create), key=_gi_order)),
        result=tuple(sorted(result + list(around.result), key=_gi_order)),
    )


def _device_text(geometry, gi, ci):
    profile = geometry.gi_profile(gi.profile_id)
    device = geometry.device_name(gi.profile_id, ci.profile_id)
    text = "GI %s (%s @%d:%d) CI %s (%s)" % (gi.gi_id, profile.name, gi.start, profile.memory_slices, ci.ci_id, device)
    if ci.uuid:
        text += " %s" % ci.uuid
    held = []
    if ci.pids:
        held.append("with PIDs %s" % ", ".join(str(p) for p in ci.pids))
    if ci.pods:
        held.append("allocated to %s" % ", ".join(describe_holder(name) for name in ci.pods))
    return "%s %s" % (text, " and ".join(held))


def describe_holder(name: str) -> str:
    """A ``namespace/pod/container`` holder of a device in words: ``pod ns/name (container c)``;
    ``pod ns/name`` for a ``namespace/pod`` holder (a DRA claim's, which belongs to the pod)."""
    namespace, pod, container = (name.split("/", 2) + ["", ""])[:3]
    if not container:
        return "pod %s/%s" % (namespace, pod)
    return "pod %s/%s (container %s)" % (namespace, pod, container)


def _devices_text(geometry, pairs):
    return "; ".join(_device_text(geometry, gi, ci) for gi, ci in pairs)


def _devices_data(geometry, pairs):
    """The (GI, CI) pairs as data: ids, device name, UUID, processes, the pods that hold them."""
    return [{"gi_id": gi.gi_id, "ci_id": ci.ci_id,
             "device": geometry.device_name(gi.profile_id, ci.profile_id),
             "uuid": ci.uuid, "pids": list(ci.pids), "pods": list(ci.pods)} for gi, ci in pairs]


# A plan's cost, compared as a tuple: devices destroyed without leave (must be 0 for a plan to be
# returned), pods evicted, devices with processes destroyed, devices destroyed.
_NO_COST = (0, 0, 0, 0)


def _add(cost, more):
    return tuple(a + b for a, b in zip(cost, more))


def _total(cost, shared):
    """The cost with the pods held in several GIs (shared, a set) counted once each."""
    return (cost[0], cost[1] + len(shared)) + cost[2:]


@dataclass(frozen=True)
class _KeepOption:
    """One way to keep an existing GI: which of its CIs stay, what may be added."""

    kept_cis: tuple      # indexes into the GI's compute_instances
    retained: tuple      # device count vector (per demanded name of this GI profile)
    cost: tuple          # of the dropped CIs, see _NO_COST; pods counts the pods of this GI only
    shared: frozenset    # evicted pods that also hold devices in other GIs (counted once, over all GIs)
    add_starts: tuple    # per demanded name: CI starts that can be added, lowest first


# One way to serve a GI profile's devices with a given set of kept GIs. choices: ((position in
# _Planner._kept_order(kept), option number, added name index or None, added count), ...) supplied:
# devices of each demanded name the kept GIs provide; new GIs make up the rest.
_FrontierEntry = namedtuple("_FrontierEntry", "new_gis cost shared choices supplied")


class _Planner:
    """Exhaustive search with pruning; see docs/planner.md.

    1. For each existing GI, list the ways to keep it (which CIs survive, how
       many CIs of one kind can be added).
    2. For each GI profile, a small DP over kept GIs gives, per number of new
       GIs still needed, the cheapest ways to get there.
    3. Over subsets of kept GIs, combine the profiles, order by cost
       (refused destroyed, pods evicted, busy destroyed, destroyed), and place
       new GIs by memoised search.
    """

    def __init__(self, geometry, existing, counts, reserved=(), force=False, evict_pods=False, evicted=frozenset()):
        self.geometry = geometry
        self.existing = existing
        self.counts = counts
        self.force = force
        self.evict_pods = evict_pods
        self.evicted = evicted   # pods that go anyway (a pin destroys one of their devices): free to evict
        # Pinned GIs placed outside the search: their slices, SM slices and profile counts are
        # taken.
        self.reserved_mask, self.reserved_sm, self.reserved_count = _reservation(geometry, reserved)
        # A pod holding devices in two GIs is evicted once whichever of them go, so such pods are
        # carried as sets; the others are counted per GI, which keeps the search additive.
        holders = {}
        for index, gi in enumerate(existing):
            for ci in gi.compute_instances:
                for pod in ci.pod_names:
                    holders.setdefault(pod, set()).add(index)
        self.shared_pods = frozenset(pod for pod, gis in holders.items() if len(gis) > 1)
        self.names_by_gi = {}
        for name in counts:
            device_type = geometry.device_type(name)
            self.names_by_gi.setdefault(device_type.gi.id, []).append(name)
        self.options = [self._keep_options(gi) for gi in existing]
        # GIs whose keep options have the same outcomes are interchangeable in the DP.
        signature_ids = {}
        self.signatures = []
        for options in self.options:
            signature = tuple((o.retained, o.cost, o.shared, tuple(len(a) for a in o.add_starts)) for o in options)
            self.signatures.append(signature_ids.setdefault(signature, len(signature_ids)))
        self.whole = [self._cost(gi.compute_instances) for gi in existing]   # destroying the GI
        self.frontier_memo = {}
        self.placement_memo = {}

    def _cost(self, dropped):
        """(cost, shared pods) of destroying these CIs of one GI."""
        pods = set()
        for ci in dropped:
            pods.update(ci.pod_names)
        pods -= self.evicted
        shared = frozenset(pods & self.shared_pods)
        cost = (sum(1 for ci in dropped if not _may_destroy(ci, self.force, self.evict_pods)),
                len(pods) - len(shared), sum(1 for ci in dropped if ci.busy), len(dropped))
        return cost, shared

    def _sum(self, indexes):
        """(cost, shared pods) of destroying these GIs whole."""
        cost, shared = _NO_COST, frozenset()
        for i in indexes:
            cost, shared = _add(cost, self.whole[i][0]), shared | self.whole[i][1]
        return cost, shared

    # -- step 1 ------------------------------------------------------------
    def _keep_options(self, gi):
        names = self.names_by_gi.get(gi.profile_id)
        if not names:
            return []
        profile = self.geometry.gi_profile(gi.profile_id)
        cis = gi.compute_instances
        ci_names = [self.geometry.device_name(gi.profile_id, ci.profile_id) for ci in cis]
        demand = [self.counts[n] for n in names]
        options = {}
        # Try keeping the most CIs first so ties prefer keeping.
        for size in range(len(cis), -1, -1):
            for kept in itertools.combinations(range(len(cis)), size):
                retained = [0] * len(names)
                valid = True
                occupied = 0
                for k in kept:
                    if ci_names[k] not in names:
                        valid = False
                        break
                    retained[names.index(ci_names[k])] += 1
                    occupied |= _span(cis[k].start, profile.ci_profile(cis[k].profile_id).sm_slices)
                if not valid or any(r > d for r, d in zip(retained, demand)):
                    continue
                add_starts = []
                for i, name in enumerate(names):
                    ci_profile = self.geometry.device_type(name).ci
                    same = sum(1 for k in kept if cis[k].profile_id == ci_profile.id)
                    room = min(ci_profile.max_count - same, demand[i] - retained[i])
                    add_starts.append(_fill_starts(ci_profile, occupied, room) if room > 0 else ())
                kept_set = set(kept)
                cost, shared = self._cost([ci for k, ci in enumerate(cis) if k not in kept_set])
                option = _KeepOption(kept, tuple(retained), cost, shared, tuple(add_starts))
                key = (option.retained, cost, shared, tuple(len(s) for s in option.add_starts))
                options.setdefault(key, option)
        return list(options.values())

    # -- step 2 ------------------------------------------------------------
    def _kept_order(self, kept):
        return sorted(kept, key=lambda i: (self.signatures[i], i))

    def _frontier(self, gi_profile_id, kept):
        """_FrontierEntry list for the kept GIs of one profile, fewest new GIs first.

        An entry is dropped when one needing no more new GIs costs no more and evicts
        none of the shared pods it spares. Memoised by the kept GIs' signatures, not
        their identity.
        """
        key = (gi_profile_id, tuple(sorted(self.signatures[i] for i in kept)))
        if key in self.frontier_memo:
            return self.frontier_memo[key]
        order = self._kept_order(kept)
        names = self.names_by_gi[gi_profile_id]
        demand = tuple(self.counts[n] for n in names)
        # State: (devices supplied, shared pods evicted) -> (cheapest cost, choices).
        states = {(tuple([0] * len(names)), frozenset()): (_NO_COST, ())}
        for position, index in enumerate(order):
            next_states = {}
            for (supplied, shared), (cost, choices) in states.items():
                for number, option in enumerate(self.options[index]):
                    base = tuple(s + r for s, r in zip(supplied, option.retained))
                    if any(b > d for b, d in zip(base, demand)):
                        continue
                    grown_cost, grown_shared = _add(cost, option.cost), shared | option.shared
                    if sum(option.retained):
                        _relax(next_states, (base, grown_shared), grown_cost,
                               choices + ((position, number, None, 0),))
                    for i, starts in enumerate(option.add_starts):
                        for count in range(1, min(len(starts), demand[i] - base[i]) + 1):
                            grown = base[:i] + (base[i] + count,) + base[i + 1:]
                            _relax(next_states, (grown, grown_shared), grown_cost,
                                   choices + ((position, number, i, count),))
            states = next_states
        entries = []
        for (supplied, shared), (cost, choices) in states.items():
            new_gis = sum(-(-(d - s) // _capacity(self.geometry.device_type(n)))
                          for n, d, s in zip(names, demand, supplied))
            entries.append(_FrontierEntry(new_gis, cost, shared, choices, supplied))
        entries.sort(key=lambda e: (e.new_gis, _total(e.cost, e.shared), e.cost, sorted(e.shared)))
        frontier = []
        for entry in entries:
            # Needing more new GIs only pays if it costs less. With shared pods, whatever the other
            # GIs evict, an entry that costs no more and evicts only shared pods the entry evicts
            # too is never worse.
            if not any(f.cost <= entry.cost and f.shared <= entry.shared for f in frontier):
                frontier.append(entry)
        self.frontier_memo[key] = frontier
        return frontier

    # -- step 3 ------------------------------------------------------------
    def run(self):
        geometry = self.geometry
        profiles = sorted(self.names_by_gi)
        # GIs of profiles the target does not use always go.
        fixed_cost, fixed_shared = self._sum(i for i, gi in enumerate(self.existing)
                                             if gi.profile_id not in self.names_by_gi)
        # Per profile: every subset of its GIs to keep, with each DP frontier entry.
        per_profile = []
        for gi_profile_id in profiles:
            profile = geometry.gi_profile(gi_profile_id)
            mine = [i for i, gi in enumerate(self.existing) if gi.profile_id == gi_profile_id]
            keepable = [i for i in mine if self.options[i]]
            choices = []
            for size in range(len(keepable), -1, -1):
                for kept in itertools.combinations(keepable, size):
                    gone_cost, gone_shared = self._sum(i for i in mine if i not in kept)
                    mask = 0
                    for i in kept:
                        mask |= _span(self.existing[i].start, profile.memory_slices)
                    for entry in self._frontier(gi_profile_id, kept):
                        if len(kept) + entry.new_gis + self.reserved_count.get(gi_profile_id, 0) > profile.max_count:
                            continue
                        choices.append(((_add(gone_cost, entry.cost), gone_shared | entry.shared), kept, entry, mask,
                                        (len(kept) + entry.new_gis) * profile.sm_slices))
            per_profile.append(choices)
        candidates = []
        for combo in itertools.product(*per_profile):
            cost, shared = fixed_cost, fixed_shared
            for c in combo:
                cost, shared = _add(cost, c[0][0]), shared | c[0][1]
            candidates.append((_total(cost, shared), combo))
        candidates.sort(key=lambda c: c[0])
        best = None
        current_cost = None
        for cost, combo in candidates:
            if best is not None and cost != current_cost:
                break
            current_cost = cost
            if sum(c[4] for c in combo) + self.reserved_sm > geometry.sm_slices:
                continue
            occupied = self.reserved_mask
            for c in combo:
                occupied |= c[3]
            requirement = tuple((gi_profile_id, c[2].new_gis) for gi_profile_id, c in zip(profiles, combo)
                                if c[2].new_gis)
            placed = _best_placement(geometry, occupied, requirement, self.placement_memo)
            if placed is None:
                continue
            free_run, starts = placed
            kept = tuple(sorted(i for c in combo for i in c[1]))
            kept_flags = tuple(0 if i in kept else 1 for i in range(len(self.existing)))
            rank = (-free_run, len(self.existing) - len(kept), len(starts), kept_flags, starts)
            if best is None or rank < best[0]:
                best = (rank, kept, [c[2] for c in combo], starts)
        if best is None:
            # validate_target proved the target fits an empty GPU, and emptying it is always
            # allowed.
            raise LayoutError("internal planner error: no plan found")
        return self._build(best[1], profiles, best[2], best[3])

    def _build(self, kept, profiles, entries, starts):
        geometry = self.geometry
        keep, change, result = [], [], []
        for gi_profile_id, entry in zip(profiles, entries):
            order = self._kept_order([i for i in kept if self.existing[i].profile_id == gi_profile_id])
            for position, number, add_index, add_count in entry.choices:
                index = order[position]
                option = self.options[index][number]
                gi = self.existing[index]
                kept_cis = tuple(gi.compute_instances[k] for k in option.kept_cis)
                dropped = tuple(ci for k, ci in enumerate(gi.compute_instances) if k not in option.kept_cis)
                added = ()
                if add_index is not None:
                    ci_profile = geometry.device_type(self.names_by_gi[gi_profile_id][add_index]).ci
                    added = tuple(ComputeInstance(None, ci_profile.id, s)
                                  for s in option.add_starts[add_index][:add_count])
                if dropped or added:
                    change.append(GiChange(gi, dropped, tuple(sorted(added, key=_ci_order))))
                    result.append(GpuInstance(gi.gi_id, gi.profile_id, gi.start, kept_cis + added))
                else:
                    keep.append(gi)
                    result.append(gi)
        kept_set = set(kept)
        destroy = [gi for i, gi in enumerate(self.existing) if i not in kept_set]
        create = []
        free_starts = {}
        for profile_id, start in starts:
            free_starts.setdefault(profile_id, []).append(start)
        for gi_profile_id, entry in zip(profiles, entries):
            names = self.names_by_gi[gi_profile_id]
            starts_left = free_starts.get(gi_profile_id, [])
            for name, supplied in zip(names, entry.supplied):
                device_type = geometry.device_type(name)
                left = self.counts[name] - supplied
                per_gi = _capacity(device_type)
                while left > 0:
                    n = min(left, per_gi)
                    ci_starts = _fill_starts(device_type.ci, 0, n)
                    cis = tuple(ComputeInstance(None, device_type.ci.id, s) for s in ci_starts)
                    create.append(GpuInstance(None, gi_profile_id, starts_left.pop(0), cis))
                    left -= n
        result.extend(create)
        return GpuPlan(
            keep=tuple(sorted(keep, key=_gi_order)),
            change=tuple(sorted(change, key=lambda c: _gi_order(c.gi))),
            destroy=tuple(destroy),
            create=tuple(sorted(create, key=_gi_order)),
            result=tuple(sorted(result, key=_gi_order)),
        )


def _relax(states, key, cost, choices):
    current = states.get(key)
    if current is None or cost < current[0]:
        states[key] = (cost, choices)


# --------------------------------------------------------------------------
# Last guard
# --------------------------------------------------------------------------

def check_plan(geometry: GpuGeometry, existing: Iterable[GpuInstance], target: Mapping[str, int], plan: GpuPlan,
               force: bool = False, pinned: Sequence[GpuInstance] = (), evict_pods: bool = False) -> None:
    """Raise LayoutError unless the plan is a safe, valid way from existing to target.

    pinned: GpuInstances (from resolve_pins) that the result must hold exactly:
    same profile and placement, same compute instances at the same placements.

    Checks: the result is a legal layout with no empty GI; its device counts
    equal the target; every existing GI is kept, changed or destroyed exactly
    once; kept GIs and surviving CIs are untouched; new parts have no ids;
    the result is exactly what the plan's steps produce; no busy device is
    destroyed unless force, and no device allocated to pods unless evict_pods.
    """
    counts = normalize_target(geometry, target)
    validate_layout(geometry, plan.result, allow_empty_gis=False)
    got = device_counts(geometry, plan.result)
    if got != counts:
        raise LayoutError("plan result has devices %s, target is %s" % (_counts_text(got), _counts_text(counts)))
    by_id = {gi.gi_id: gi for gi in existing}
    seen = []
    expected = list(plan.keep)
    for gi in plan.keep:
        if by_id.get(gi.gi_id) != gi:
            raise LayoutError("plan keeps GI %s, which differs from the existing one" % gi.gi_id)
        seen.append(gi.gi_id)
    for change in plan.change:
        gi = change.gi
        if by_id.get(gi.gi_id) != gi:
            raise LayoutError("plan changes GI %s, which differs from the existing one" % gi.gi_id)
        if not set(change.destroy) <= set(gi.compute_instances):
            raise LayoutError("plan destroys compute instances GI %s does not have" % gi.gi_id)
        if any(ci.ci_id is not None or ci.pids or ci.pods for ci in change.create):
            raise LayoutError("plan creates compute instances in GI %s that already have ids" % gi.gi_id)
        survivors = tuple(ci for ci in gi.compute_instances if ci not in change.destroy)
        expected.append(GpuInstance(gi.gi_id, gi.profile_id, gi.start, survivors + tuple(change.create)))
        seen.append(gi.gi_id)
    for gi in plan.destroy:
        if by_id.get(gi.gi_id) != gi:
            raise LayoutError("plan destroys GI %s, which differs from the existing one" % gi.gi_id)
        seen.append(gi.gi_id)
    if sorted(seen) != sorted(by_id) or len(seen) != len(set(seen)):
        raise LayoutError("plan does not account for every existing GPU instance exactly once")
    for gi in plan.create:
        if gi.gi_id is not None or any(ci.ci_id is not None or ci.pids or ci.pods for ci in gi.compute_instances):
            raise LayoutError("plan creates a GPU instance that already has ids")
        expected.append(gi)
    if sorted(expected, key=_gi_order) != sorted(plan.result, key=_gi_order):
        raise LayoutError("plan result does not match its keep/change/destroy/create steps")
    for pin in pinned:
        there = [gi for gi in plan.result if gi.profile_id == pin.profile_id and gi.start == pin.start]
        if len(there) != 1 or (sorted((ci.profile_id, ci.start) for ci in there[0].compute_instances)
                               != sorted((ci.profile_id, ci.start) for ci in pin.compute_instances)):
            raise LayoutError("plan result does not hold the pinned GPU instance %s @%d"
                              % (geometry.gi_profile(pin.profile_id).name, pin.start))
    busy, allocated = _held_devices(plan, force, evict_pods)
    if busy:
        raise LayoutError("plan destroys busy MIG devices: %s" % _devices_text(geometry, busy))
    if allocated:
        raise LayoutError("plan destroys MIG devices allocated to pods: %s" % _devices_text(geometry, allocated))
