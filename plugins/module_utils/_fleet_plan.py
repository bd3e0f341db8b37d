# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Fleet planner: MIG layouts for a whole fleet from what workloads ask for.

Private to the collection; pure Python (no Ansible, no NVML calls), so the
controller-side plugin gpuops.mig.mig_plan, the tests and bench/ all run it.
docs/planning.md describes the inputs, the objectives and the search.

Inputs
  fleet   {node: the ``gpuops_mig`` facts mig_facts returns, or None when the
          node gave no facts}
  demand  free MIG devices wanted: {name: count}, or a list of items
          {profile: name, count: n} / {memory_gib: x, compute_slices: c, count: n},
          each optionally limited to ``nodes`` (a node group)
  policy  nodes that may be touched, spare devices to keep, whole GPUs to keep free
  in_use  {node: {device name: count}} held by running pods (a floor per node)

Objectives, in this order: meet the demand (as much of it as fits); never
destroy a busy device (a hard rule, not a cost); touch the fewest nodes; destroy
the fewest MIG devices; keep free memory slices in large contiguous ranges
(the sum over free runs of run length squared, higher is better).

Search: every GPU's reachable layouts are enumerated exactly (keep any set of
existing GPU instances that includes the busy ones, add demanded profiles at
legal placements). Nodes combine their GPUs, and the fleet its nodes, by
dynamic programming over demand vectors (capped at the demand): exact.
When that state space is too big (``exact_limit``), a lazy greedy set
multicover over nodes is used instead; the report says which, and gives a
lower bound on the nodes any plan must touch.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import re
from collections.abc import Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout
from ansible_collections.gpuops.mig.plugins.module_utils._config_builder import check_pci_id, check_profiles, describe
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout

__all__ = [
    "PlanInputError",
    "EXACT_LIMIT",
    "geometry_from_profiles",
    "demand_items",
    "plan_fleet",
    "demand_from_pods",
    "demand_from_claims",
    "plan_table",
    "vars_file_data",
    "profile_from_resource",
]

# Relaxations the exact search may do before it gives way to the heuristic.
EXACT_LIMIT = 400000
WHOLE = "<whole GPU>"
_RESOURCE_PREFIX = "nvidia.com/mig-"
_WHOLE_RESOURCE = "nvidia.com/gpu"
# The device plugin's renameByDefault appends this to a time-sliced resource (nvidia.com/mig-1g.10gb.shared).
_SHARED_SUFFIX = ".shared"
_WHOLE_RESOURCES = (_WHOLE_RESOURCE, _WHOLE_RESOURCE + _SHARED_SUFFIX)
_PROFILE = re.compile(r"^(?P<base>[1-9][0-9]*g\.[1-9][0-9]*gb)(?P<attr>(?:[.+-][a-z]+)*)$")
# config_label_prefix + "-" + 10 hex digits is a Kubernetes label value (63 characters at most) and a config name.
_LABEL_PREFIX = re.compile(r"^[A-Za-z0-9][-_.A-Za-z0-9]{0,51}$")
_DIGITS = re.compile(r"^[0-9]{1,18}$")
# Beyond any GPU (sizes of a demand item); a larger value is a typo, refused rather than reported unmet.
_MEMORY_GIB_MAX = 1 << 20
_SLICES_MAX = 64


class PlanInputError(GpuopsError):
    """Input the planner cannot use: found before anything is planned, nothing applies."""


class _TooBig(Exception):
    """The exact search would exceed its bound; the heuristic takes over."""


# --------------------------------------------------------------------------
# Fleet facts -> planner values
# --------------------------------------------------------------------------

_GEOMETRY_CACHE = {}


def geometry_from_profiles(profiles):
    """A GpuGeometry from mig_facts' ``supported_profiles`` (the same rules mig_config uses)."""
    key = json.dumps(profiles, sort_keys=True)
    cached = _GEOMETRY_CACHE.get(key)
    if cached is not None:
        return cached
    geometry = host_layout.geometry_from_profiles(profiles)
    if len(_GEOMETRY_CACHE) > 64:
        _GEOMETRY_CACHE.clear()
    _GEOMETRY_CACHE[key] = geometry
    return geometry


class _Gi(object):
    __slots__ = ("gi_id", "profile_id", "start", "size", "sm", "names", "busy", "busy_devices", "value")

    def __init__(self, gi_id, profile_id, start, size, sm, names, busy, busy_devices, value):
        self.gi_id, self.profile_id, self.start, self.size, self.sm = gi_id, profile_id, start, size, sm
        self.names, self.busy, self.busy_devices, self.value = names, busy, busy_devices, value


class _Gpu(object):
    """One GPU as the planner sees it."""

    def __init__(self, node, facts, geometry):
        self.node = node
        self.index = facts["index"]
        self.name = facts.get("name", "")
        self.pci_device_id = str(facts.get("pci_device_id") or "")
        self.geometry = geometry
        self.mig_enabled = bool(facts.get("mig_enabled"))
        self.note = None
        procs = facts.get("processes") or []
        # A GPU a pod holds whole (facts["pods"], the kubelet's map) is busy like one running processes.
        self.busy_whole = (not self.mig_enabled) and bool(procs or facts.get("pods"))
        gis = []
        if self.mig_enabled and geometry is not None:
            for gi in facts.get("gpu_instances") or []:
                profile = geometry.gi_profile(gi["profile_id"])
                if profile is None:
                    raise PlanInputError("%s GPU %s: GPU instance %s has profile ID %s, which the GPU's profile "
                                         "list does not have" % (node, self.index, gi.get("id"), gi["profile_id"]))
                names, cis, busy_devices = [], [], []
                for ci in gi.get("compute_instances") or []:
                    name = geometry.device_name(gi["profile_id"], ci["profile_id"]) or ci.get("profile")
                    names.append(name)
                    pids = tuple(p["pid"] for p in ci.get("processes") or [])
                    # Pods the kubelet allocated the device to (ci["pods"]): allocated is busy, never destroyed.
                    pods = tuple(ci.get("pods") or ())
                    cis.append(layout.ComputeInstance(ci["id"], ci["profile_id"], ci["placement"]["start"], pids,
                                                      ci.get("mig_device_uuid"), pods))
                    if pids or pods:
                        busy = {"node": node, "gpu": self.index, "device": name,
                                "uuid": ci.get("mig_device_uuid"), "pids": list(pids)}
                        busy_devices.append(dict(busy, pods=list(pods)) if pods else busy)
                value = layout.GpuInstance(gi["id"], gi["profile_id"], gi["placement"]["start"], tuple(cis))
                gis.append(_Gi(gi["id"], gi["profile_id"], gi["placement"]["start"], profile.memory_slices,
                               profile.sm_slices, tuple(names), bool(busy_devices), busy_devices, value))
        try:
            if geometry is not None:
                layout.validate_layout(geometry, [gi.value for gi in gis])
        except layout.LayoutError as e:
            raise PlanInputError("%s GPU %s: its MIG layout in the facts is not one this GPU can have: %s"
                                 % (node, self.index, e))
        gis.sort(key=lambda g: (g.start, g.profile_id, g.gi_id))
        self.gis = tuple(gis)

    @property
    def label(self):
        return "%s GPU %s (%s)" % (self.node, self.index, self.name)

    def counts(self):
        out = {}
        for gi in self.gis:
            for name in gi.names:
                out[name] = out.get(name, 0) + 1
        return out

    def signature(self):
        return (id(self.geometry), self.mig_enabled, self.busy_whole,
                tuple((g.profile_id, g.start, g.names, g.busy) for g in self.gis))


