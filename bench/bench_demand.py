# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Demand-loop benchmark: one seeded trace of pods, replayed against a simulated fleet under several policies.

The fleet starts as the GPU Operator's `all-balanced` (per H100: 2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb). Pods
ask for one MIG device each, arrive over the simulated period and run for a set time; a scheduler binds a
pending pod to a free device of its profile on a node that is not being changed (first node by name). Time
advances in steps of --step seconds. Policies, side by side on the same trace:

- fixed: the layout never changes (`all-balanced`).
- nos-greedy: a reference in the manner of nos's partitioner (bench only): the oldest pod that cannot be
  bound makes one node change at a time, the first node (by name) with a GPU whose allowed geometry (every
  legal set of full GPU-instance profiles) keeps the GPU's used devices and adds the pod's profile, the best
  geometry for what is pending; the change takes --nos-seconds (the node takes no pod meanwhile). It keeps
  every free device the geometry can keep (nos re-creates them; that would count more destroyed).
- loop, no pod map: this collection's demand loop where no node's kubelet pod map can be read: the
  source's settle window and fingerprints (_demand.Debouncer), then rounds of the fleet planner
  (plugin_utils/_fleet_plan.plan_fleet, pods' devices as in-use floors, busy devices never destroyed) and the round's
  selection (_rounds.select: nodes that evict nothing, all together; --max-nodes, --cooldown and
  --round-serial bound approved changes only, which this model has none of), --round-seconds to plan,
  --loop-node-seconds per batch of site.yml. Without a pod map a change drains the node's GPU pods, so
  a node running any is held for a person (who never comes here).
- loop: the same with every node's pod map (mig_node_info's allocations: which pod holds which device), as
  the mig_plan action reads it (_demand_allocations: devices pods hold are busy, each planned node says
  whom its change evicts), so a node whose held devices all stay is applied (mig_node_drain none).

Reported: pods served (bound before the end), Pending-to-Running p50/p95 of the served pods, pods never
served, MIG devices destroyed, running pods evicted, and compute slices allocated to pods over time.

