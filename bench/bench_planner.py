# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Planner benchmark: MIG devices destroyed/created per transition and planning time.

For A100-40GB and H100-80GB it runs every ordered pair of mig-parted's named
single-profile configs plus all-balanced (mig-facts.md section 2.2), and a set
of seeded random transitions, and compares three ways of applying them:

* ours: plan_gpu() from plugins/module_utils/_gpu_layout.py;
* minimum: the exhaustive search in the test helpers (the best possible);
* tear-down: mig-parted's way: a GPU whose devices already match is skipped,
  any other GPU is emptied and rebuilt.

Usage (from the repository root):
    .venv/bin/python bench/bench_planner.py [--random N] [--seed S] [--write-docs]

--write-docs replaces the results section of docs/planner.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (  # noqa: E402
    ComputeInstance,
    GpuInstance,
    LayoutError,
    device_counts,
    plan_gpu,
    validate_target,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (  # noqa: E402
    A100_40GB,
    H100_80GB,
    exhaustive_best,
)

MODELS = {"A100-40GB": A100_40GB, "H100-80GB": H100_80GB}
BALANCED = {
    "A100-40GB": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "H100-80GB": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
}
DOC = os.path.join(ROOT, "docs", "planner.md")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def named_configs(model):
    """mig-parted's all-<profile> (at the profile's max count) and all-balanced."""
    configs = {}
    for profile in sorted(MODELS[model].profiles, key=lambda p: (p.sm_slices, p.memory_slices, p.name)):
        configs["all-" + profile.name.replace("+", ".")] = {profile.name: profile.max_count}
    configs["all-balanced"] = BALANCED[model]
    return configs


def build_layout(geometry, counts):
    """What a GPU looks like after applying counts to an empty GPU (ids assigned)."""
    plan = plan_gpu(geometry, [], counts)
    return with_ids(plan.result)


def with_ids(gpu_instances):
    result = []
    for n, gi in enumerate(sorted(gpu_instances, key=lambda g: g.start)):
        cis = tuple(ComputeInstance(k, ci.profile_id, ci.start) for k, ci in enumerate(gi.compute_instances))
        result.append(GpuInstance(n + 1, gi.profile_id, gi.start, cis))
    return result


def random_counts(geometry, rng):
    """Devices of a random layout: random GIs at free placements, each with one
    compute profile (a full CI three times out of four)."""
    used = 0
    sm = 0
    per_profile = {}
    counts = {}
    for dummy in range(rng.randint(1, geometry.memory_slices)):
        spots = [(p, s) for p in geometry.profiles for s in p.placements
                 if not used & (((1 << p.memory_slices) - 1) << s)
                 and sm + p.sm_slices <= geometry.sm_slices
                 and per_profile.get(p.id, 0) < p.max_count]
        if not spots:
            break
        profile, start = rng.choice(spots)
        used |= ((1 << profile.memory_slices) - 1) << start
        sm += profile.sm_slices
        per_profile[profile.id] = per_profile.get(profile.id, 0) + 1
        full = [c for c in profile.ci_profiles if c.sm_slices == profile.sm_slices][0]
        ci = full if rng.random() < 0.75 else rng.choice(profile.ci_profiles)
        name = profile.name if ci is full else ci.name
        counts[name] = counts.get(name, 0) + (1 if ci is full else rng.randint(1, ci.max_count))
    return counts


def random_transitions(count, seed):
    rng = random.Random(seed)
    transitions = []
    while len(transitions) < count:
        model = rng.choice(sorted(MODELS))
        geometry = MODELS[model]
        before, after = random_counts(geometry, rng), random_counts(geometry, rng)
        try:
            validate_target(geometry, before)
            validate_target(geometry, after)
        except LayoutError:
            continue   # a mixed draw that one-compute-profile-per-GI packing cannot build
        transitions.append((model, before, after))
    return transitions


def measure(model, before, after):
    geometry = MODELS[model]
    existing = build_layout(geometry, before)
    existing_total = sum(before.values())
    target_total = sum(after.values())
    timings = []
    for dummy in range(3):
        start = time.perf_counter()
        plan = plan_gpu(geometry, existing, after)
        timings.append(time.perf_counter() - start)
    best = exhaustive_best(geometry, existing, after)
    minimum_destroyed = best[1]
    if device_counts(geometry, existing) == {k: v for k, v in after.items() if v}:
        teardown = (0, 0)
    else:
        teardown = (existing_total, target_total)
    return {
        "ours": (plan.destroyed_devices, plan.created_devices),
        "minimum": (minimum_destroyed, target_total - (existing_total - minimum_destroyed)),
        "teardown": teardown,
        "seconds": min(timings),
    }


def summarize(rows, key, index):
    values = [r[key][index] for r in rows]
    return sum(values), statistics.mean(values), max(values)


def table(sets):
    lines = [
        "| transitions | n | destroyed: ours | destroyed: minimum | destroyed: tear-down "
        "| created: ours | created: minimum | created: tear-down | ours = minimum |",
        "|---|---:|---|---|---|---|---|---|---:|",
    ]
    for name, rows in sets:
        cells = [name, str(len(rows))]
        for index in (0, 1):
            for key in ("ours", "minimum", "teardown"):
                total, mean, worst = summarize(rows, key, index)
                cells.append("%d / %.2f / %d" % (total, mean, worst))
        cells.append("%d/%d" % (sum(1 for r in rows if r["ours"] == r["minimum"]), len(rows)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: total / mean per transition / worst transition, in MIG devices.")
    lines.append("")
    lines.append("| transitions | planning time mean | p95 | max | worst 8 consecutive plans (one 8-GPU host) |")
    lines.append("|---|---:|---:|---:|---:|")
    for name, rows in sets:
        times = sorted(r["seconds"] * 1000 for r in rows)
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        batches = [sum(r["seconds"] for r in rows[i:i + 8]) * 1000 for i in range(0, len(rows) - 7)]
        lines.append("| %s | %.2f ms | %.2f ms | %.2f ms | %.1f ms |"
                     % (name, statistics.mean(times), p95, times[-1], max(batches) if batches else sum(times)))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=200, help="number of random transitions (default 200)")
    parser.add_argument("--seed", type=int, default=20261122, help="seed for the random transitions")
    parser.add_argument("--write-docs", action="store_true", help="write the results into docs/planner.md")
    args = parser.parse_args()

    started = time.perf_counter()
    sets = []
    for model in sorted(MODELS):
        configs = named_configs(model)
        rows = [measure(model, configs[a], configs[b]) for a in configs for b in configs if a != b]
        sets.append(("%s named configs (%d configs, every ordered pair)" % (model, len(configs)), rows))
    random_rows = [measure(*t) for t in random_transitions(args.random, args.seed)]
    sets.append(("random, A100-40GB and H100-80GB (seed %d)" % args.seed, random_rows))
    elapsed = time.perf_counter() - started

    command = ".venv/bin/python bench/bench_planner.py --random %d --seed %d%s" % (
        args.random, args.seed, " --write-docs" if args.write_docs else "")
    report = "\n".join([
        "Produced by `%s` in %.0f s (Python %s, %s)."
        % (command, elapsed, platform.python_version(), platform.machine()),
        "",
        table(sets),
    ])
    print(report)
    if args.write_docs:
        with open(DOC) as f:
            doc = f.read()
        if BEGIN not in doc or END not in doc:
            sys.exit("docs/planner.md has no %s ... %s section" % (BEGIN, END))
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: BEGIN + "\n" + report + "\n" + END,
                     doc, flags=re.S)
        with open(DOC, "w") as f:
            f.write(doc)
        print("\nwrote %s" % os.path.relpath(DOC, ROOT))


if __name__ == "__main__":
    main()