def _read_fleet(fleet, skip_unreachable):
    """Nodes -> [_Gpu]; (nodes, skipped, notes). Raises PlanInputError on bad facts."""
    if not isinstance(fleet, Mapping) or not fleet:
        raise PlanInputError("the fleet is empty: no node facts to plan from (run gpuops.mig.mig_facts on the "
                             "GPU nodes first)")
    skipped = []
    unreachable = []
    geometry_by_model = {}
    raw = {}
    odd = [node for node in fleet if not isinstance(node, str) or not node or not node.isprintable()]
    if odd:
        raise PlanInputError("fleet: node names must be non-empty printable strings, got %s" % describe(odd[0]))
    for node in sorted(fleet):
        facts = fleet[node]
        if isinstance(facts, Mapping) and "gpuops_mig" in facts and "gpus" not in facts:
            facts = facts["gpuops_mig"]
        if not isinstance(facts, Mapping) or not isinstance(facts.get("gpus"), list):
            unreachable.append(node)
            continue
        driver = facts.get("driver") or {}
        if not isinstance(driver, Mapping):
            raise PlanInputError("%s: driver in the facts must be a mapping, got %s" % (node, describe(driver)))
        if not driver.get("present", True):
            skipped.append({"node": node, "reason": "no usable NVIDIA driver: %s" % driver.get("error")})
            continue
        raw[node] = [_checked_gpu(node, i, gpu) for i, gpu in enumerate(facts["gpus"])]
        for gpu in raw[node]:
            if gpu.get("mig_capable") and gpu.get("supported_profiles"):
                geometry_by_model.setdefault(gpu["pci_device_id"], gpu["supported_profiles"])
    if unreachable and not skip_unreachable:
        raise PlanInputError("no MIG facts from %s (unreachable, or gpuops.mig.mig_facts failed there); nothing was "
                             "planned. Fix the node(s), or limit the run to the others (or set "
                             "skip_unreachable to plan without them)" % ", ".join(unreachable))
    for node in unreachable:
        skipped.append({"node": node, "reason": "no facts (unreachable, or mig_facts failed)"})
    nodes = {}
    for node, node_gpus in raw.items():
        gpus = []
        for gpu in node_gpus:
            if not gpu.get("mig_capable"):
                continue
            profiles = gpu.get("supported_profiles") or geometry_by_model.get(gpu["pci_device_id"])
            geometry = geometry_from_profiles(profiles) if profiles else None
            item = _Gpu(node, gpu, geometry)
            if geometry is None:
                item.note = "lists no MIG profiles (older drivers list them only while MIG is enabled); left as is"
            gpus.append(item)
        nodes[node] = gpus
    if not nodes:
        raise PlanInputError("the fleet is empty: no node with usable MIG facts (%s)"
                             % "; ".join("%s: %s" % (s["node"], s["reason"]) for s in skipped))
    return nodes, skipped


# --------------------------------------------------------------------------
# Demand
# --------------------------------------------------------------------------

def _checked_gpu(node, position, gpu):
    """One GPU of a node's facts, with what the planner reads checked: a copy, or PlanInputError naming it."""
    if not isinstance(gpu, Mapping):
        raise PlanInputError("%s gpus[%d] must be a mapping (a GPU of gpuops.mig.mig_facts), got %s"
                             % (node, position, describe(gpu)))
    index = gpu.get("index")
    if not _is_int(index):
        raise PlanInputError("%s gpus[%d]: index must be a non-negative integer, got %s"
                             % (node, position, describe(index)))
    label = "%s GPU %d" % (node, index)
    checked = dict(gpu)
    for key in ("mig_capable", "mig_enabled"):
        _flag(gpu.get(key, False), "%s: %s" % (label, key))
    if not isinstance(gpu.get("name", ""), str):
        raise PlanInputError("%s: name must be a string, got %s" % (label, describe(gpu.get("name"))))
    if not isinstance(gpu.get("processes") or [], list):
        raise PlanInputError("%s: processes must be a list, got %s" % (label, describe(gpu.get("processes"))))
    _check_pods(gpu.get("pods"), label)
    devices = gpu.get("mig_devices") or {}
    if not isinstance(devices, Mapping) or not all(isinstance(n, str) for n in devices):
        raise PlanInputError("%s: mig_devices must be a mapping of MIG device name to count, got %s"
                             % (label, describe(devices)))
    if not gpu.get("mig_capable"):
        return checked
    try:
        checked["pci_device_id"] = check_pci_id(gpu.get("pci_device_id"), label)
        checked["supported_profiles"] = check_profiles(gpu.get("supported_profiles"), label)
    except GpuopsError as e:
        raise PlanInputError(str(e))
    instances = gpu.get("gpu_instances") or []
    if not isinstance(instances, list):
        raise PlanInputError("%s: gpu_instances must be a list, got %s" % (label, describe(instances)))
    for i, gi in enumerate(instances):
        _check_instance(gi, "%s gpu_instances[%d]" % (label, i))
        cis = gi.get("compute_instances") or []
        if not isinstance(cis, list):
            raise PlanInputError("%s gpu_instances[%d]: compute_instances must be a list, got %s"
                                 % (label, i, describe(cis)))
        for j, ci in enumerate(cis):
            where = "%s gpu_instances[%d] compute_instances[%d]" % (label, i, j)
            _check_instance(ci, where)
            processes = ci.get("processes") or []
            if not isinstance(processes, list) or not all(isinstance(p, Mapping) and _is_int(p.get("pid"))
                                                          for p in processes):
                raise PlanInputError("%s: processes must be a list of {pid: integer}, got %s"
                                     % (where, describe(processes)))
            for key in ("profile", "mig_device_uuid"):
                if ci.get(key) is not None and not isinstance(ci.get(key), str):
                    raise PlanInputError("%s: %s must be a string, got %s" % (where, key, describe(ci.get(key))))
            _check_pods(ci.get("pods"), where)
    return checked


def _check_pods(pods, where):
    """The holders of a GPU or MIG device (mig_node_info's pods): a list of "namespace/pod/container", or null."""
    if pods is not None and (not isinstance(pods, list) or not all(isinstance(p, str) and p for p in pods)):
        raise PlanInputError("%s: pods must be a list of namespace/pod/container names, got %s"
                             % (where, describe(pods)))


def _check_instance(item, where):
    if not isinstance(item, Mapping):
        raise PlanInputError("%s must be a mapping, got %s" % (where, describe(item)))
    placement = item.get("placement")
    for key, value in (("id", item.get("id")), ("profile_id", item.get("profile_id")),
                       ("placement start", placement.get("start") if isinstance(placement, Mapping) else None)):
        if not _is_int(value):
            raise PlanInputError("%s: %s must be a non-negative integer, got %s" % (where, key, describe(value)))


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def profile_from_resource(resource):
    """nvidia.com/mig-1g.5gb.me -> 1g.5gb+me (the device plugin writes '+' as '.'); None if not MIG.
    A time-sliced resource renamed with '.shared' is its profile too (nvidia.com/mig-1g.10gb.shared -> 1g.10gb)."""
    if not resource.startswith(_RESOURCE_PREFIX):
        return None
    suffix = resource[len(_RESOURCE_PREFIX):]
    if suffix.endswith(_SHARED_SUFFIX):
        suffix = suffix[:-len(_SHARED_SUFFIX)]
    match = _PROFILE.match(suffix)
    if not match:
        return suffix
    attr = match.group("attr")
    if attr.startswith("."):
        attr = "+" + attr[1:]
    return match.group("base") + attr


def _count(value, where):
    # A string of ASCII digits is a count too (extra vars and surveys give strings).
    if isinstance(value, str) and _DIGITS.match(value.strip()):
        return int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanInputError("%s: count must be a non-negative integer, got %s" % (where, describe(value)))
    return int(value)


def _number(value, where, what, most):
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= most):
        raise PlanInputError("%s: %s must be a number above 0 and at most %d, got %s"
                             % (where, what, most, describe(value)))
    return value


def _flag(value, where):
    if not isinstance(value, bool):
        raise PlanInputError("%s must be true or false, got %s" % (where, describe(value)))
    return value


def _names(value, where, what="a list of node names"):
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise PlanInputError("%s must be %s, got %s" % (where, what, describe(value)))
    return value


class _Dim(object):
    """One demanded kind of device, with the nodes that may supply it."""

    def __init__(self, key, text, nodes, strict):
        self.key = key          # ("profile", name) or ("size", memory_gib, compute_slices)
        self.text = text
        self.nodes = nodes      # frozenset or None (any node)
        self.count = 0
        self.spare = 0
        self.strict = strict
        self.sources = []
        self.accepts = {}       # geometry id -> device name or None

    @property
    def total(self):
        return self.count + self.spare

    def accepted_name(self, geometry):
        gid = id(geometry)
        if gid not in self.accepts:
            self.accepts[gid] = _accepted_name(self.key, geometry)
        return self.accepts[gid]


