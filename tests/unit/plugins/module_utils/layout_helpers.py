# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Shared helpers for the layout/planner tests and the planner benchmark.

* GPU model geometries built from /work/shared/reference/mig-facts.md section 1
  (profile IDs, memory slices, SM slices, max counts, placements).
* hypothesis strategies for random valid layouts and targets.
* apply_plan(): runs a plan step by step against a tiny independent model of
  the driver's rules, so a plan that would fail on a GPU fails the test.
* exhaustive_best(), exhaustive_best_evictions(): an independent brute-force
  search over every final layout, the oracle for the fewest pods evicted,
  minimal destruction and the free-range tie-break.

Nothing here imports the planner's private helpers.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._host_layout import derived_ci_profiles
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
    ComputeInstance,
    GiProfile,
    GpuGeometry,
    GpuInstance,
)

# --------------------------------------------------------------------------
# GPU models (mig-facts.md §1)
# --------------------------------------------------------------------------


def ci_profiles_for(gi_name, g):
    """CI profiles of a g-slice GI, by the rule the engine uses for GIs that do not exist yet."""
    return derived_ci_profiles(gi_name, g)


def gi(name, profile_id, memory_slices, sm_slices, max_count, placements, aliases=()):
    return GiProfile(id=profile_id, name=name, memory_slices=memory_slices, sm_slices=sm_slices,
                     max_count=max_count, placements=tuple(placements),
                     ci_profiles=ci_profiles_for(name, sm_slices), aliases=tuple(aliases))


def seven_slice_gpu(one, one_double, two, three, four, seven, aliases=None):
    """The 8-memory-slice / 7-SM-slice layout shared by A100, H100, H200, B200 (IDs 19/20/15/14/9/5/0)."""
    aliases = aliases or {}
    return GpuGeometry(memory_slices=8, sm_slices=7, profiles=(
        gi(one, 19, 1, 1, 7, range(7), aliases.get(one, ())),
        gi(one + "+me", 20, 1, 1, 1, range(7), tuple(a + "+me" for a in aliases.get(one, ()))),
        gi(one_double, 15, 2, 1, 4, (0, 2, 4, 6), aliases.get(one_double, ())),
        gi(two, 14, 2, 2, 3, (0, 2, 4), aliases.get(two, ())),
        gi(three, 9, 4, 3, 2, (0, 4), aliases.get(three, ())),
        gi(four, 5, 4, 4, 1, (0,), aliases.get(four, ())),
        gi(seven, 0, 8, 7, 1, (0,), aliases.get(seven, ())),
    ))


