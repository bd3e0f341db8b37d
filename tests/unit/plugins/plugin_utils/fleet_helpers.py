# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Shared helpers for the fleet planner tests and bench/bench_fleet_plan.py.

* facts(): a GPU's mig_facts entry from a geometry of layout_helpers (mig-facts.md section 1).
* random_fleet(): seeded random fleets (models, current layouts, busy devices) and demand.
* oracle(): an independent search for the least disruption: per GPU every target
  count vector that plan_gpu (mig_config's own planner) can reach, then every
  subset of nodes to touch. It shares no code with _fleet_plan.
* nos_greedy(): a first-fit partitioner in the manner of nos (mig-facts.md section 5).
"""

from __future__ import annotations

import itertools
import random

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
    ComputeInstance,
    GpuInstance,
    LayoutError,
    plan_gpu,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (
    A30,
    A100_40GB,
    H100_80GB,
    PCI_IDS,
    full_ci,
)

FLEET_MODELS = {"A100-40GB": A100_40GB, "H100-80GB": H100_80GB, "A30": A30}
NAMES = {"A100-40GB": "NVIDIA A100-SXM4-40GB", "H100-80GB": "NVIDIA H100 80GB HBM3", "A30": "NVIDIA A30"}


def supported_profiles(geometry):
    return [{"name": p.name, "nvml_name": p.name, "id": p.id, "sm_slices": p.sm_slices,
             "memory_slices": p.memory_slices, "max_count": p.max_count, "memory_mib": 0,
             "placements": list(p.placements)} for p in geometry.profiles]


def facts(index, model, gis=None, mig_enabled=True, processes=None):
    """One GPU as mig_facts reports it. gis: [(gi_id, profile name, start, busy pids or ())]."""
    geometry = FLEET_MODELS[model]
    by_name = dict((p.name, p) for p in geometry.profiles)
    instances = []
    counts = {}
    for gi_id, name, start, pids in gis or []:
        profile = by_name[name]
        ci = full_ci(profile)
        instances.append({
            "id": gi_id, "profile": name, "profile_id": profile.id,
            "placement": {"start": start, "size": profile.memory_slices},
            "compute_instances": [{"id": 0, "profile": name, "profile_id": ci.id, "sm_slices": ci.sm_slices,
                                   "placement": {"start": 0, "size": ci.sm_slices},
                                   "mig_device_uuid": "MIG-%s-%d-%d" % (model, index, gi_id),
                                   "processes": [{"pid": p, "used_memory_mib": 1} for p in pids]}],
        })
        counts[name] = counts.get(name, 0) + 1
    return {"index": index, "name": NAMES[model], "pci_device_id": PCI_IDS[model], "mig_capable": True,
            "mig_enabled": mig_enabled,
            "mig_mode": {"current": "enabled" if mig_enabled else "disabled",
                         "pending": "enabled" if mig_enabled else "disabled"},
            "gpu_instances": instances if mig_enabled else [], "mig_devices": counts,
            "processes": [{"pid": p, "used_memory_mib": 1} for p in (processes or [])],
            "supported_profiles": supported_profiles(geometry)}


def node_facts(gpus):
    return {"driver": {"present": True}, "gpus": gpus, "gpu_count": len(gpus)}


def random_layout(rng, geometry, busy_rate=0.25, fill=None):
    """[(gi_id, name, start, pids)] of full-CI GIs at random legal placements."""
    gis = []
    used = 0
    sm = 0
    per = {}
    wanted = rng.randint(0, geometry.memory_slices) if fill is None else fill
    for n in range(wanted):
        spots = [(p, s) for p in geometry.profiles if per.get(p.id, 0) < p.max_count
                 and sm + p.sm_slices <= geometry.sm_slices for s in p.placements
                 if not used & (((1 << p.memory_slices) - 1) << s)]
        if not spots:
            break
        p, s = rng.choice(spots)
        used |= ((1 << p.memory_slices) - 1) << s
        sm += p.sm_slices
        per[p.id] = per.get(p.id, 0) + 1
        pids = (1000 + n,) if rng.random() < busy_rate else ()
        gis.append((n + 1, p.name, s, pids))
    return gis


def random_fleet(rng, nodes=(1, 4), gpus=(1, 8), models=None, busy_rate=0.25, disabled_rate=0.15):
    models = models or sorted(FLEET_MODELS)
    fleet = {}
    for n in range(rng.randint(*nodes)):
        model = rng.choice(models)   # one model per node, as nodes usually are
        count = rng.randint(*gpus)
        gpu_list = []
        for i in range(count):
            if rng.random() < disabled_rate:
                gpu_list.append(facts(i, model, mig_enabled=False))
            else:
                gpu_list.append(facts(i, model, random_layout(rng, FLEET_MODELS[model], busy_rate)))
        fleet["node-%02d" % n] = node_facts(gpu_list)
    return fleet


def random_demand(rng, fleet, kinds=(1, 3), most=6):
    names = sorted({p["name"] for node in fleet.values() for g in node["gpus"] for p in g["supported_profiles"]
                    if "+" not in p["name"]})
    chosen = rng.sample(names, min(len(names), rng.randint(*kinds)))
    return dict((n, rng.randint(1, most)) for n in chosen)


# --------------------------------------------------------------------------
# Independent oracle
# --------------------------------------------------------------------------

def _existing(gpu, geometry):
    out = []
    for gi in gpu["gpu_instances"]:
        cis = tuple(ComputeInstance(ci["id"], ci["profile_id"], ci["placement"]["start"],
                                    tuple(p["pid"] for p in ci["processes"]), ci["mig_device_uuid"])
                    for ci in gi["compute_instances"])
        out.append(GpuInstance(gi["id"], gi["profile_id"], gi["placement"]["start"], cis))
    return out


def _model_of(gpu):
    for model, pci in PCI_IDS.items():
        if pci == gpu["pci_device_id"] and model in FLEET_MODELS:
            return model
    raise KeyError(gpu["pci_device_id"])


def gpu_targets(gpu, demand):
    """{supply vector over demand names: fewest destroyed} for one GPU, by plan_gpu over every target."""
    geometry = FLEET_MODELS[_model_of(gpu)]
    names = sorted(demand)
    existing = _existing(gpu, geometry) if gpu["mig_enabled"] else []
    current = dict(gpu["mig_devices"]) if gpu["mig_enabled"] else {}
    busy = {}
    for gi in gpu["gpu_instances"]:
        for ci in gi["compute_instances"]:
            if ci["processes"]:
                busy[ci["profile"]] = busy.get(ci["profile"], 0) + 1
    profiles = dict((p.name, p) for p in geometry.profiles)
    ranges = []
    keys = sorted(set(names) | set(current))
    for n in keys:
        if n in names and n in profiles:
            top = min(profiles[n].max_count, demand[n] + busy.get(n, 0))
            ranges.append(range(busy.get(n, 0), max(top, current.get(n, 0)) + 1))
        else:
            ranges.append(range(busy.get(n, 0), current.get(n, 0) + 1))
    best = {}
    free_now = tuple(current.get(n, 0) - busy.get(n, 0) for n in names)
    best[free_now] = (0, False)
    for combo in itertools.product(*ranges):
        target = dict((n, c) for n, c in zip(keys, combo) if c)
        if target == current and gpu["mig_enabled"]:
            continue
        try:
            plan = plan_gpu(geometry, existing, target)
        except LayoutError:
            continue
        vec = tuple(target.get(n, 0) - busy.get(n, 0) for n in names)
        cost = (plan.destroyed_devices, True)
        if vec not in best or cost < best[vec]:
            best[vec] = cost
    return best


def oracle(fleet, demand):
    """(unmet, nodes touched, devices destroyed) of the best plan: every subset of nodes, every GPU target."""
    names = sorted(demand)
    caps = tuple(demand[n] for n in names)
    node_list = sorted(fleet)
    tables = {}
    currents = {}
    for node in node_list:
        table = {tuple([0] * len(names)): 0}
        current = [0] * len(names)
        for gpu in fleet[node]["gpus"]:
            options = gpu_targets(gpu, demand)
            for vec, (destroyed, changed) in options.items():
                if not changed:
                    current = [min(c, a + b) for c, a, b in zip(caps, current, vec)]
            nxt = {}
            for state, cost in table.items():
                for vec, (destroyed, dummy) in options.items():
                    s = tuple(min(c, a + b) for c, a, b in zip(caps, state, vec))
                    if s not in nxt or cost + destroyed < nxt[s]:
                        nxt[s] = cost + destroyed
            table = nxt
        tables[node] = table
        currents[node] = tuple(current)
    best = None
    for size in range(len(node_list) + 1):
        for subset in itertools.combinations(node_list, size):
            states = {tuple([0] * len(names)): 0}
            for node in node_list:
                options = tables[node].items() if node in subset else [(currents[node], 0)]
                nxt = {}
                for state, cost in states.items():
                    for vec, destroyed in options:
                        s = tuple(min(c, a + b) for c, a, b in zip(caps, state, vec))
                        if s not in nxt or cost + destroyed < nxt[s]:
                            nxt[s] = cost + destroyed
                states = nxt
            for state, destroyed in states.items():
                unmet = sum(c - s for c, s in zip(caps, state))
                rank = (unmet, size, destroyed)
                if best is None or rank < best:
                    best = rank
    return best


# --------------------------------------------------------------------------
# nos-style greedy first fit (mig-facts.md section 5)
# --------------------------------------------------------------------------

def _geometries(geometry):
    """Every legal multiset of full GI profiles (nos keeps a hand-written table of these per model)."""
    out = []
    profiles = list(geometry.profiles)

    def fits(counts):
        need = [(p, c) for p, c in zip(profiles, counts) if c]
        if sum(p.sm_slices * c for p, c in need) > geometry.sm_slices:
            return False
        todo = sorted([p for p, c in need for dummy in range(c)], key=lambda p: -p.memory_slices)

        def place(i, mask):
            if i == len(todo):
                return True
            p = todo[i]
            for s in p.placements:
                span = ((1 << p.memory_slices) - 1) << s
                if not mask & span and place(i + 1, mask | span):
                    return True
            return False
        return place(0, 0)

    for counts in itertools.product(*[range(p.max_count + 1) for p in profiles]):
        if any(counts) and fits(counts):
            out.append(dict((p.name, c) for p, c in zip(profiles, counts) if c))
    return out


_GEOMETRY_TABLE = {}


def nos_greedy(fleet, demand):
    """(unmet, nodes touched, devices destroyed) of a nos-like partitioner.

    Pods (one device each) smallest profile first; nodes by name; on each GPU
    the allowed geometry with the highest score sum(min(count - used, lacking))
    that keeps every used (busy) device's profile count; a node is committed
    when the pass placed at least one pod. The node agent deletes the devices
    the new geometry drops and, as nos does, re-creates a GPU's free devices
    whenever it creates any on that GPU.
    """
    lacking = dict(demand)
    # Free devices already there serve pods first (the scheduler binds them).
    state = {}
    for node in sorted(fleet):
        for gpu in fleet[node]["gpus"]:
            counts = dict(gpu["mig_devices"]) if gpu["mig_enabled"] else {}
            used = {}
            for gi in gpu["gpu_instances"]:
                for ci in gi["compute_instances"]:
                    if ci["processes"]:
                        used[ci["profile"]] = used.get(ci["profile"], 0) + 1
            state[(node, gpu["index"])] = {"counts": counts, "used": used, "orig": dict(counts), "gpu": gpu}
            for name, c in counts.items():
                free = c - used.get(name, 0)
                take = min(free, lacking.get(name, 0))
                if take:
                    lacking[name] -= take
                    used[name] = used.get(name, 0) + take
    touched = set()
    destroyed = 0
    for node in sorted(fleet):
        if not any(lacking.values()):
            break
        placed = 0
        for gpu in fleet[node]["gpus"]:
            if not any(lacking.values()):
                break
            st = state[(node, gpu["index"])]
            model = _model_of(gpu)
            if model not in _GEOMETRY_TABLE:
                _GEOMETRY_TABLE[model] = _geometries(FLEET_MODELS[model])
            best, best_score = None, 0
            for geometry in _GEOMETRY_TABLE[model]:
                if any(geometry.get(n, 0) < c for n, c in st["used"].items()):
                    continue
                score = sum(min(geometry.get(n, 0) - st["used"].get(n, 0), need)
                            for n, need in lacking.items() if need > 0)
                if score > best_score:
                    best, best_score = geometry, score
            if best is None:
                continue
            for n, need in list(lacking.items()):
                take = max(0, min(best.get(n, 0) - st["used"].get(n, 0), need))
                if take:
                    lacking[n] -= take
                    st["used"][n] = st["used"].get(n, 0) + take
                    placed += take
            if best != st["counts"]:
                st["counts"] = dict(best)
                st["changed"] = True
        if placed:
            for gpu in fleet[node]["gpus"]:
                st = state[(node, gpu["index"])]
                if st.get("changed"):
                    touched.add(node)
                    orig, new = st["orig"], st["counts"]
                    creates = any(new.get(n, 0) > orig.get(n, 0) for n in new)
                    busy_orig = {}
                    for gi in gpu["gpu_instances"]:
                        for ci in gi["compute_instances"]:
                            if ci["processes"]:
                                busy_orig[ci["profile"]] = busy_orig.get(ci["profile"], 0) + 1
                    for n, c in orig.items():
                        if creates:
                            destroyed += c - busy_orig.get(n, 0)   # free devices re-created too
                        else:
                            destroyed += max(0, c - new.get(n, 0))
        else:
            for gpu in fleet[node]["gpus"]:
                st = state[(node, gpu["index"])]
                st["counts"] = dict(st["orig"])
                st.pop("changed", None)
    unmet = sum(max(0, c) for c in lacking.values())
    return unmet, len(touched), destroyed


def sample(seed, **kwargs):
    rng = random.Random(seed)
    fleet = random_fleet(rng, **kwargs)
    return fleet, random_demand(rng, fleet)