def _accepted_name(key, geometry):
    if key[0] == "profile":
        try:
            device_type = geometry.device_type(key[1])
        except layout.LayoutError:
            return None
        # Only full GPU instances are MIG resources the device plugin advertises.
        return device_type.name if device_type.is_full else None
    memory_gib, compute = key[1], key[2]
    fits = [p for p in geometry.profiles
            if _profile_gib(p, geometry) >= memory_gib and p.sm_slices >= compute]
    if not fits:
        return None
    base = [p for p in fits if "+" not in p.name and "-" not in p.name] or fits
    best = min(base, key=lambda p: (p.memory_slices, p.sm_slices, p.name))
    return best.name


def _profile_gib(profile, geometry):
    # The name carries the memory: 3g.40gb -> 40 (what users and the device plugin see).
    match = re.match(r"^[0-9]+g\.([0-9]+)gb", profile.name)
    return int(match.group(1)) if match else 0


def demand_items(demand):
    """The demand option as a list of items: {name: count} becomes [{profile: name, count: count}]."""
    if demand is None:
        return []
    if isinstance(demand, Mapping):
        return [{"profile": name, "count": count} for name, count in demand.items()]
    if isinstance(demand, list):
        return list(demand)
    raise PlanInputError("demand must be a mapping of MIG profile to count, or a list of items; got %s"
                         % describe(demand))


def _parse_demand(demand, node_groups, policy_spare, strict_default=True):
    """Demand items -> [_Dim]; unknown profiles in explicit demand raise."""
    items = demand_items(demand)
    dims = {}
    order = []
    for i, item in enumerate(items):
        where = "demand[%d]" % i
        if not isinstance(item, Mapping):
            raise PlanInputError("%s: an item must be a mapping, got %s" % (where, describe(item)))
        unknown = set(item) - {"profile", "memory_gib", "compute_slices", "count", "nodes", "group", "source",
                               "strict", "spare"}
        if unknown:
            raise PlanInputError("%s: unknown key(s) %s; allowed: profile, memory_gib, compute_slices, count, "
                                 "nodes, group" % (where, ", ".join(sorted(map(repr, unknown)))))
        label = item.get("profile") if isinstance(item.get("profile"), str) and item.get("profile") else "size"
        count = _count(item.get("count", 1), "%s (%s)" % (where, label))
        strict = _flag(item.get("strict", strict_default), "%s: strict" % where)
        spare = _flag(item.get("spare", False), "%s: spare" % where)
        source = item.get("source")
        if source is not None and not isinstance(source, str):
            raise PlanInputError("%s: source must be a string, got %s" % (where, describe(source)))
        if "profile" in item:
            if "memory_gib" in item or "compute_slices" in item:
                raise PlanInputError("%s: give a profile or a size (memory_gib, compute_slices), not both" % where)
            name = item["profile"]
            if not isinstance(name, str) or not name:
                raise PlanInputError("%s: profile must be a MIG profile name such as 1g.10gb, got %s"
                                     % (where, describe(name)))
            key = ("profile", name)
            text = _text(name)
        elif "memory_gib" in item:
            memory = _number(item["memory_gib"], where, "memory_gib", _MEMORY_GIB_MAX)
            compute = item.get("compute_slices", 1)
            if isinstance(compute, bool) or not isinstance(compute, int) or not 1 <= compute <= _SLICES_MAX:
                raise PlanInputError("%s: compute_slices must be an integer from 1 to %d, got %s"
                                     % (where, _SLICES_MAX, describe(compute)))
            key = ("size", memory, compute)
            text = ">=%sGiB/%dg" % (memory, compute)
        else:
            raise PlanInputError("%s: needs a profile (e.g. 1g.10gb) or a size (memory_gib, compute_slices)" % where)
        allowed = None
        if item.get("group") is not None:
            group = item["group"]
            if not isinstance(group, str) or group not in (node_groups or {}):
                raise PlanInputError("%s: unknown node group %s" % (where, describe(group)))
            allowed = frozenset(node_groups[group])
            text += " on %s" % _text(group)
        if item.get("nodes") is not None:
            _names(item["nodes"], "%s: nodes" % where)
            listed = frozenset(item["nodes"])
            allowed = listed if allowed is None else allowed & listed
            if item.get("group") is None:
                text += " on %s" % ",".join(_text(n) for n in sorted(listed))
        dim_key = (key, allowed)
        if dim_key not in dims:
            dims[dim_key] = _Dim(key, text, allowed, strict)
            order.append(dim_key)
        dim = dims[dim_key]
        dim.strict = dim.strict and strict
        if spare:
            dim.spare += count
        else:
            dim.count += count
        if source:
            dim.sources.append(source)
    for name, count in (policy_spare or {}).items():
        if not isinstance(name, str) or not name:
            raise PlanInputError("policy spare: keys must be MIG profile names, got %s" % describe(name))
        count = _count(count, "policy spare %s" % name)
        dim_key = (("profile", name), None)
        if dim_key not in dims:
            dims[dim_key] = _Dim(("profile", name), _text(name), None, True)
            order.append(dim_key)
        dims[dim_key].spare += count
    return [dims[k] for k in order]


# --------------------------------------------------------------------------
# Per-GPU options
# --------------------------------------------------------------------------

def _span(start, size):
    return ((1 << size) - 1) << start


_CONTIG = {}


def _contig(mask, width):
    """Sum over maximal free runs of length squared."""
    key = (mask, width)
    value = _CONTIG.get(key)
    if value is None:
        value = run = 0
        for bit in range(width):
            if mask >> bit & 1:
                value += run * run
                run = 0
            else:
                run += 1
        value += run * run
        _CONTIG[key] = value
    return value


_ADDITIONS = {}


def _additions(geometry, mask, sm_used, used_counts, profiles):
    """{added counts (aligned with profiles): best contiguity} for new GIs of these profiles in the free space."""
    key = (id(geometry), mask, sm_used, tuple(sorted(used_counts.items())), tuple(p.id for p in profiles))
    cached = _ADDITIONS.get(key)
    if cached is not None:
        return cached
    width = geometry.memory_slices
    room = [p.max_count - used_counts.get(p.id, 0) for p in profiles]
    results = {}
    counts = [0] * len(profiles)

    def visit(i, first_start, mask, sm):
        vec = tuple(counts)
        score = _contig(mask, width)
        if results.get(vec, -1) < score:
            results[vec] = score
        for k in range(i, len(profiles)):
            p = profiles[k]
            if counts[k] >= room[k] or sm + p.sm_slices > geometry.sm_slices:
                continue
            for start in p.placements:
                if k == i and start < first_start:
                    continue
                span = _span(start, p.memory_slices)
                if mask & span:
                    continue
                counts[k] += 1
                visit(k, start + 1, mask | span, sm + p.sm_slices)
                counts[k] -= 1

    visit(0, 0, mask, sm_used)
    if len(_ADDITIONS) > 200000:
        _ADDITIONS.clear()
    _ADDITIONS[key] = results
    return results


class _Option(object):
    __slots__ = ("vec", "whole", "destroyed", "contig", "changed", "kept", "added", "enable")

    def __init__(self, vec, whole, destroyed, contig, changed, kept, added, enable):
        self.vec, self.whole, self.destroyed, self.contig = vec, whole, destroyed, contig
        self.changed, self.kept, self.added, self.enable = changed, kept, added, enable


_OPTIONS = {}


