# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Fleet planner benchmark: optimality against an oracle and a nos-style greedy, and scale.

* optimality: seeded random fleets (1-4 nodes x 1-8 GPUs of A100-40GB, H100-80GB or
  A30; random current layouts, busy devices, MIG-off GPUs) and random demand. The
  planner's (unmet, nodes touched, devices destroyed) is compared with the oracle in
  tests/unit/plugins/plugin_utils/fleet_helpers.py (every plan_gpu-reachable target of
  every GPU, every subset of nodes) and with nos_greedy (first fit in the manner of nos).
* scale: N nodes x 8 GPUs, each size in a fresh process; wall time of plan_fleet and the
  process's peak RSS.

Usage (from the repository root):
    .venv/bin/python bench/bench_fleet_plan.py optimality [--cases N] [--seed S]
    .venv/bin/python bench/bench_fleet_plan.py scale [--nodes 125 250 500] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))

from ansible_collections.gpuops.mig.plugins.plugin_utils._fleet_plan import plan_fleet  # noqa: E402
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import (  # noqa: E402
    nos_greedy,
    oracle,
    random_demand,
    random_fleet,
)


def optimality(cases, seed):
    rows = []
    started = time.perf_counter()
    for case in range(cases):
        rng = random.Random(seed * 100003 + case)
        fleet = random_fleet(rng, nodes=(1, 4), gpus=(1, 8))
        demand = random_demand(rng, fleet, most=8)
        t = time.perf_counter()
        plan = plan_fleet(fleet, demand)
        ours_s = time.perf_counter() - t
        r = plan["report"]
        ours = (r["unmet_devices"], r["nodes_touched_count"], r["devices_destroyed"])
        greedy = plan_fleet(fleet, demand, exact_limit=0)["report"]
        greedy = (greedy["unmet_devices"], greedy["nodes_touched_count"], greedy["devices_destroyed"])
        rows.append({"ours": ours, "method": r["method"], "oracle": oracle(fleet, demand),
                     "fallback": greedy, "nos": nos_greedy(fleet, demand), "seconds": ours_s,
                     "gpus": sum(len(n["gpus"]) for n in fleet.values())})
    elapsed = time.perf_counter() - started
    n = len(rows)
    equal = sum(1 for r in rows if r["ours"] == r["oracle"])
    lines = ["%d cases (seed %d), %d GPUs in all, %.0f s with the oracle (Python %s)."
             % (n, seed, sum(r["gpus"] for r in rows), elapsed, platform.python_version()), "",
             "| planner | (unmet, nodes touched, destroyed) = oracle | worse | more unmet | more nodes | "
             "more destroyed (cases / devices) | better than the oracle |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label in (("ours", "mig_plan (exact)"), ("fallback", "mig_plan heuristic (exact_limit=0)"),
                       ("nos", "nos-style greedy first fit")):
        same = sum(1 for r in rows if r[key] == r["oracle"])
        worse = sum(1 for r in rows if r[key] > r["oracle"])
        unmet = [r[key][0] - r["oracle"][0] for r in rows if r[key][0] > r["oracle"][0]]
        nodes = [r[key][1] - r["oracle"][1] for r in rows if r[key][0] == r["oracle"][0]
                 and r[key][1] > r["oracle"][1]]
        destroyed = [r[key][2] - r["oracle"][2] for r in rows if r[key][:2] == r["oracle"][:2]
                     and r[key][2] > r["oracle"][2]]
        better = sum(1 for r in rows if r[key] < r["oracle"])
        lines.append("| %s | %d/%d | %d | %d (+%d devices) | %d (+%d nodes) | %d / +%d | %d |" % (
            label, same, n, worse, len(unmet), sum(unmet), len(nodes), sum(nodes), len(destroyed), sum(destroyed),
            better))
    times = sorted(r["seconds"] * 1000 for r in rows)
    lines += ["", "Planning time per case: median %.1f ms, max %.1f ms; exact search in %d/%d cases."
              % (times[n // 2], times[-1], sum(1 for r in rows if r["method"] == "exact"), n)]
    print("\n".join(lines))
    return equal == n


def scale_one(nodes, seed):
    rng = random.Random(seed)
    fleet = random_fleet(rng, nodes=(nodes, nodes), gpus=(8, 8))
    demand = {}
    # About a tenth of the fleet's capacity, over four common profiles.
    for name in ("1g.10gb", "3g.40gb", "1g.6gb", "2g.10gb"):
        demand[name] = max(1, nodes * 8 // 10 // 2)
    start = time.perf_counter()
    plan = plan_fleet(fleet, demand)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    r = plan["report"]
    print(json.dumps({"nodes": nodes, "gpus": nodes * 8, "seconds": seconds, "peak_rss_mib": peak,
                      "method": r["method"], "unmet": r["unmet_devices"], "touched": r["nodes_touched_count"],
                      "lower_bound": r.get("nodes_touched_lower_bound"), "destroyed": r["devices_destroyed"],
                      "demand": demand}))


def scale(sizes, seed):
    lines = ["| nodes x 8 GPUs | GPUs | plan time | peak RSS (whole process) | search | demand (devices) | "
             "unmet | nodes touched (lower bound) | destroyed |", "|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for nodes in sizes:
        out = subprocess.run([sys.executable, __file__, "_scale_one", str(nodes), "--seed", str(seed)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        lines.append("| %d | %d | %.2f s | %.0f MiB | %s | %d | %d | %d (%s) | %d |" % (
            r["nodes"], r["gpus"], r["seconds"], r["peak_rss_mib"], r["method"], sum(r["demand"].values()),
            r["unmet"], r["touched"], r["lower_bound"], r["destroyed"]))
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["optimality", "scale", "_scale_one"])
    parser.add_argument("nodes", nargs="*", type=int)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=20261123)
    args = parser.parse_args()
    if args.what == "optimality":
        sys.exit(0 if optimality(args.cases, args.seed) else 1)
    elif args.what == "scale":
        scale(args.nodes or [125, 250, 500], args.seed)
    else:
        scale_one(args.nodes[0], args.seed)


if __name__ == "__main__":
    main()
