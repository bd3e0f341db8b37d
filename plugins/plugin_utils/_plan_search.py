# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The fleet planner's search: which final layout each GPU gets.

The fleet's facts become _Gpu values; every GPU's reachable layouts are enumerated exactly (keep any set of
existing GPU instances that includes the busy ones, add demanded profiles at legal placements). Nodes combine
their GPUs, and the fleet its nodes, by dynamic programming over demand vectors (capped at the demand): exact.
When that state space is too big (``exact_limit``), a lazy greedy set multicover over nodes is used instead,
with a lower bound on the nodes any plan must touch. Part of the planner of _fleet_plan.py; controller-only.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping
from typing import Any, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import check_pci_id, check_profiles, describe
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_demand import WHOLE, PlanInputError, _flag, _is_int

__all__ = [
    "EXACT_LIMIT",
    "geometry_from_profiles",
]

# Relaxations the exact search may do before it gives way to the heuristic.
EXACT_LIMIT = 400000


class _TooBig(Exception):
    """The exact search would exceed its bound; the heuristic takes over."""


# --------------------------------------------------------------------------
# Fleet facts -> planner values
# --------------------------------------------------------------------------

_GEOMETRY_CACHE = {}


def geometry_from_profiles(profiles: Sequence[Mapping[str, Any]]) -> layout.GpuGeometry:
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
        _check_unique_indexes(node, raw[node])
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


def _check_unique_indexes(node, gpus):
    """A GPU index given twice in a node's facts would be planned into two entries for one GPU,
    which mig_config refuses; the facts are refused instead (they are not what mig_facts
    returns)."""
    seen = set()
    for position, gpu in enumerate(gpus):
        if gpu["index"] in seen:
            raise PlanInputError("%s gpus[%d]: GPU index %d is listed twice in the node's facts "
                                 "(mig_facts lists each GPU once); run gpuops.mig.mig_facts there "
                                 "again" % (node, position, gpu["index"]))
        seen.add(gpu["index"])


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


def _current_cover(models, dims):
    remaining = [d.total for d in dims]

    def order(d):
        return (len(dims[d].nodes) if dims[d].nodes is not None else 1 << 30, d)
    return sum(sum(_allocate(n, n.free_of(n.current_totals()), remaining, order).values()) for n in models)