def _gpu_options(gpu, names, frozen_names):
    """Every useful final layout of one GPU, projected on ``names``.

    Returns (current option, [options]); each option's vec counts devices of
    each name in ``names``. GIs holding a busy device are always kept; so are
    GIs holding a name in ``frozen_names`` (a Kubernetes floor the planner
    cannot map to one device). Options with the same (vec, whole) keep the
    fewest destroyed, then the best contiguity.
    """
    key = (gpu.signature(), names, frozen_names)
    cached = _OPTIONS.get(key)
    if cached is not None:
        return cached
    geometry = gpu.geometry
    width = geometry.memory_slices if geometry else 0
    index = {n: i for i, n in enumerate(names)}
    if geometry is None or (not gpu.mig_enabled and gpu.busy_whole):
        current = _Option(tuple([0] * len(names)), 0 if gpu.mig_enabled or gpu.busy_whole or geometry is None
                          else 1, 0, width * width, False, None, (), False)
        result = (current, [current])
        _OPTIONS[key] = result
        return result
    profiles = []
    for name in names:
        try:
            device_type = geometry.device_type(name)
        except layout.LayoutError:
            continue
        if device_type.is_full and device_type.name == name:
            profiles.append(device_type.gi)
    best = {}

    def offer(vec, whole, destroyed, contig, changed, kept, added, enable):
        k = (vec, whole)
        old = best.get(k)
        if old is None or (destroyed, -contig, changed) < (old.destroyed, -old.contig, old.changed):
            best[k] = _Option(vec, whole, destroyed, contig, changed, kept, added, enable)

    if not gpu.mig_enabled:
        current = _Option(tuple([0] * len(names)), 1, 0, width * width, False, None, (), False)
        best[(current.vec, 1)] = current
        for added, contig in _additions(geometry, 0, 0, {}, profiles).items():
            if not any(added):
                continue
            vec = [0] * len(names)
            for p, n in zip(profiles, added):
                vec[index[p.name]] += n
            offer(tuple(vec), 0, 0, contig, True, (), _pairs(profiles, added), True)
        options = sorted(best.values(), key=_option_order)
        _OPTIONS[key] = (current, options)
        return _OPTIONS[key]

    gis = gpu.gis
    fixed = [i for i, g in enumerate(gis) if g.busy or any(n in frozen_names for n in g.names)]
    free = [i for i in range(len(gis)) if i not in fixed]
    current = None
    for bits in range(1 << len(free)):
        kept = list(fixed) + [free[j] for j in range(len(free)) if bits >> j & 1]
        mask = sm = 0
        used = {}
        vec = [0] * len(names)
        for i in kept:
            g = gis[i]
            mask |= _span(g.start, g.size)
            sm += g.sm
            used[g.profile_id] = used.get(g.profile_id, 0) + 1
            for n in g.names:
                j = index.get(n)
                if j is not None:
                    vec[j] += 1
        destroyed = sum(len(gis[i].names) for i in free if not bits >> free.index(i) & 1)
        kept_t = tuple(sorted(kept))
        all_kept = len(kept) == len(gis)
        for added, contig in _additions(geometry, mask, sm, used, profiles).items():
            v = list(vec)
            for p, n in zip(profiles, added):
                v[index[p.name]] += n
            changed = not all_kept or any(added)
            option_added = _pairs(profiles, added)
            offer(tuple(v), 0, destroyed, contig, changed, kept_t, option_added, False)
            if not changed:
                current = best[(tuple(v), 0)]
    options = sorted(best.values(), key=_option_order)
    if len(_OPTIONS) > 50000:
        _OPTIONS.clear()
    _OPTIONS[key] = (current, options)
    return _OPTIONS[key]


def _pairs(profiles, added):
    return tuple((p.name, n) for p, n in zip(profiles, added) if n)


def _option_order(o):
    return (o.destroyed, -o.contig, o.vec, o.whole)


# --------------------------------------------------------------------------
# The fleet model shared by both searches
# --------------------------------------------------------------------------

class _NodeModel(object):
    """What one node can supply: names it can serve, floors, its GPUs' options."""

    def __init__(self, name, gpus, dims, in_use, touchable):
        self.name = name
        self.gpus = gpus
        self.touchable = touchable
        # Names this node's GPUs can give to some dim.
        serve = {}
        for d, dim in enumerate(dims):
            if dim.nodes is not None and name not in dim.nodes:
                continue
            for gpu in gpus:
                if gpu.geometry is None:
                    continue
                accepted = dim.accepted_name(gpu.geometry)
                if accepted is not None:
                    serve.setdefault(accepted, set()).add(d)
        counts = {}
        busy = {}
        for gpu in gpus:
            for n, c in gpu.counts().items():
                counts[n] = counts.get(n, 0) + c
            for gi in gpu.gis:
                for dev in gi.busy_devices:
                    busy[dev["device"]] = busy.get(dev["device"], 0) + 1
        self.current_counts = counts
        used = {}
        self.used_note = []
        for n, c in (in_use or {}).items():
            if n == WHOLE:
                continue
            have = counts.get(n, 0)
            if c > have:
                self.used_note.append("Kubernetes counts %d %s in use, the node has %d" % (c, n, have))
            used[n] = min(c, have)
        for n, c in busy.items():
            used[n] = max(used.get(n, 0), c)
        self.used = used
        # A floor above the busy devices cannot be pinned to devices: keep every device of that name.
        self.frozen = frozenset(n for n, c in used.items() if c > busy.get(n, 0))
        self.names = tuple(sorted(set(serve) | set(used)))
        self.serve = {n: tuple(sorted(serve.get(n, ()))) for n in self.names}
        whole_free = sum(1 for g in gpus if not g.mig_enabled and not g.busy_whole and g.geometry is not None)
        self.used_whole = min(int((in_use or {}).get(WHOLE, 0)), whole_free)
        self.whole_free_now = whole_free - self.used_whole
        self.options = [_gpu_options(g, self.names, self.frozen) for g in gpus]
        self.current_contig = sum(cur.contig for cur, _opts in self.options)

    def free_of(self, totals):
        """Free devices per name (after the floor) from a node-wide count vector, or None if below the floor."""
        free = []
        for n, total in zip(self.names, totals):
            f = total - self.used.get(n, 0)
            if f < 0:
                return None
            free.append(f)
        return free

    def current_totals(self):
        return tuple(self.current_counts.get(n, 0) for n in self.names)


def _allocate(node, free, remaining, dims_order):
    """Give free devices to dims, most restrictive dim first; returns {dim: count}."""
    out = {}
    for n, f in zip(node.names, free):
        for d in sorted(node.serve[n], key=dims_order):
            if f <= 0:
                break
            take = min(f, remaining[d])
            if take > 0:
                out[d] = out.get(d, 0) + take
                remaining[d] -= take
                f -= take
    return out


# --------------------------------------------------------------------------
# Exact search
# --------------------------------------------------------------------------

class _Budget(object):
    def __init__(self, limit):
        self.left = limit

    def spend(self, n):
        self.left -= n
        if self.left < 0:
            raise _TooBig()


def _node_frontier(node, dims, budget):
    """{(totals capped, whole capped): (destroyed, -contig, choices)} over every combination of GPU options."""
    caps = []
    for n in node.names:
        caps.append(node.used.get(n, 0) + sum(dims[d].total for d in node.serve[n]))
    states = {(tuple([0] * len(node.names)), 0): (0, 0, ())}
    for g, (current, options) in enumerate(node.options):
        budget.spend(len(states) * len(options))
        nxt = {}
        for (vec, whole), (destroyed, neg, choices) in states.items():
            for k, o in enumerate(options):
                v = tuple(min(c, a + b) for c, a, b in zip(caps, vec, o.vec))
                key = (v, whole + o.whole)
                cost = (destroyed + o.destroyed, neg - o.contig)
                old = nxt.get(key)
                if old is None or cost < old[:2]:
                    nxt[key] = cost + (choices + (k,),)
        states = nxt
    return states


def _dim_vectors(node, free, dims, caps):
    """Every way to hand a node's free devices to the dims it may serve (capped)."""
    results = [tuple([0] * len(dims))]
    for n, f in zip(node.names, free):
        targets = node.serve[n]
        if not targets or f <= 0:
            continue
        nxt = set()
        for base in results:
            for split in _splits(f, [caps[d] - base[d] for d in targets]):
                v = list(base)
                for d, s in zip(targets, split):
                    v[d] += s
                nxt.add(tuple(v))
        results = list(nxt)
    return results


def _splits(total, rooms):
    """Maximal ways to put up to ``total`` into bins of the given rooms."""
    if len(rooms) == 1:
        return [(min(total, rooms[0]),)]
    out = []
    for first in range(min(total, rooms[0]) + 1):
        for rest in _splits(total - first, rooms[1:]):
            if first < min(total, rooms[0]) and sum(rest) < min(total - first, sum(rooms[1:])):
                continue
            out.append((first,) + rest)
    return out