Usage (from the repository root):
    .venv/bin/python bench/bench_demand.py [--seed 20261125] [--nodes 16] [--gpus 2] [--hours 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout  # noqa: E402
from ansible_collections.gpuops.mig.plugins.plugin_utils._fleet_plan import plan_fleet  # noqa: E402
from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand, _demand_allocations, _rounds  # noqa: E402
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import (  # noqa: E402
    _geometries,
    facts,
    node_facts,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (  # noqa: E402
    H100_80GB,
    full_ci,
    profile_by_name,
)

MODEL = "H100-80GB"
GEOMETRY = H100_80GB
ALL_BALANCED = (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4))
# The trace's profile mix per hour: small devices first, then large ones, then a mix.
MIXES = (
    {"1g.10gb": 5, "2g.20gb": 3, "3g.40gb": 2},
    {"3g.40gb": 3, "4g.40gb": 3, "7g.80gb": 2, "1g.20gb": 2},
    {"1g.10gb": 2, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
)


# --------------------------------------------------------------------------
# The trace and the fleet
# --------------------------------------------------------------------------

def trace(seed, hours, per_minute):
    """[(arrival seconds, profile, run seconds)], seeded."""
    rng = random.Random(seed)
    pods, t = [], 0.0
    while True:
        t += rng.expovariate(per_minute / 60.0)
        if t >= hours * 3600:
            return pods
        mix = MIXES[min(int(t // 3600), len(MIXES) - 1)]
        names = sorted(mix)
        profile = rng.choices(names, weights=[mix[n] for n in names])[0]
        pods.append((round(t), profile, rng.randint(5, 30) * 60))


class Pod(object):
    __slots__ = ("id", "profile", "arrive", "run", "bound", "node", "gpu", "gi", "done")

    def __init__(self, pid, profile, arrive, run):
        self.id, self.profile, self.arrive, self.run = pid, profile, arrive, run
        self.bound = self.node = self.gpu = self.gi = self.done = None


class Fleet(object):
    """GPUs as GpuInstance lists (a busy compute instance carries its pod's id as pid), pods, metrics."""

    def __init__(self, nodes, gpus):
        self.names = ["node-%02d" % i for i in range(nodes)]
        self.gpus = {}
        for name in self.names:
            for g in range(gpus):
                self.gpus[(name, g)] = [self._gi(i + 1, p, s) for i, (p, s) in enumerate(ALL_BALANCED)]
        self.busy_until = {}   # node -> time its change ends (it takes no pod until then)
        self.destroyed = 0
        self.evicted = 0
        self.pods = []
        self.pending = []

    @staticmethod
    def _gi(gi_id, name, start, pids=()):
        profile = profile_by_name(GEOMETRY, name)
        return layout.GpuInstance(gi_id, profile.id, start, ((0, full_ci(profile).id, 0, tuple(pids)),))

    @staticmethod
    def profile_of(gi):
        return next(p.name for p in GEOMETRY.profiles if p.id == gi.profile_id)

    def free(self, node, t):
        return self.busy_until.get(node, -1) < t   # a change ending at t is applied before the node takes pods

    def bind(self, t):
        still = []
        for pod in self.pending:
            if not self._place(pod, t):
                still.append(pod)
        self.pending = still

    def _place(self, pod, t):
        for (node, g), gis in sorted(self.gpus.items()):
            if not self.free(node, t):
                continue
            for i, gi in enumerate(gis):
                if self.profile_of(gi) == pod.profile and not gi.compute_instances[0].busy:
                    gis[i] = self._gi(gi.gi_id, pod.profile, gi.start, (pod.id,))
                    pod.bound, pod.node, pod.gpu, pod.gi = t, node, g, gi.gi_id
                    return True
        return False

    def finish(self, t):
        for pod in self.pods:
            if pod.bound is not None and pod.done is None and pod.bound + pod.run <= t:
                pod.done = t
                self._release(pod)

    def _release(self, pod):
        gis = self.gpus[(pod.node, pod.gpu)]
        for i, gi in enumerate(gis):
            if gi.gi_id == pod.gi:
                gis[i] = self._gi(gi.gi_id, pod.profile, gi.start)

    def evict_node(self, node, t):
        """A drain: the node's running pods go back to pending (counted as evicted)."""
        for pod in self.pods:
            if pod.node == node and pod.done is None and pod.bound is not None:
                self._release(pod)
                self.evicted += 1
                pod.bound = pod.node = pod.gpu = pod.gi = None
                self.pending.append(pod)
        self.pending.sort(key=lambda p: (p.arrive, p.id))

    def reshape(self, node, g, target):
        """Apply a target {profile: count} to one GPU with mig_config's planner; False when it cannot."""
        gis = self.gpus[(node, g)]
        try:
            plan = layout.plan_gpu(GEOMETRY, tuple(gis), target)
        except layout.LayoutError:
            return False
        next_id = max([gi.gi_id for gi in gis] + [0]) + 1
        result = []
        for gi in plan.result:
            if gi.gi_id is None:
                result.append(self._gi(next_id, self.profile_of(gi), gi.start))
                next_id += 1
            else:
                result.append(gi)
        self.gpus[(node, g)] = result
        self.destroyed += plan.destroyed_devices
        return True

    def used_slices(self):
        return sum(profile_by_name(GEOMETRY, self.profile_of(gi)).sm_slices
                   for gis in self.gpus.values() for gi in gis if gi.compute_instances[0].busy)

    def facts(self):
        out = {}
        for name in self.names:
            gpus = []
            for (node, g), gis in sorted(self.gpus.items()):
                if node == name:
                    gpus.append(facts(g, MODEL, [(gi.gi_id, self.profile_of(gi), gi.start,
                                                  gi.compute_instances[0].pids) for gi in gis]))
            out[name] = node_facts(gpus)
        return out

    def allocations(self):
        """{node: mig_node_info's result}: the kubelet's pod map, one allocation per running pod's device."""
        out = dict((name, {"allocations": [], "allocations_error": None}) for name in self.names)
        for p in self.pods:
            if p.bound is not None and p.done is None:
                out[p.node]["allocations"].append({
                    "device_uuid": "MIG-%s-%d-%d" % (MODEL, p.gpu, p.gi), "namespace": "bench",
                    "pod": "pod-%d" % p.id, "container": "c", "resource": "nvidia.com/mig-" + p.profile})
        return out

    def running_manifests(self):
        return [{"metadata": {"name": "pod-%d" % p.id, "namespace": "bench"},
                 "spec": {"nodeName": p.node, "containers": [
                     {"name": "c", "resources": {"limits": {"nvidia.com/mig-" + p.profile: "1"}}}]},
                 "status": {"phase": "Running"}}
                for p in self.pods if p.bound is not None and p.done is None]


# --------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------

class Fixed(object):
    name = "fixed all-balanced"

    def step(self, fleet, t):
        pass


class NosGreedy(object):
    name = "nos-style greedy"

    def __init__(self, seconds):
        self.seconds = seconds
        self.geometries = _geometries(GEOMETRY)
        self.change = None   # (node, gpu, target, ends)

    def step(self, fleet, t):
        if self.change is not None:
            node, g, target, ends = self.change
            if t < ends:
                return
            fleet.reshape(node, g, target)
            self.change = None
        if not fleet.pending:
            return
        lacking = {}
        for pod in fleet.pending:
            lacking[pod.profile] = lacking.get(pod.profile, 0) + 1
        pod = fleet.pending[0]
        for (node, g), gis in sorted(fleet.gpus.items()):
            if not fleet.free(node, t):
                continue
            used = {}
            for gi in gis:
                if gi.compute_instances[0].busy:
                    used[fleet.profile_of(gi)] = used.get(fleet.profile_of(gi), 0) + 1
            best, best_score = None, 0
            for geometry in self.geometries:
                if geometry.get(pod.profile, 0) < used.get(pod.profile, 0) + 1:
                    continue
                if any(geometry.get(n, 0) < c for n, c in used.items()):
                    continue
                score = sum(min(geometry.get(n, 0) - used.get(n, 0), need) for n, need in lacking.items())
                if score > best_score and _reachable(fleet, gis, geometry):
                    best, best_score = geometry, score
            if best is not None:
                fleet.busy_until[node] = t + self.seconds
                self.change = (node, g, best, t + self.seconds)
                return


def _reachable(fleet, gis, target):
    try:
        layout.plan_gpu(GEOMETRY, tuple(gis), target)
    except layout.LayoutError:
        return False
    return True


class Loop(object):
    def __init__(self, args, pod_map=True):
        self.name = "this loop" + ("" if pod_map else ", no pod map")
        self.pod_map = pod_map
        self.debouncer = _demand.Debouncer(args.settle, args.settle * 4)
        self.args = args
        self.wanted = False          # an event came and no round has taken it yet
        self.last_change = None
        self.queue = []              # [(node, start, end, {gpu: target})] of the running round
        self.rounds = self.held = self.plan_seconds = 0

    def step(self, fleet, t):
        self._advance(fleet, t)
        profiles = {}
        for pod in fleet.pending:
            profiles["nvidia.com/mig-" + pod.profile] = profiles.get("nvidia.com/mig-" + pod.profile, 0) + 1
        self.debouncer.observe({"profiles": profiles, "pods": len(fleet.pending), "oldest_pending_seconds": 0,
                                "fingerprint": _demand.fingerprint(profiles, len(fleet.pending))}, t)
        event = self.debouncer.due(t)
        if event is not None and event["pods"]:
            self.wanted = True
        if not self.wanted or self.queue:
            return
        if self.last_change is not None and t < self.last_change + self.args.cooldown:
            return
        self.wanted = False
        self._round(fleet, t)

    def _round(self, fleet, t):
        demand, in_use = {}, {}
        for pod in fleet.pending:
            demand[pod.profile] = demand.get(pod.profile, 0) + 1
        for pod in fleet.pods:
            if pod.bound is not None and pod.done is None:
                counts = in_use.setdefault(pod.node, {})
                counts[pod.profile] = counts.get(pod.profile, 0) + 1
        if not demand:
            return
        began = time.perf_counter()
        facts, pods = fleet.facts(), fleet.running_manifests()
        if self.pod_map:
            # What mig_plan does with the nodes' allocations (plan.yml, demand_round.yml).
            maps = _demand_allocations.pod_maps(fleet.allocations(), sorted(facts))
            facts = _demand_allocations.with_holders(facts, maps)
        plan = plan_fleet(facts, demand, in_use=in_use)
        if self.pod_map:
            _demand_allocations.add_evictions(plan, facts, maps, pods)
        self.plan_seconds += time.perf_counter() - began
        selection = _rounds.select(plan, pods, settings={"max_nodes": self.args.max_nodes,
                                                         "serial": self.args.round_serial})
        self.rounds += 1
        self.held += len(selection["held"])
        start = t + self.args.round_seconds
        for i, name in enumerate(selection["apply"]):
            targets = {g["index"]: g["after"] for g in plan["nodes"][name]["gpus"] if g["changed"]}
            # site.yml's batches (the selection's serial: every node at once when all evict nobody,
            # else --round-serial), one batch after the other.
            end = start + (i // selection["serial"] + 1) * self.args.loop_node_seconds
            self.queue.append((name, start, end, targets))
            fleet.busy_until[name] = end   # cordoned until its batch ends
        if set(selection["apply"]) - set(selection["fast"]):
            # demand_round.yml stamps an approved change when its apply ends: the cooldown runs
            # from there (changes that evict nobody start none).
            self.last_change = max(end for _name, _start, end, _targets in self.queue)

    def _advance(self, fleet, t):
        while self.queue and self.queue[0][2] <= t:
            name, _start, _end, targets = self.queue.pop(0)
            if not self.pod_map:
                fleet.evict_node(name, t)   # the whole-node drain: the selection should have left nothing
            # With the pod map: mig_node_drain none, nothing is evicted; reshape refuses to destroy a busy device.
            for g, target in sorted(targets.items()):
                fleet.reshape(name, g, target)


# --------------------------------------------------------------------------
# The replay
# --------------------------------------------------------------------------

def replay(policy, pods, args):
    fleet = Fleet(args.nodes, args.gpus)
    arrivals = [Pod(i, profile, at, run) for i, (at, profile, run) in enumerate(pods)]
    fleet.pods = arrivals
    end = int(args.hours * 3600) + args.tail * 60
    total = args.nodes * args.gpus * GEOMETRY.sm_slices
    timeline, samples = [], []
    nxt = 0
    began = time.perf_counter()
    for t in range(0, end + 1, args.step):
        fleet.finish(t)
        while nxt < len(arrivals) and arrivals[nxt].arrive <= t:
            fleet.pending.append(arrivals[nxt])
            nxt += 1
        fleet.bind(t)
        policy.step(fleet, t)
        fleet.bind(t)
        used = fleet.used_slices()
        samples.append(used)
        if t % (args.sample_minutes * 60) == 0:
            timeline.append(round(100.0 * used / total))
    served = [p for p in arrivals if p.bound is not None or p.done is not None]
    waits = sorted(p.bound - p.arrive for p in served if p.bound is not None)
    return {
        "policy": policy.name,
        "pods": len(arrivals),
        "served": len(served),
        "never_served": len(arrivals) - len(served),
        "wait_p50_s": _percentile(waits, 50),
        "wait_p95_s": _percentile(waits, 95),
        "devices_destroyed": fleet.destroyed,
        "pods_evicted": fleet.evicted,
        "slices_allocated_mean_pct": round(100.0 * sum(samples) / (len(samples) * total), 1),
        "slices_allocated_pct_timeline": timeline,
        "rounds": getattr(policy, "rounds", None),
        "nodes_held": getattr(policy, "held", None),
        "plan_seconds": round(getattr(policy, "plan_seconds", 0.0), 1),
        "wall_seconds": round(time.perf_counter() - began, 1),
    }


def _percentile(values, pct):
    """Nearest rank of sorted values."""
    if not values:
        return None
    return values[max(0, math.ceil(pct / 100.0 * len(values)) - 1)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=2, help="H100-80GB GPUs per node")
    parser.add_argument("--hours", type=float, default=3.0, help="arrivals over this period")
    parser.add_argument("--tail", type=int, default=30, help="minutes replayed after the last arrival")
    parser.add_argument("--per-minute", type=float, default=2.0, help="pod arrivals per minute")
    parser.add_argument("--step", type=int, default=5, help="seconds per simulation step")
    parser.add_argument("--settle", type=float, default=10.0, help="the source's settle window")
    # The guardrails default as demand_round.yml's do (gpuops_mig_round_cooldown 300, gpuops_mig_round_max_nodes 1,
    # gpuops_mig_round_serial 1; the source's settle_seconds 10).
    parser.add_argument("--cooldown", type=int, default=300, help="seconds between approved changes")
    parser.add_argument("--max-nodes", type=int, default=1, help="approved changes per round")
    parser.add_argument("--round-seconds", type=int, default=20, help="a round's facts, pods and plan")
    parser.add_argument("--loop-node-seconds", type=int, default=60, help="site.yml on one batch of nodes")
    parser.add_argument("--round-serial", type=int, default=1,
                        help="approved nodes per site.yml batch (gpuops_mig_round_serial)")
    parser.add_argument("--nos-seconds", type=int, default=20, help="nos's agent on one GPU")
    parser.add_argument("--sample-minutes", type=int, default=30)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--trace", help="replay the trace that bench_demand_loop.py --json wrote "
                        "(its pods, not --seed/--hours/--per-minute), to set the model and the "
                        "greedy reference beside the measured loop")
    args = parser.parse_args(argv)
    if args.trace:
        with open(args.trace) as handle:
            measured = json.load(handle)["trace"]   # [at, name, profile, runs]
        pods = [(round(at), profile, round(runs)) for at, _name, profile, runs in measured]
        args.hours = (max(at for at, _p, _r in pods) + args.step) / 3600.0
    else:
        pods = trace(args.seed, args.hours, args.per_minute)
    policies = [Fixed(), NosGreedy(args.nos_seconds), Loop(args, pod_map=False), Loop(args)]
    results = [replay(policy, pods, args) for policy in policies]
    header = ("policy", "served", "never", "p50 s", "p95 s", "destroyed", "evicted", "slices %", "rounds", "held")
    print("%d pods over %.1f h, %d nodes x %d H100-80GB, seed %d, Python %s"
          % (len(pods), args.hours, args.nodes, args.gpus, args.seed, platform.python_version()))
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in results:
        print("| %s | %d | %d | %s | %s | %d | %d | %.1f | %s | %s |" % (
            r["policy"], r["served"], r["never_served"], r["wait_p50_s"], r["wait_p95_s"], r["devices_destroyed"],
            r["pods_evicted"], r["slices_allocated_mean_pct"], r["rounds"] if r["rounds"] is not None else "-",
            r["nodes_held"] if r["nodes_held"] is not None else "-"))
    print("slices allocated (%% of the fleet) every %d min:" % args.sample_minutes)
    for r in results:
        print("  %-32s %s" % (r["policy"], " ".join("%3d" % v for v in r["slices_allocated_pct_timeline"])))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=2, sort_keys=True)
    return results


if __name__ == "__main__":
    main()