A100_40GB = seven_slice_gpu("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
A100_80GB = seven_slice_gpu("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
H100_80GB = seven_slice_gpu("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
H100_NVL = seven_slice_gpu("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
H200 = seven_slice_gpu("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
B200 = seven_slice_gpu("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")
# GB200 names drift between drivers (mig-facts §1.9); the second spelling is an alias.
GB200 = seven_slice_gpu("1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb",
                        aliases={"1g.23gb": ("1g.24gb",), "3g.93gb": ("3g.95gb",),
                                 "4g.93gb": ("4g.95gb",), "7g.186gb": ("7g.189gb",)})
# A30: 4 memory slices, 4 SM slices. 2g.12gb+me's ID was not captured; 6 is the expected value.
A30 = GpuGeometry(memory_slices=4, sm_slices=4, profiles=(
    gi("1g.6gb", 14, 1, 1, 4, (0, 1, 2, 3)),
    gi("1g.6gb+me", 21, 1, 1, 1, (0, 1, 2, 3)),
    gi("2g.12gb", 5, 2, 2, 2, (0, 2)),
    gi("2g.12gb+me", 6, 2, 2, 1, (0, 2)),
    gi("4g.24gb", 0, 4, 4, 1, (0,)),
))

MODELS = {
    "A100-40GB": A100_40GB,
    "A100-80GB": A100_80GB,
    "A30": A30,
    "H100-80GB": H100_80GB,
    "H100-NVL": H100_NVL,
    "H200": H200,
    "B200": B200,
}

# PCI device IDs (0xDDDDVVVV) per model, for config resolution tests.
PCI_IDS = {
    "A100-40GB": "0x20B010DE",
    "A100-80GB": "0x20B210DE",
    "A30": "0x20B710DE",
    "H100-80GB": "0x233010DE",
    "H100-NVL": "0x232110DE",
    "H200": "0x233510DE",
    "B200": "0x290110DE",
}


def profile_by_name(geometry, name):
    for p in geometry.profiles:
        if p.name == name:
            return p
    raise KeyError(name)


def full_ci(profile):
    return [c for c in profile.ci_profiles if c.sm_slices == profile.sm_slices][0]


def make_gi(geometry, gi_id, name, start, cis=None, first_ci_id=0):
    """Existing GI helper. cis: None for one full CI, else [(ci_name, start, pids), ...]."""
    profile = profile_by_name(geometry, name)
    if cis is None:
        cis = [(profile.name, 0, ())]
    built = []
    for n, (ci_name, ci_start, pids) in enumerate(cis):
        ci_profile = [c for c in profile.ci_profiles if c.name == ci_name][0]
        built.append(ComputeInstance(first_ci_id + n, ci_profile.id, ci_start, tuple(pids),
                                     "MIG-%d-%d" % (gi_id, first_ci_id + n)))
    return GpuInstance(gi_id, profile.id, start, tuple(built))


# --------------------------------------------------------------------------
# Independent checks
# --------------------------------------------------------------------------

def _interval(start, size):
    return set(range(start, start + size))


def assert_legal_layout(geometry, gpu_instances, allow_empty=False):
    """Independent legality check (sets of slices, not the planner's bit masks)."""
    used = set()
    sm = 0
    per_profile = {}
    for g in gpu_instances:
        profile = geometry.gi_profile(g.profile_id)
        assert profile is not None, g
        assert g.start in profile.placements, g
        slices = _interval(g.start, profile.memory_slices)
        assert not used & slices, ("overlap", g)
        used |= slices
        sm += profile.sm_slices
        per_profile[profile.id] = per_profile.get(profile.id, 0) + 1
        assert per_profile[profile.id] <= profile.max_count, g
        assert allow_empty or g.compute_instances, ("empty GI", g)
        ci_used = set()
        per_ci = {}
        for ci in g.compute_instances:
            ci_profile = profile.ci_profile(ci.profile_id)
            assert ci_profile is not None, ci
            assert ci.start in ci_profile.placements, ci
            ci_slices = _interval(ci.start, ci_profile.sm_slices)
            assert not ci_used & ci_slices, ("CI overlap", g)
            ci_used |= ci_slices
            per_ci[ci.profile_id] = per_ci.get(ci.profile_id, 0) + 1
            assert per_ci[ci.profile_id] <= ci_profile.max_count, g
    assert sm <= geometry.sm_slices


def counts_of(geometry, gpu_instances):
    counts = {}
    for g in gpu_instances:
        profile = geometry.gi_profile(g.profile_id)
        for ci in g.compute_instances:
            ci_profile = profile.ci_profile(ci.profile_id)
            name = profile.name if ci_profile.sm_slices == profile.sm_slices else ci_profile.name
            counts[name] = counts.get(name, 0) + 1
    return counts


def free_run(geometry, gpu_instances):
    used = [False] * geometry.memory_slices
    for g in gpu_instances:
        profile = geometry.gi_profile(g.profile_id)
        for s in range(g.start, g.start + profile.memory_slices):
            used[s] = True
    best = run = 0
    for u in used:
        run = 0 if u else run + 1
        best = max(best, run)
    return best


def pod_of(holder):
    """"ns/pod" of a "ns/pod/container" holder."""
    namespace, pod = holder.split("/")[:2]
    return namespace + "/" + pod


def may_destroy(ci, force=False, evict_pods=False):
    """The rule plans follow: a device allocated to pods goes only when they may be evicted (their processes
    go with them), a device with processes of no pod only with force."""
    if ci.pods:
        return evict_pods
    return force or not ci.pids


class FakeGpu:
    """The driver's rules, kept minimal: refuses overlapping or illegal creates,
    destroying a GI that still has CIs, and destroying a busy or allocated CI without leave."""

    def __init__(self, geometry, gpu_instances):
        self.geometry = geometry
        self.gis = {g.gi_id: (g.profile_id, g.start) for g in gpu_instances}
        self.cis = {g.gi_id: {ci.ci_id: ci for ci in g.compute_instances} for g in gpu_instances}
        self.next_gi = max(list(self.gis) + [0]) + 100
        self.next_ci = 1000

    def destroy_ci(self, gi_id, ci_id, force=False, evict_pods=False):
        ci = self.cis[gi_id].pop(ci_id)
        assert may_destroy(ci, force, evict_pods), "destroyed a busy or allocated CI"

    def destroy_gi(self, gi_id):
        assert not self.cis[gi_id], "GI destroyed while it still has CIs"
        del self.gis[gi_id]
        del self.cis[gi_id]

    def create_gi(self, profile_id, start):
        profile = self.geometry.gi_profile(profile_id)
        assert start in profile.placements
        new = _interval(start, profile.memory_slices)
        sm = profile.sm_slices
        same = 1
        for pid, s in self.gis.values():
            p = self.geometry.gi_profile(pid)
            assert not new & _interval(s, p.memory_slices), "GI placement overlaps"
            sm += p.sm_slices
            same += pid == profile_id
        assert sm <= self.geometry.sm_slices, "SM slices exhausted"
        assert same <= profile.max_count, "profile max count exceeded"
        self.next_gi += 1
        self.gis[self.next_gi] = (profile_id, start)
        self.cis[self.next_gi] = {}
        return self.next_gi

    def create_ci(self, gi_id, ci_profile_id, start):
        profile = self.geometry.gi_profile(self.gis[gi_id][0])
        ci_profile = profile.ci_profile(ci_profile_id)
        assert start in ci_profile.placements
        new = _interval(start, ci_profile.sm_slices)
        same = 1
        for ci in self.cis[gi_id].values():
            other = profile.ci_profile(ci.profile_id)
            assert not new & _interval(ci.start, other.sm_slices), "CI placement overlaps"
            same += ci.profile_id == ci_profile_id
        assert same <= ci_profile.max_count
        self.next_ci += 1
        self.cis[gi_id][self.next_ci] = ComputeInstance(self.next_ci, ci_profile_id, start)

    def layout(self):
        return [GpuInstance(gi_id, pid, start, tuple(self.cis[gi_id].values()))
                for gi_id, (pid, start) in self.gis.items()]


def apply_plan(geometry, existing, plan, force=False, evict_pods=False):
    """Execute the plan (all destroys, then all creates) on a FakeGpu; return its layout."""
    gpu = FakeGpu(geometry, existing)
    for change in plan.change:
        for ci in change.destroy:
            gpu.destroy_ci(change.gi.gi_id, ci.ci_id, force, evict_pods)
    for g in plan.destroy:
        for ci in g.compute_instances:
            gpu.destroy_ci(g.gi_id, ci.ci_id, force, evict_pods)
        gpu.destroy_gi(g.gi_id)
    for change in plan.change:
        for ci in change.create:
            gpu.create_ci(change.gi.gi_id, ci.profile_id, ci.start)
    for g in plan.create:
        new_id = gpu.create_gi(g.profile_id, g.start)
        for ci in g.compute_instances:
            gpu.create_ci(new_id, ci.profile_id, ci.start)
    return gpu.layout()


def assert_plan_valid(geometry, existing, target, plan, force=False, evict_pods=False):
    """Everything a plan must satisfy, checked without the planner's own code."""
    by_id = {g.gi_id: g for g in existing}
    # Every existing GI is accounted for exactly once; kept ones are untouched.
    ids = [g.gi_id for g in plan.keep] + [c.gi.gi_id for c in plan.change] + [g.gi_id for g in plan.destroy]
    assert sorted(ids) == sorted(by_id)
    for g in plan.keep:
        assert by_id[g.gi_id] == g
        assert g in plan.result
    for c in plan.change:
        assert by_id[c.gi.gi_id] == c.gi
        assert set(c.destroy) <= set(c.gi.compute_instances)
        survivors = [ci for ci in c.gi.compute_instances if ci not in c.destroy]
        final = [g for g in plan.result if g.gi_id == c.gi.gi_id]
        assert len(final) == 1 and (final[0].profile_id, final[0].start) == (c.gi.profile_id, c.gi.start)
        assert set(survivors) <= set(final[0].compute_instances)
    for g in plan.create:
        assert g.gi_id is None and all(ci.ci_id is None for ci in g.compute_instances)
        # One compute profile per new GI (the documented packing rule).
        assert len({ci.profile_id for ci in g.compute_instances}) == 1
    assert_legal_layout(geometry, plan.result)
    assert counts_of(geometry, plan.result) == {k: v for k, v in target.items() if v}
    destroyed_cis = [ci for g in plan.destroy for ci in g.compute_instances]
    destroyed_cis += [ci for c in plan.change for ci in c.destroy]
    assert all(may_destroy(ci, force, evict_pods) for ci in destroyed_cis)
    # The pods to evict are exactly those holding a destroyed device.
    assert [pod for pod, dummy in plan.evicted_pods] == sorted({pod_of(h) for ci in destroyed_cis for h in ci.pods})
    # Executing the steps in order on a fake GPU works and gives the result.
    after = apply_plan(geometry, existing, plan, force, evict_pods)
    assert_legal_layout(geometry, after)
    shape = sorted((g.profile_id, g.start, tuple(sorted((ci.profile_id, ci.start) for ci in g.compute_instances)))
                   for g in after)
    expected = sorted((g.profile_id, g.start, tuple(sorted((ci.profile_id, ci.start) for ci in g.compute_instances)))
                      for g in plan.result)
    assert shape == expected
    destroyed = sum(len(g.compute_instances) for g in plan.destroy) + sum(len(c.destroy) for c in plan.change)
    assert plan.destroyed_devices == destroyed


# --------------------------------------------------------------------------
# Exhaustive oracle
# --------------------------------------------------------------------------

def _device_name(profile, ci_profile):
    return profile.name if ci_profile.sm_slices == profile.sm_slices else ci_profile.name


def _ci_starts_exist(ci_profile, blocked, count):
    """Can `count` CIs of this profile be placed without touching `blocked` SM slices?"""
    free = [s for s in ci_profile.placements if not _interval(s, ci_profile.sm_slices) & blocked]
    for combo in itertools.combinations(free, count):
        spans = [_interval(s, ci_profile.sm_slices) for s in combo]
        if all(not (a & b) for a, b in itertools.combinations(spans, 2)):
            return True
    return False


def _contents(geometry, profile, start, existing_here, demand):
    """Every final CI content of a GI at (profile, start): (counts tuple, destroyed CIs).

    New GI: one compute profile, 1..max. GI that also exists now: any subset of
    its CIs survives, plus CIs of one compute profile added around them.
    """
    names = sorted(demand)
    result = []
    typed = [(c, _device_name(profile, c)) for c in profile.ci_profiles]
    typed = [(c, n) for c, n in typed if n in demand]
    if existing_here is None:
        for ci_profile, name in typed:
            for k in range(1, ci_profile.max_count + 1):
                if _ci_starts_exist(ci_profile, set(), k):
                    vec = tuple(k if n == name else 0 for n in names)
                    result.append((vec, ()))
        return result
    cis = existing_here.compute_instances
    for r in range(len(cis) + 1):
        for kept in itertools.combinations(cis, r):
            kept_names = [_device_name(profile, profile.ci_profile(ci.profile_id)) for ci in kept]
            if any(n not in demand for n in kept_names):
                continue
            blocked = set()
            for ci in kept:
                blocked |= _interval(ci.start, profile.ci_profile(ci.profile_id).sm_slices)
            destroyed = tuple(ci for ci in cis if ci not in kept)
            base = tuple(kept_names.count(n) for n in names)
            if kept:
                result.append((base, destroyed))
            for ci_profile, name in typed:
                same = sum(1 for ci in kept if ci.profile_id == ci_profile.id)
                for k in range(1, ci_profile.max_count - same + 1):
                    if _ci_starts_exist(ci_profile, blocked, k):
                        vec = tuple(b + (k if n == name else 0) for b, n in zip(base, names))
                        result.append((vec, destroyed))
    return result


def _gi_sets(geometry, limits):
    """All legal sets of (profile, start); limits: {profile id: most GIs of it worth having}."""
    spots = sorted((pid, s) for pid in limits for s in geometry.gi_profile(pid).placements)
    found = []

    def walk(i, chosen, used, sm):
        if i == len(spots):
            found.append(tuple(chosen))
            return
        walk(i + 1, chosen, used, sm)
        pid, start = spots[i]
        p = geometry.gi_profile(pid)
        slices = _interval(start, p.memory_slices)
        if used & slices or sm + p.sm_slices > geometry.sm_slices:
            return
        if sum(1 for q, dummy in chosen if q == pid) >= min(p.max_count, limits[pid]):
            return
        walk(i + 1, chosen + [(pid, start)], used | slices, sm + p.sm_slices)

    walk(0, [], set(), 0)
    return found


def exhaustive_best(geometry, existing, target, force=False):
    """Brute force over every final layout that meets the target, for layouts without pods.

    Returns (busy destroyed, destroyed devices, largest free range) of the best
    plan in the planner's order (busy destroyed, destroyed, then largest free
    range), or None when no final layout exists. Without force, plans that
    destroy busy devices are not allowed.
    """
    best = exhaustive_best_evictions(geometry, existing, target, force=force)
    return None if best is None else best[1:]


def exhaustive_best_evictions(geometry, existing, target, force=False, evict_pods=False,
                              evicted_sets=None):
    """Brute force over every final layout that meets the target.

    Returns (pods evicted, busy destroyed, destroyed devices, largest free range)
    of the best plan in the planner's order, or None when no final layout exists.
    A pod counts once however many of its devices go. Plans that destroy a device
    the rule (may_destroy) keeps are not allowed. evicted_sets: a set that receives
    the pods (a frozenset) every allowed plan evicts, for a minimum over several GPUs.
    """
    demand = {k: v for k, v in target.items() if v}
    names = sorted(demand)
    want = tuple(demand[n] for n in names)
    name_profiles = {}
    for p in geometry.profiles:
        for c in p.ci_profiles:
            name_profiles[_device_name(p, c)] = p
    # Every GI holds at least one device, so a profile never needs more GIs than its devices.
    limits = {}
    for n in names:
        pid = name_profiles[n].id
        limits[pid] = limits.get(pid, 0) + demand[n]
    existing_at = {(g.profile_id, g.start): g for g in existing}
    contents = {}
    best = None
    for gi_set in _gi_sets(geometry, limits):
        if {pid for pid, dummy in gi_set} != set(limits):
            continue   # a demanded profile has no GI here
        options = []
        for spot in gi_set:
            if spot not in contents:
                contents[spot] = _contents(geometry, geometry.gi_profile(spot[0]), spot[1],
                                           existing_at.get(spot), demand)
            options.append(contents[spot])
        kept_keys = set(gi_set)
        lost = tuple(ci for g in existing if (g.profile_id, g.start) not in kept_keys for ci in g.compute_instances)
        free = free_run(geometry, [GpuInstance(None, pid, start) for pid, start in gi_set])

        def walk(i, vec, destroyed):
            nonlocal best
            if any(v > w for v, w in zip(vec, want)):
                return
            if i == len(options):
                if vec != want or not all(may_destroy(ci, force, evict_pods) for ci in destroyed):
                    return
                pods = {pod_of(h) for ci in destroyed for h in ci.pods}
                if evicted_sets is not None:
                    evicted_sets.add(frozenset(pods))
                score = (len(pods), sum(1 for ci in destroyed if ci.pids), len(destroyed), -free)
                if best is None or score < best:
                    best = score
                return
            for content, gone in options[i]:
                walk(i + 1, tuple(v + c for v, c in zip(vec, content)), destroyed + gone)

        walk(0, tuple(0 for dummy in names), lost)
    if best is None:
        return None
    return best[:3] + (-best[3],)


def exhaustive_node_evictions(geometry, existing, targets):
    """The fewest pods a node's change evicts, over every combination of allowed per-GPU plans
    (a pod holding devices on several GPUs counts once).
    existing, targets: {GPU index: layout}, {GPU index: target}."""
    best = {frozenset()}
    for gpu in sorted(existing):
        sets = set()
        exhaustive_best_evictions(geometry, existing[gpu], targets[gpu], evict_pods=True,
                                  evicted_sets=sets)
        # Keep only the unions no other union is inside: a superset never gives a smaller minimum.
        unions = {a | b for a in best for b in sets}
        best = {u for u in unions if not any(o < u for o in unions)}
    return min(len(u) for u in best)


# --------------------------------------------------------------------------
# hypothesis strategies
# --------------------------------------------------------------------------

# Pod holders ("ns/pod/container"): few pods, so one pod often holds several devices (in one GI or
# several), and a device several pods (time-slicing replicas).
POD_HOLDERS = ("default/a/main", "default/a/side", "default/b/main", "ml/c/main", "ml/d/main", "ml/e/main")


@st.composite
def layouts(draw, geometry, mixed=True, busy=True, empty_gis=True, first_gi_id=1, pods=False):
    """A random legal layout. mixed: GIs may hold several compute profiles.
    busy: CIs may have pids. empty_gis: a GI may have no CI (a half-made one).
    pods: CIs may be allocated to pods (POD_HOLDERS)."""
    gis = []
    used = set()
    sm = 0
    per_profile = {}
    for number in range(draw(st.integers(0, geometry.memory_slices))):
        spots = []
        for p in geometry.profiles:
            if per_profile.get(p.id, 0) >= p.max_count or sm + p.sm_slices > geometry.sm_slices:
                continue
            for s in p.placements:
                if not used & _interval(s, p.memory_slices):
                    spots.append((p.id, s))
        if not spots:
            break
        pid, start = draw(st.sampled_from(spots))
        profile = geometry.gi_profile(pid)
        used |= _interval(start, profile.memory_slices)
        sm += profile.sm_slices
        per_profile[pid] = per_profile.get(pid, 0) + 1
        kind = draw(st.sampled_from(["full", "full", "one-kind", "mixed" if mixed else "one-kind",
                                     "empty" if empty_gis else "full"]))
        cis = []
        if kind == "full":
            cis = [(full_ci(profile), 0)]
        elif kind == "one-kind":
            ci_profile = draw(st.sampled_from(profile.ci_profiles))
            count = draw(st.integers(1, ci_profile.max_count))
            cis = [(ci_profile, s) for s in ci_profile.placements[:count]]
        elif kind == "mixed":
            taken = set()
            for dummy in range(draw(st.integers(1, profile.sm_slices))):
                choices = [(c, s) for c in profile.ci_profiles for s in c.placements
                           if not taken & _interval(s, c.sm_slices)
                           and sum(1 for x, dummy in cis if x is c) < c.max_count]
                if not choices:
                    break
                c, s = draw(st.sampled_from(choices))
                taken |= _interval(s, c.sm_slices)
                cis.append((c, s))
        built = []
        for k, (c, s) in enumerate(cis):
            pids = ()
            if busy and draw(st.integers(0, 3)) == 0:
                pids = tuple(draw(st.lists(st.integers(100, 999), min_size=1, max_size=2)))
            holders = ()
            if pods and draw(st.booleans()):
                holders = tuple(draw(st.lists(st.sampled_from(POD_HOLDERS), min_size=1, max_size=2, unique=True)))
            built.append(ComputeInstance(k, c.id, s, pids, "MIG-%d-%d" % (first_gi_id + number, k), holders))
        gis.append(GpuInstance(first_gi_id + number, pid, start, tuple(built)))
    return gis


@st.composite
def targets(draw, geometry, near=None):
    """Mostly reachable targets (the devices of another random layout, one compute
    profile per GI), sometimes arbitrary counts that may not fit, and, given
    near (a layout), often that layout's devices with a few counts nudged."""
    if near is not None and draw(st.booleans()):
        counts = counts_of(geometry, near)
        names = sorted({_device_name(p, c) for p in geometry.profiles for c in p.ci_profiles})
        # Nudge names already present more often: that is where partial keeps happen.
        present = sorted(counts) or names
        for name in draw(st.lists(st.one_of(st.sampled_from(present), st.sampled_from(names)), max_size=3)):
            counts[name] = max(0, counts.get(name, 0) + draw(st.sampled_from([-1, 1, 2])))
        return counts
    if draw(st.integers(0, 4)) == 0:
        names = sorted({_device_name(p, c) for p in geometry.profiles for c in p.ci_profiles})
        chosen = draw(st.lists(st.sampled_from(names), max_size=4, unique=True))
        return {n: draw(st.integers(0, 4)) for n in chosen}
    return counts_of(geometry, draw(layouts(geometry, mixed=False, busy=False, empty_gis=False)))