def _exact(models, dims, whole_floor, budget):
    caps = tuple(d.total for d in dims) + (whole_floor,)
    zero = tuple([0] * len(caps))
    fleet = {zero: (0, 0, 0, ())}
    for node in models:
        options = []   # (dim vec with whole, touched, destroyed, contig, choice)
        current_free = node.free_of(node.current_totals())
        for dv in _dim_vectors(node, current_free, dims, caps[:-1]):
            options.append((dv + (min(node.whole_free_now, whole_floor),), 0, 0, node.current_contig, None))
        if node.touchable:
            frontier = _node_frontier(node, dims, budget)
            for (totals, whole), (destroyed, neg, choices) in frontier.items():
                if all(node.options[g][1][k].changed is False for g, k in enumerate(choices)):
                    continue
                free = node.free_of(totals)
                if free is None:
                    continue
                whole_left = max(0, whole - node.used_whole)
                for dv in _dim_vectors(node, free, dims, caps[:-1]):
                    options.append((dv + (min(whole_left, whole_floor),), 1, destroyed, -neg, choices))
        budget.spend(len(fleet) * len(options))
        nxt = {}
        for state, (touched, destroyed, neg, picks) in fleet.items():
            for vec, t, dd, contig, choice in options:
                s = tuple(min(c, a + b) for c, a, b in zip(caps, state, vec))
                cost = (touched + t, destroyed + dd, neg - contig)
                old = nxt.get(s)
                if old is None or cost < old[:3]:
                    nxt[s] = cost + ((picks, choice),)
        fleet = nxt
    best = None
    for state, (touched, destroyed, neg, picks) in fleet.items():
        if state[-1] < whole_floor:
            continue
        unmet = sum(max(0, d.count - s) for d, s in zip(dims, state[:-1]))
        spare_unmet = sum(c - s for c, s in zip(caps[:-1], state[:-1])) - unmet
        rank = (unmet, spare_unmet, touched, destroyed, neg, state)
        if best is None or rank < best[0]:
            best = (rank, picks)
    if best is None:
        raise PlanInputError("internal planner error: keeping every node as it is was not a solution")
    # Unwind the picks chain: ((((), c1), c2), c3)
    chain = []
    picks = best[1]
    while picks:
        picks, choice = picks
        chain.append(choice)
    chain.reverse()
    return dict((node.name, choice) for node, choice in zip(models, chain))


# --------------------------------------------------------------------------
# Heuristic for large fleets
# --------------------------------------------------------------------------

def _greedy_node(node, remaining, dims_order):
    """A touched layout for one node against the remaining demand: (covered, destroyed, contig, choices).

    Two passes over the GPUs: first each GPU takes the option that covers the
    most without destroying anything, then a GPU may switch to an option that
    destroys devices if that covers more.
    """
    options = node.options
    choices = [None] * len(options)
    names = node.names

    def evaluate(picks):
        totals = [0] * len(names)
        whole = 0
        destroyed = 0
        contig = 0
        for (current, opts), k in zip(options, picks):
            o = current if k is None else opts[k]
            for i, v in enumerate(o.vec):
                totals[i] += v
            whole += o.whole
            destroyed += o.destroyed
            contig += o.contig
        free = node.free_of(totals)
        if free is None:
            return None
        rem = list(remaining)
        covered = sum(_allocate(node, free, rem, dims_order).values())
        return covered, destroyed, contig, whole

    best = evaluate(choices)
    for allow_destroy in (False, True):
        for g, (current, opts) in enumerate(options):
            for k, o in enumerate(opts):
                if o.destroyed and not allow_destroy:
                    continue
                trial = choices[:g] + [k] + choices[g + 1:]
                result = evaluate(trial)
                if result is None:
                    continue
                if (result[0], -result[1], result[2]) > (best[0], -best[1], best[2]):
                    best, choices = result, trial
    changed = any(k is not None and options[g][1][k].changed for g, k in enumerate(choices))
    final = tuple(options[g][1].index(options[g][0]) if k is None else k for g, k in enumerate(choices))
    return best, changed, final


def _greedy(models, dims, whole_floor):
    def dims_order(d):
        return (len(dims[d].nodes) if dims[d].nodes is not None else 1 << 30, d)

    remaining = [d.total for d in dims]
    current_alloc = {}
    for node in models:
        current_alloc[node.name] = _allocate(node, node.free_of(node.current_totals()), remaining, dims_order)
    whole_now = sum(n.whole_free_now for n in models)
    chosen = {}
    heap = []

    def gain_of(node):
        back = list(remaining)
        for d, c in current_alloc[node.name].items():
            back[d] += c
        result, changed, choices = _greedy_node(node, back, dims_order)
        if result is None or not changed:
            return None
        covered, destroyed, contig, whole = result
        own = sum(current_alloc[node.name].values())
        whole_loss = node.whole_free_now - max(0, whole - node.used_whole)
        return covered - own, destroyed, contig - node.current_contig, whole_loss, choices, back

    for node in models:
        if node.touchable and sum(remaining):
            g = gain_of(node)
            if g is not None and g[0] > 0:
                heapq.heappush(heap, (-g[0], g[1], -g[2], node.name, g))
    by_name = dict((n.name, n) for n in models)
    while heap and sum(remaining) > 0:
        name = heapq.heappop(heap)[3]
        node = by_name[name]
        g = gain_of(node)
        if g is None or g[0] <= 0:
            continue
        if heap and (-g[0], g[1], -g[2], name) > heap[0][:4]:
            heapq.heappush(heap, (-g[0], g[1], -g[2], name, g))
            continue
        if whole_now - g[3] < whole_floor:
            continue   # would eat a whole GPU the policy keeps
        whole_loss, choices, back = g[3], g[4], g[5]
        # Take it: give back the node's current allocation, then allocate what it now supplies.
        remaining[:] = back
        totals = [0] * len(node.names)
        for (dummy, opts), k in zip(node.options, choices):
            for i, v in enumerate(opts[k].vec):
                totals[i] += v
        current_alloc[name] = _allocate(node, node.free_of(totals), remaining, dims_order)
        whole_now -= whole_loss
        chosen[name] = choices
    return chosen


def _lower_bound_nodes(models, dims, deficit):
    """Fewest nodes any plan must touch: deficit / the most one node could supply (a per-GPU upper bound)."""
    if deficit <= 0:
        return 0
    best = 0
    for node in models:
        if not node.touchable:
            continue
        supply = 0
        for current, opts in node.options:
            top = 0
            for o in opts:
                free = 0
                for n, v in zip(node.names, o.vec):
                    if node.serve.get(n):
                        free += min(v, sum(dims[d].total for d in node.serve[n]))
                top = max(top, free)
            supply += top
        best = max(best, supply)
    if best == 0:
        return 0
    return -(-deficit // best)


# --------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------

def plan_fleet(fleet, demand, policy=None, in_use=None, node_groups=None, exact_limit=EXACT_LIMIT,
               unresolved=None, whole_pending=0, config_label_prefix="gpuops-plan"):
    """Plan the fleet. Returns a JSON-friendly dict: {version, nodes, report, mig_parted}.

    Raises PlanInputError for input that cannot be planned (nothing is planned then).
    ``unresolved`` lists requests the caller could not turn into demand (pods
    asking for a profile no GPU offers); they are carried into the report.
    ``whole_pending`` is the number of whole GPUs pending pods ask for (mixed
    strategy): the plan keeps that many whole GPUs free beside the policy's.
    """
    if policy is not None and not isinstance(policy, Mapping):
        raise PlanInputError("policy must be a mapping (nodes, spare, whole_gpus, skip_unreachable), got %s"
                             % describe(policy))
    policy = dict(policy or {})
    unknown = set(policy) - {"nodes", "spare", "whole_gpus", "skip_unreachable"}
    if unknown:
        raise PlanInputError("policy: unknown key(s) %s; allowed: nodes, spare, whole_gpus, skip_unreachable"
                             % ", ".join(sorted(map(repr, unknown))))
    _check_options(node_groups, exact_limit, config_label_prefix)
    nodes, skipped = _read_fleet(fleet, _flag(policy.get("skip_unreachable", False), "policy skip_unreachable"))
    touchable_list = policy.get("nodes")
    if touchable_list is not None:
        _names(touchable_list, "policy nodes")
        missing = [n for n in touchable_list if n not in fleet]
        if missing:
            raise PlanInputError("policy nodes names %s, which the fleet does not have (fleet: %s)"
                                 % (", ".join(map(_text, missing)), ", ".join(sorted(fleet))))
    touchable = set(touchable_list) if touchable_list is not None else set(nodes)
    whole_policy = _count(policy.get("whole_gpus", 0), "policy whole_gpus")
    spare = policy.get("spare") or {}
    if not isinstance(spare, Mapping):
        raise PlanInputError("policy spare must be a mapping of MIG profile to count, got %s" % describe(spare))
    dims = _parse_demand(demand, node_groups, spare)
    in_use = in_use or {}
    if not isinstance(in_use, Mapping):
        raise PlanInputError("in_use must be a mapping of node to {device name: count}")
    for node, counts in in_use.items():
        if not isinstance(counts, Mapping):
            raise PlanInputError("in_use[%s] must be a mapping of device name to count" % node)
        for n, c in counts.items():
            _count(c, "in_use[%s][%s]" % (node, n))

    # Which dims can any GPU of the fleet serve at all?
    geometries = {}
    for gpus in nodes.values():
        for g in gpus:
            if g.geometry is not None:
                geometries[id(g.geometry)] = (g.geometry, g.name)
    unresolved = list(unresolved or [])
    offered = sorted(set(n for geom, _name in geometries.values()
                         for n in (p.name for p in geom.profiles)))
    live_dims = []
    for dim in dims:
        if any(dim.accepted_name(geom) for geom, _n in geometries.values()):
            if dim.nodes is not None:
                if dim.strict and not (set(dim.nodes) & set(nodes)):
                    raise PlanInputError("demand %s names no node of the fleet" % dim.text)
            live_dims.append(dim)
            continue
        why = ("no GPU in the fleet offers MIG profile %s (offered: %s)" % (_text(dim.key[1]), ", ".join(offered))
               if dim.key[0] == "profile" else
               "no MIG profile of any GPU in the fleet has %s GiB and %d compute slices" % dim.key[1:])
        if dim.strict:
            raise PlanInputError("demand %s: %s" % (dim.text, why))
        unresolved.append({"request": dim.text, "count": dim.count, "reason": why, "sources": dim.sources})
    dims = live_dims

    # Whole GPUs: keep the policy's number (or pending whole-GPU pods') free, never below what is there now.
    whole_pending = _count(whole_pending, "pending whole-GPU requests")
    models = [_NodeModel(name, nodes[name], dims, in_use.get(name), name in touchable)
              for name in sorted(nodes)]
    whole_free_now = sum(m.whole_free_now for m in models)
    whole_floor = min(whole_policy + whole_pending, whole_free_now)

    method = "exact"
    try:
        budget = _Budget(exact_limit)
        choice_by_node = _exact(models, dims, whole_floor, budget)
    except _TooBig:
        method = "greedy"
        choice_by_node = _greedy(models, dims, whole_floor)

    return _build(models, dims, choice_by_node, method, skipped, unresolved, whole_policy, whole_pending,
                  whole_free_now, config_label_prefix, exact_limit)


def _check_options(node_groups, exact_limit, config_label_prefix):
    if node_groups is not None:
        if not isinstance(node_groups, Mapping):
            raise PlanInputError("node_groups must be a mapping of group name to a list of hosts, got %s"
                                 % describe(node_groups))
        for group, members in node_groups.items():
            _names(members, "node_groups[%s]" % describe(group), "a list of host names")
    if isinstance(exact_limit, bool) or not isinstance(exact_limit, int) or exact_limit < 0:
        raise PlanInputError("exact_limit must be a non-negative integer (0: the heuristic at once), got %s"
                             % describe(exact_limit))
    if not isinstance(config_label_prefix, str) or not _LABEL_PREFIX.match(config_label_prefix):
        raise PlanInputError("config_label_prefix must be 1 to 52 letters, digits, '-', '_' or '.', starting with a "
                             "letter or digit (it begins a Kubernetes label value), got %s"
                             % describe(config_label_prefix))


def _build(models, dims, choice_by_node, method, skipped, unresolved, whole_policy, whole_pending, whole_free_now,
           prefix, exact_limit):
    def dims_order(d):
        return (len(dims[d].nodes) if dims[d].nodes is not None else 1 << 30, d)

    remaining = [d.total for d in dims]
    out_nodes = {}
    mig_parted = {}
    totals = {"destroyed": 0, "created": 0}
    busy_kept = []
    whole_gpus = []
    touched = []
    notes = []
    for node in models:
        choices = choice_by_node.get(node.name)
        gpus_out = []
        layouts = []
        entries = []
        node_totals = [0] * len(node.names)
        node_touched = False
        for g, gpu in enumerate(node.gpus):
            current, options = node.options[g]
            option = current if choices is None else options[choices[g]]
            for i, v in enumerate(option.vec):
                node_totals[i] += v
            info = _gpu_result(gpu, option)
            if info["changed"]:
                node_touched = True
            totals["destroyed"] += info["destroyed"]
            totals["created"] += info["created"]
            for gi in gpu.gis:
                busy_kept.extend(gi.busy_devices)
            if not info["mig_enabled"]:
                whole_gpus.append({"node": node.name, "gpu": gpu.index, "name": gpu.name,
                                   "busy": gpu.busy_whole})
            if gpu.note:
                notes.append("%s: %s" % (gpu.label, gpu.note))
            gpus_out.append(info)
            if info["mig_enabled"]:
                layouts.append({"gpus": [gpu.index], "mig_enabled": True, "devices": dict(info["after"])})
                entries.append({"devices": [gpu.index], "mig-enabled": True, "mig-devices": dict(info["after"])})
            else:
                layouts.append({"gpus": [gpu.index], "mig_enabled": False})
                entries.append({"devices": [gpu.index], "mig-enabled": False})
        free = node.free_of(node_totals) or [0] * len(node.names)
        supplied = _allocate(node, free, remaining, dims_order)
        notes.extend("%s: %s" % (node.name, n) for n in node.used_note)
        label = "%s-%s" % (prefix, hashlib.sha256(json.dumps(layouts, sort_keys=True).encode()).hexdigest()[:10])
        if node_touched:
            touched.append(node.name)
        out_nodes[node.name] = {
            "layouts": layouts,
            "config_label": label,
            "touched": node_touched,
            "touchable": node.touchable,
            "gpus": gpus_out,
            "supplies": dict((dims[d].text, c) for d, c in sorted(supplied.items())),
        }
        if layouts:
            mig_parted[node.name] = {"version": "v1", "mig-configs": {label: entries}}
    demand_rows = []
    unmet_total = 0
    spare_unmet = 0
    for d, dim in enumerate(dims):
        got = dim.total - remaining[d]
        met = min(dim.count, got)
        spare_met = got - met
        unmet_total += dim.count - met
        spare_unmet += dim.spare - spare_met
        row = {"request": dim.text, "requested": dim.count, "met": met, "unmet": dim.count - met,
               "nodes": sorted(dim.nodes) if dim.nodes is not None else None}
        if dim.spare:
            row.update(spare=dim.spare, spare_met=spare_met)
        if dim.count - met:
            row["reason"] = "the fleet has no room for more (busy devices, touchable nodes and GPU geometry)"
        if dim.sources:
            row["sources"] = dim.sources
        demand_rows.append(row)
    for item in unresolved:
        unmet_total += item.get("count", 0)
    report = {
        "method": method,
        "exact_limit": exact_limit,
        "demand": demand_rows,
        "unresolved": unresolved,
        "demand_met": unmet_total == 0,
        "unmet_devices": unmet_total,
        "spare_unmet_devices": spare_unmet,
        "nodes_touched": touched,
        "nodes_touched_count": len(touched),
        "devices_destroyed": totals["destroyed"],
        "devices_created": totals["created"],
        "busy_devices_kept": busy_kept,
        "gpus_left_whole": whole_gpus,
        "whole_gpus": {"policy": whole_policy, "pending_whole_gpu_pods": whole_pending, "free_before": whole_free_now,
                       "free_after": sum(1 for w in whole_gpus if not w["busy"])},
        "skipped_nodes": skipped,
        "notes": notes,
    }
    if method == "greedy":
        # Any plan that supplies as much as this one must touch at least this many nodes.
        gained = sum(d.total - r for d, r in zip(dims, remaining)) - _current_cover(models, dims)
        report["nodes_touched_lower_bound"] = _lower_bound_nodes(models, dims, gained)
    return {"version": 1, "nodes": out_nodes, "report": report, "mig_parted": mig_parted}


def _current_cover(models, dims):
    remaining = [d.total for d in dims]

    def order(d):
        return (len(dims[d].nodes) if dims[d].nodes is not None else 1 << 30, d)
    return sum(sum(_allocate(n, n.free_of(n.current_totals()), remaining, order).values()) for n in models)


def _gpu_result(gpu, option):
    """The GPU's layout after the option, proved with plan_gpu (the planner mig_config runs)."""
    before = gpu.counts()
    info = {"index": gpu.index, "name": gpu.name, "pci_device_id": gpu.pci_device_id,
            "mig_enabled_before": gpu.mig_enabled, "before": before}
    geometry = gpu.geometry
    if not option.changed or geometry is None:
        info.update(mig_enabled=gpu.mig_enabled, after=dict(before), changed=False, destroyed=0, created=0)
        return info
    kept = [gpu.gis[i] for i in (option.kept or ())]
    after = {}
    for gi in kept:
        for n in gi.names:
            after[n] = after.get(n, 0) + 1
    for n, c in option.added:
        after[n] = after.get(n, 0) + c
    order = {n: i for i, n in enumerate(geometry.device_names())}
    after = dict(sorted(after.items(), key=lambda item: order.get(item[0], 1 << 30)))
    existing = tuple(gi.value for gi in gpu.gis)
    plan = layout.plan_gpu(geometry, existing, after)   # raises LayoutError on a busy device or a bad layout
    if plan.destroyed_devices != option.destroyed:
        raise PlanInputError("internal planner error: %s destroys %d devices in the plan, %d in the search"
                             % (gpu.label, plan.destroyed_devices, option.destroyed))
    info.update(mig_enabled=True, after=after, changed=True, destroyed=plan.destroyed_devices,
                created=plan.created_devices + 0, largest_free_range=layout.largest_free_range(geometry, plan.result))
    return info


# --------------------------------------------------------------------------
# Demand from the cluster
# --------------------------------------------------------------------------

_FINISHED = ("Succeeded", "Failed")


def _pod_requests(pod, name):
    """{resource: quantity} a pod asks for (limits, else requests; summed over its containers)."""
    out = {}
    spec = _part(pod, "spec", name)
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise PlanInputError("pod %s: spec.containers must be a list, got %s" % (name, describe(containers)))
    for container in containers:
        if not isinstance(container, Mapping):
            raise PlanInputError("pod %s: each container must be a mapping, got %s" % (name, describe(container)))
        resources = _part(container, "resources", name)
        asked = dict(_part(resources, "requests", name))
        asked.update(_part(resources, "limits", name))
        for resource, quantity in asked.items():
            if not isinstance(resource, str):
                raise PlanInputError("pod %s: resource names must be strings, got %s" % (name, describe(resource)))
            if resource.startswith(_RESOURCE_PREFIX) or resource in _WHOLE_RESOURCES:
                if isinstance(quantity, str) and _DIGITS.match(quantity.strip()):
                    quantity = int(quantity.strip())
                if isinstance(quantity, bool) or not isinstance(quantity, int):
                    raise PlanInputError("pod %s asks for %s %s, which is not a whole number"
                                         % (name, resource, describe(quantity)))
                out[resource] = out.get(resource, 0) + quantity
    return out


def _part(obj, key, name, kind="pod "):
    """obj[key] as a mapping ({} when absent); PlanInputError naming the pod (or claim) when it is something else."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PlanInputError("%s%s: %s must be a mapping, got %s" % (kind, name, key, describe(value)))
    return value


def _pod_name(pod):
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        meta = {}
    return "%s/%s" % (_text(meta.get("namespace", "default")), _text(meta.get("name", "?")))


def _text(value):
    """A name from the input as it is when it is a short printable string, else escaped and cut."""
    if isinstance(value, str) and value.isprintable() and 0 < len(value) <= 80:
        return value
    return describe(value)


def _single_profile(pod, default, name):
    selector = _part(_part(pod, "spec", name), "nodeSelector", name)
    product = selector.get("nvidia.com/gpu.product", "")
    if isinstance(product, str) and "-MIG-" in product:
        return product.rsplit("-MIG-", 1)[1]
    return default


def demand_from_pods(pods, strategy="mixed", node_names=None, single_profile=None, fleet=None, replicas=None):
    """Pending MIG requests and devices in use, from pod manifests (kubernetes.core.k8s_info resources).

    Returns (demand items, in_use {inventory node: {device name: count}}, whole-GPU pods pending,
    unresolved [{request, count, reason, sources}]).

    mixed: nvidia.com/mig-<profile> is a MIG device ('.' in the resource stands for '+');
    nvidia.com/gpu is a whole GPU. single: nvidia.com/gpu is a MIG device of the node's one
    profile; for a pending pod the profile comes from its nodeSelector
    nvidia.com/gpu.product (<model>-MIG-<profile>), else ``single_profile``, else it is unresolved.
    ``node_names`` maps Kubernetes node names to inventory names (default: the same).

    ``replicas`` {profile: replicas per device} names the time-sliced profiles (the device plugin's
    sharing): a request for one of them, or for its '.shared' resource, asks for replicas, not devices.
    Pending replicas need ceil(replicas / per device) free devices; running pods' replicas hold as many
    devices as there are replicas, at most the node's devices of the profile (the plugin's default
    allocation policy, distributed, spreads replicas over devices). A '.shared' request for a profile
    without replicas is unresolved.
    """
    replicas = _replicas_per_device(replicas)
    if strategy not in ("mixed", "single"):
        raise PlanInputError("strategy must be mixed or single, got %s" % describe(strategy))
    node_names = node_names or {}
    if not isinstance(node_names, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in node_names.items()):
        raise PlanInputError("k8s_node_names must be a mapping of Kubernetes node name to inventory host, got %s"
                             % describe(node_names))
    if single_profile is not None and (not isinstance(single_profile, str) or not single_profile):
        raise PlanInputError("single_profile must be a MIG profile name such as 1g.10gb, got %s"
                             % describe(single_profile))
    if pods is not None and not isinstance(pods, list):
        raise PlanInputError("pods must be a list of pod manifests, got %s" % describe(pods))
    demand = {}
    sources = {}
    in_use = {}
    whole_pending = 0
    unresolved = []
    pending_replicas = {}
    held_replicas = {}
    for pod in pods or []:
        if not isinstance(pod, Mapping):
            raise PlanInputError("pods must be pod manifests (mappings), got %s" % describe(pod))
        name = _pod_name(pod)
        if _part(pod, "status", name).get("phase") in _FINISHED:
            continue
        asked = _pod_requests(pod, name)
        if not asked:
            continue
        node = _part(pod, "spec", name).get("nodeName")
        if node is not None and not isinstance(node, str):
            raise PlanInputError("pod %s: spec.nodeName must be a string, got %s" % (name, describe(node)))
        for resource, quantity in sorted(asked.items()):
            if quantity <= 0:
                continue
            shared = resource.endswith(_SHARED_SUFFIX)
            if resource == _WHOLE_RESOURCE + _SHARED_SUFFIX and strategy == "mixed":
                unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                   "reason": "time-sliced whole GPUs are not MIG devices; the planner does not "
                                             "plan them"})
                continue
            if resource == _WHOLE_RESOURCE and strategy == "mixed":
                if node:
                    host = node_names.get(node, node)
                    in_use.setdefault(host, {})[WHOLE] = in_use.get(host, {}).get(WHOLE, 0) + quantity
                else:
                    whole_pending += quantity
                continue
            if resource in _WHOLE_RESOURCES:
                profile = None
                if node:
                    profile = _node_single_profile(fleet, node_names.get(node, node))
                else:
                    profile = _single_profile(pod, single_profile, name)
                if profile is None:
                    unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                       "reason": "under the single strategy a pending pod's MIG profile comes from "
                                                 "its nodeSelector nvidia.com/gpu.product (<model>-MIG-<profile>) "
                                                 "or the single_profile option; neither is set"})
                    continue
            else:
                profile = profile_from_resource(resource)
            if shared and profile not in replicas:
                unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                   "reason": "a time-sliced resource, but how many replicas each %s device gives is "
                                             "not known (the sharing option)" % _text(profile)})
                continue
            # Time-sliced: the quantities are replicas; they become devices once all pods are counted.
            if node:
                host = node_names.get(node, node)
                target = held_replicas.setdefault(host, {}) if profile in replicas else in_use.setdefault(host, {})
                target[profile] = target.get(profile, 0) + quantity
            else:
                target = pending_replicas if profile in replicas else demand
                target[profile] = target.get(profile, 0) + quantity
                sources.setdefault(profile, []).append(name)
    for profile, count in pending_replicas.items():
        demand[profile] = demand.get(profile, 0) + -(-count // replicas[profile])
    for host, held in held_replicas.items():
        for profile, count in held.items():
            devices = _node_devices(fleet, host, profile)
            busy = min(count, devices) if devices else count
            in_use.setdefault(host, {})[profile] = in_use.get(host, {}).get(profile, 0) + busy
    items = [{"profile": p, "count": c, "strict": False, "source": ", ".join(sources[p])}
             for p, c in sorted(demand.items())]
    return items, in_use, whole_pending, unresolved


# NVIDIA's DRA driver: the DeviceClass of MIG devices, and a CEL selector naming the profile
# (device.attributes['gpu.nvidia.com'].profile == '1g.10gb', the attribute its ResourceSlices publish).
MIG_DEVICE_CLASS = "mig.nvidia.com"
_CEL_PROFILE = re.compile(r"""\.profile\s*==\s*['"]([^'"]{1,40})['"]""")


def _claim_requests(claim, name):
    """(device class, CEL expressions, count) per request of a ResourceClaim: resource.k8s.io/v1 puts them under
    `exactly` (or takes the first of `firstAvailable`), v1beta1 on the request itself."""
    spec = _part(_part(claim, "spec", name, ""), "devices", name, "")
    requests = spec.get("requests") or []
    if not isinstance(requests, list):
        raise PlanInputError("claim %s: spec.devices.requests must be a list, got %s" % (name, describe(requests)))
    out = []
    for request in requests:
        if not isinstance(request, Mapping):
            raise PlanInputError("claim %s: a request must be a mapping, got %s" % (name, describe(request)))
        first = request.get("firstAvailable")
        body = request.get("exactly") or (first[0] if isinstance(first, list) and first else request)
        if not isinstance(body, Mapping):
            raise PlanInputError("claim %s: a request must be a mapping, got %s" % (name, describe(body)))
        count = body.get("count", 1) if body.get("allocationMode", "ExactCount") == "ExactCount" else None
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise PlanInputError("claim %s: count must be a whole number, got %s" % (name, describe(count)))
        selectors = body.get("selectors") or []
        expressions = [((sel.get("cel") or {}).get("expression") or "") for sel in selectors
                       if isinstance(sel, Mapping) and isinstance(sel.get("cel"), Mapping)]
        out.append((body.get("deviceClassName"), [e for e in expressions if isinstance(e, str)], count))
    return out


def demand_from_claims(claims):
    """Pending MIG requests of NVIDIA's DRA driver, from ResourceClaim manifests (kubernetes.core.k8s_info
    resources): a claim without status.allocation that asks the DeviceClass mig.nvidia.com adds its count of the
    profile its CEL selector names. Allocated claims hold devices that exist; they add nothing.

    Returns (demand items, unresolved [{request, count, reason, sources}])."""
    if claims is not None and not isinstance(claims, list):
        raise PlanInputError("claims must be a list of ResourceClaim manifests, got %s" % describe(claims))
    demand, sources, unresolved = {}, {}, []
    for claim in claims or []:
        if not isinstance(claim, Mapping):
            raise PlanInputError("claims must be ResourceClaim manifests (mappings), got %s" % describe(claim))
        name = "claim " + _pod_name(claim)
        if _part(claim, "status", name, "").get("allocation"):
            continue
        for device_class, expressions, count in _claim_requests(claim, name):
            if device_class != MIG_DEVICE_CLASS or count == 0:
                continue
            profiles = [m.group(1) for e in expressions for m in [_CEL_PROFILE.search(e)] if m]
            if count is None or len(set(profiles)) != 1:
                unresolved.append({"request": MIG_DEVICE_CLASS, "count": count or 1, "sources": [name],
                                   "reason": "a claim of %s counts toward the plan when it asks for an exact count "
                                             "and one profile through its CEL selector (device.attributes"
                                             "['gpu.nvidia.com'].profile == '<profile>')" % MIG_DEVICE_CLASS})
                continue
            demand[profiles[0]] = demand.get(profiles[0], 0) + count
            sources.setdefault(profiles[0], []).append(name)
    items = [{"profile": p, "count": c, "strict": False, "source": ", ".join(sources[p])}
             for p, c in sorted(demand.items())]
    return items, unresolved


def _replicas_per_device(replicas):
    """{profile: replicas per device} checked: names, and whole numbers of 1 or more."""
    if replicas is None:
        return {}
    if not isinstance(replicas, Mapping):
        raise PlanInputError("sharing must be a mapping of MIG profile to replicas per device, got %s"
                             % describe(replicas))
    for profile, count in replicas.items():
        if not isinstance(profile, str) or not profile:
            raise PlanInputError("sharing: keys must be MIG profile names, got %s" % describe(profile))
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PlanInputError("sharing %s: replicas must be a whole number of 1 or more, got %s"
                                 % (_text(profile), describe(count)))
    return dict(replicas)


def _node_mig_devices(fleet, host):
    """The node's MIG device counts per GPU ({name: count} mappings) from its facts; [] when unknown."""
    facts = (fleet or {}).get(host)
    if isinstance(facts, Mapping) and "gpuops_mig" in facts:
        facts = facts["gpuops_mig"]
    gpus = facts.get("gpus") if isinstance(facts, Mapping) else None
    found = []
    for gpu in gpus if isinstance(gpus, list) else []:
        devices = gpu.get("mig_devices") if isinstance(gpu, Mapping) else None
        if isinstance(devices, Mapping):
            found.append(devices)
    return found


def _node_devices(fleet, host, profile):
    return sum(d[profile] for d in _node_mig_devices(fleet, host) if _is_int(d.get(profile)))


def _node_single_profile(fleet, host):
    names = set()
    for devices in _node_mig_devices(fleet, host):
        names.update(n for n in devices if isinstance(n, str))
    return names.pop() if len(names) == 1 else None


# --------------------------------------------------------------------------
# Views
# --------------------------------------------------------------------------

def _counts_text(counts):
    return ", ".join("%s x%d" % item for item in counts.items()) or "-"


def plan_table(plan):
    """The plan as lines of text for a person: one line per GPU, then the demand and the totals."""
    rows = ["%-16s %-4s %-24s %-8s %-30s %-30s %s" % ("NODE", "GPU", "MODEL", "ACTION", "BEFORE", "AFTER",
                                                      "DESTROY/CREATE")]
    for node, data in sorted(plan["nodes"].items()):
        for i, gpu in enumerate(data["gpus"]):
            before = _counts_text(gpu["before"]) if gpu["mig_enabled_before"] else "MIG off"
            after = _counts_text(gpu["after"]) if gpu["mig_enabled"] else "MIG off"
            action = "change" if gpu["changed"] else ("keep" if data["touchable"] else "frozen")
            rows.append("%-16s %-4s %-24s %-8s %-30s %-30s %s" % (
                node if i == 0 else "", gpu["index"], gpu["name"][:24], action, before, after,
                "%d/%d" % (gpu["destroyed"], gpu["created"]) if gpu["changed"] else "-"))
        if not data["gpus"]:
            rows.append("%-16s %s" % (node, "no MIG-capable GPU"))
    report = plan["report"]
    rows.append("")
    rows.append("%-36s %9s %5s %5s" % ("DEMAND", "REQUESTED", "MET", "UNMET"))
    for row in report["demand"]:
        rows.append("%-36s %9d %5d %5d" % (row["request"][:36], row["requested"], row["met"], row["unmet"]))
    for item in report["unresolved"]:
        rows.append("%-36s %9d %5d %5d  %s" % (item["request"][:36], item["count"], 0, item["count"], item["reason"]))
    rows.append("")
    rows.append("demand met: %s; nodes touched: %d (%s); devices destroyed: %d, created: %d; busy devices kept: %d; "
                "GPUs left whole: %d; search: %s" % (
                    "yes" if report["demand_met"] else "no (%d devices short)" % report["unmet_devices"],
                    report["nodes_touched_count"], ", ".join(report["nodes_touched"]) or "none",
                    report["devices_destroyed"], report["devices_created"], len(report["busy_devices_kept"]),
                    len(report["gpus_left_whole"]), report["method"]))
    for skipped in report["skipped_nodes"]:
        rows.append("skipped %s: %s" % (skipped["node"], skipped["reason"]))
    for note in report["notes"]:
        rows.append("note: %s" % note)
    return rows


def vars_file_data(plan):
    """What site.yml -e @file reads: gpuops_mig_plan with version, nodes (layouts, config_label, touched), report."""
    return {"gpuops_mig_plan": {
        "version": 1,
        "nodes": dict((node, {"layouts": data["layouts"], "config_label": data["config_label"],
                              "touched": data["touched"]})
                      for node, data in sorted(plan["nodes"].items())),
        "report": plan["report"],
    }}
