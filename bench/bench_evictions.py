# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Eviction benchmark: pods evicted per node transition, whole-node drain against devices mode.

Seeded random transitions between the named configs of NVIDIA's mig-parted
config-default.yaml (v0.15.0, tests/unit/plugins/modules/fixtures) on 8-GPU
A100-40GB and H100-80GB hosts. The source layout is what the source config
builds on empty GPUs; half of its MIG devices (rounded down), chosen at random,
are allocated to pods, one pod per device. Per transition it counts the pods
evicted by:

* node drain: today's drain, every pod on the node (a node whose devices
  already match the target is not touched);
* pod-blind: the pods on the devices destroyed by the plan that ignores pods
  (the planner as it was: fewest devices destroyed);
* devices: plan_gpu(evict_pods=True) per GPU, then _evictions.node_evictions;
* minimum: the exhaustive minimum over every valid plan, per GPU, by the brute
  force of the test helpers (every final layout, every CI content; it shares no
  code with the planner).

--multi-gpu measures pods that hold devices on several GPUs instead (docs/rollout.md):
2-GPU H100-80GB nodes, each GPU its own named config before and another after; half
the devices of each GPU (rounded down) are allocated, and as many pods as possible
hold one device on each GPU (the rest one device each). Per transition it counts:

* per GPU: each GPU planned on its own (plan_gpu(evict_pods=True)), as the live
  drain did before: a pod whose devices go on both GPUs counts once, but a tie on
  one GPU may take a pod the other GPU keeps;
* node: _gpu_layout.plan_node_gpus, what mig_node_info plans now;
* minimum: the exhaustive minimum over every combination of valid per-GPU plans.

Usage (from the repository root):
    .venv/bin/python bench/bench_evictions.py [--transitions N] [--seed S] [--write-docs]
    .venv/bin/python bench/bench_evictions.py --multi-gpu [--transitions N] [--seed S]

--write-docs replaces the eviction results section of docs/planner.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import re
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))

from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted  # noqa: E402
from ansible_collections.gpuops.mig.plugins.module_utils._errors import LayoutError  # noqa: E402
from ansible_collections.gpuops.mig.plugins.module_utils._evictions import node_evictions  # noqa: E402
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (  # noqa: E402
    ComputeInstance,
    GpuInstance,
    device_counts,
    evicted_pod_names,
    normalize_target,
    plan_gpu,
    plan_node_gpus,
    validate_target,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (  # noqa: E402
    A100_40GB,
    H100_80GB,
    PCI_IDS,
    exhaustive_best_evictions,
    exhaustive_node_evictions,
)

MODELS = {"A100-40GB": A100_40GB, "H100-80GB": H100_80GB}
GPUS_PER_HOST = 8
CONFIG_FILE = os.path.join(ROOT, "tests", "unit", "plugins", "modules", "fixtures",
                           "mig-parted-config-default-v0.15.0.yaml")
DOC = os.path.join(ROOT, "docs", "planner.md")
BEGIN, END = "<!-- bench-evictions:begin -->", "<!-- bench-evictions:end -->"


def named_configs(model):
    """{config name: {GPU index: target}} for the configs of config-default.yaml that enable MIG on every GPU
    of an 8-GPU host of this model with profiles the model has (all-disabled changes the mode instead)."""
    with open(CONFIG_FILE) as f:
        config = migparted.load_config(f.read(), origin=CONFIG_FILE)
    geometry = MODELS[model]
    host = [migparted.HostGpu(index=i, pci_device_id=PCI_IDS[model], mig_capable=True)
            for i in range(GPUS_PER_HOST)]
    usable = {}
    for name in config.configs:
        resolution = migparted.resolve_targets(config.select(name), host, allow_unmatched=True)
        if len(resolution.targets) != GPUS_PER_HOST or not all(t.mig_enabled for t in resolution.targets):
            continue
        try:
            targets = {t.gpu.index: validate_target(geometry, t.mig_devices) for t in resolution.targets}
        except LayoutError:
            continue   # a profile of another GPU model
        usable[name] = targets
    return usable


def build_layout(geometry, counts, gpu):
    """What a GPU looks like after the config is applied to it empty: ids and MIG UUIDs assigned."""
    result = []
    for n, gi in enumerate(sorted(plan_gpu(geometry, [], counts).result, key=lambda g: g.start)):
        cis = tuple(ComputeInstance(k, ci.profile_id, ci.start, uuid="MIG-gpu%d-gi%d-ci%d" % (gpu, n + 1, k))
                    for k, ci in enumerate(gi.compute_instances))
        result.append(GpuInstance(n + 1, gi.profile_id, gi.start, cis))
    return result


def allocate(layouts, rng):
    """Half the node's MIG devices (rounded down), chosen at random, each to its own pod."""
    devices = [(gpu, g, c) for gpu, layout in sorted(layouts.items())
               for g, gi in enumerate(layout) for c in range(len(gi.compute_instances))]
    chosen = set(rng.sample(devices, len(devices) // 2))
    allocated = {}
    for gpu, layout in sorted(layouts.items()):
        gis = []
        for g, gi in enumerate(layout):
            cis = tuple(dataclasses.replace(ci, pods=("bench/pod-gpu%d-%s/main" % (gpu, ci.uuid[-7:]),))
                        if (gpu, g, c) in chosen else ci for c, ci in enumerate(gi.compute_instances))
            gis.append(dataclasses.replace(gi, compute_instances=cis))
        allocated[gpu] = gis
    return allocated


def transitions(count, seed, per_gpu=False):
    """[(model, {GPU: existing layout with pods}, {GPU: target})], seeded.

    One named config for the whole node before and another after (what mig-manager applies), or with
    per_gpu each GPU its own named config before, and half of the GPUs (chosen at random) another one after.
    """
    rng = random.Random(seed)
    configs = {model: named_configs(model) for model in sorted(MODELS)}
    found = []
    for dummy in range(count):
        model = rng.choice(sorted(MODELS))
        names = sorted(configs[model])
        if per_gpu:
            sources = {gpu: rng.choice(names) for gpu in range(GPUS_PER_HOST)}
            changing = set(rng.sample(range(GPUS_PER_HOST), GPUS_PER_HOST // 2))
            targets = {gpu: rng.choice([n for n in names if n != name]) if gpu in changing else name
                       for gpu, name in sources.items()}
        else:
            source, target = rng.sample(names, 2)
            sources = dict.fromkeys(range(GPUS_PER_HOST), source)
            targets = dict.fromkeys(range(GPUS_PER_HOST), target)
        geometry = MODELS[model]
        layouts = {gpu: build_layout(geometry, configs[model][name][gpu], gpu) for gpu, name in sources.items()}
        found.append((model, allocate(layouts, rng), {gpu: configs[model][name][gpu] for gpu, name in targets.items()}))
    return found


def strip_pods(layout):
    return [dataclasses.replace(gi, compute_instances=tuple(dataclasses.replace(ci, pods=())
                                                            for ci in gi.compute_instances)) for gi in layout]


def measure(model, existing, targets):
    geometry = MODELS[model]
    on_node = {pod for layout in existing.values() for gi in layout for ci in gi.compute_instances
               for pod in ci.pod_names}
    changes = any(device_counts(geometry, existing[gpu]) != normalize_target(geometry, targets[gpu])
                  for gpu in existing)
    timings = []
    for dummy in range(3):
        started = time.perf_counter()
        plans = {gpu: plan_gpu(geometry, existing[gpu], targets[gpu], evict_pods=True) for gpu in sorted(existing)}
        devices = node_evictions(plans, geometries={gpu: geometry for gpu in plans})
        timings.append(time.perf_counter() - started)
    # The plan that ignores pods, and the pods on the devices it destroys.
    blind = set()
    for gpu in sorted(existing):
        plan = plan_gpu(geometry, strip_pods(existing[gpu]), targets[gpu])
        gone = {(gi.gi_id, ci.ci_id) for gi, ci in plan.destroyed_compute_instances()}
        blind |= {pod for gi in existing[gpu] for ci in gi.compute_instances if (gi.gi_id, ci.ci_id) in gone
                  for pod in ci.pod_names}
    minimum = sum(exhaustive_best_evictions(geometry, existing[gpu], targets[gpu], evict_pods=True)[0]
                  for gpu in existing)
    return {
        "pods": len(on_node),
        "node": len(on_node) if changes else 0,
        "blind": len(blind),
        "devices": len(devices.pods),
        "minimum": minimum,
        "nothing": bool(on_node) and changes and devices.evicts_nothing,
        "changes": changes,
        "seconds": min(timings),
    }


def random_target(geometry, rng, differs=None):
    """A random full layout: single-CI devices added at random while the GPU takes them; drawn
    again while it equals ``differs``."""
    names = [p.name for p in geometry.profiles if "+" not in p.name]
    while True:
        counts, misses = {}, 0
        while misses < 6:
            name = rng.choice(names)
            trial = dict(counts, **{name: counts.get(name, 0) + 1})
            try:
                validate_target(geometry, trial)
            except LayoutError:
                misses += 1
                continue
            counts = trial
        if counts != differs:
            return counts


def spanning_transitions(count, seed, gpus=2, model="H100-80GB"):
    """[(model, {GPU: existing layout with pods}, {GPU: target})], seeded: every GPU changes, and
    pods hold one device on each of two GPUs wherever both have one allocated. Layouts are random
    (random_target): the named configs change nearly every device of a GPU, which leaves no choice
    of which pod goes."""
    rng = random.Random(seed)
    geometry = MODELS[model]
    found = []
    for dummy in range(count):
        sources = {gpu: random_target(geometry, rng) for gpu in range(gpus)}
        targets = {gpu: random_target(geometry, rng, differs=source)
                   for gpu, source in sources.items()}
        layouts = {gpu: build_layout(geometry, source, gpu) for gpu, source in sources.items()}
        chosen = {}
        for gpu, layout in layouts.items():
            devices = [(g, c) for g, gi in enumerate(layout)
                       for c in range(len(gi.compute_instances))]
            chosen[gpu] = rng.sample(devices, len(devices) // 2)
        owner = {}
        for n, pair in enumerate(zip(*(chosen[gpu] for gpu in sorted(chosen)))):
            for gpu, device in zip(sorted(chosen), pair):
                owner[(gpu,) + device] = "bench/span-%d/main" % n
        for gpu in chosen:
            for device in chosen[gpu]:
                owner.setdefault((gpu,) + device, "bench/pod-gpu%d-%d-%d/main" % ((gpu,) + device))
        existing = {}
        for gpu, layout in layouts.items():
            existing[gpu] = [dataclasses.replace(gi, compute_instances=tuple(
                dataclasses.replace(ci, pods=(owner[(gpu, g, c)],)) if (gpu, g, c) in owner else ci
                for c, ci in enumerate(gi.compute_instances))) for g, gi in enumerate(layout)]
        found.append((model, existing, targets))
    return found


def measure_spanning(model, existing, targets):
    geometry = MODELS[model]
    on_node = {pod for layout in existing.values() for gi in layout for ci in gi.compute_instances
               for pod in ci.pod_names}
    alone = set()
    for gpu in sorted(existing):
        plan = plan_gpu(geometry, existing[gpu], targets[gpu], evict_pods=True)
        alone |= evicted_pod_names(plan)
    timings = []
    for dummy in range(3):
        started = time.perf_counter()
        requests = dict((gpu, (geometry, existing[gpu], targets[gpu], ())) for gpu in existing)
        plans = plan_node_gpus(requests, evict_pods=True)
        node = node_evictions(plans, geometries={gpu: geometry for gpu in plans})
        timings.append(time.perf_counter() - started)
    return {"pods": len(on_node), "spanning": sum(1 for p in on_node if "/span-" in p),
            "per_gpu": len(alone), "node": len(node.pods),
            "minimum": exhaustive_node_evictions(geometry, existing, targets),
            "seconds": min(timings)}


def spanning_table(rows, seed):
    cells = []
    for key in ("pods", "spanning", "per_gpu", "node", "minimum"):
        values = [r[key] for r in rows]
        cells.append("%d / %.2f / %d" % (sum(values), statistics.mean(values), max(values)))
    times = sorted(r["seconds"] * 1000 for r in rows)
    hits = [sum(r[key] == r["minimum"] for r in rows) for key in ("per_gpu", "node")]
    return "\n".join([
        "| transitions | n | pods on the node | of them on both GPUs | evicted: per GPU "
        "| evicted: node | evicted: minimum | per GPU = minimum | node = minimum "
        "| planning (mean / max) |",
        "|---|---:|---|---|---|---|---|---:|---:|---:|",
        "| 2 x H100-80GB, every GPU changes (seed %d) | %d | %s | %d/%d | %d/%d | %.1f / %.1f ms |"
        % (seed, len(rows), " | ".join(cells), hits[0], len(rows), hits[1], len(rows),
           statistics.mean(times), times[-1]),
        "", "Cells: total / mean per transition / worst transition, in pods."])


def table(sets):
    lines = [
        "| transitions | n | nodes changed | pods on the node | evicted: node drain | evicted: pod-blind plan "
        "| evicted: devices | evicted: minimum | devices = minimum | evicted vs node drain "
        "| changes with pods evicting nobody |",
        "|---|---:|---:|---|---|---|---|---|---:|---:|---:|",
    ]
    for name, rows in sets:
        cells = [name, str(len(rows)), str(sum(r["changes"] for r in rows))]
        for key in ("pods", "node", "blind", "devices", "minimum"):
            values = [r[key] for r in rows]
            cells.append("%d / %.2f / %d" % (sum(values), statistics.mean(values), max(values)))
        cells.append("%d/%d" % (sum(r["devices"] == r["minimum"] for r in rows), len(rows)))
        drained = sum(r["node"] for r in rows)
        cells.append("%.1f%% fewer" % (100.0 * (1 - sum(r["devices"] for r in rows) / drained)) if drained else "-")
        cells.append(str(sum(r["nothing"] for r in rows)))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cells: total / mean per transition / worst transition, in pods.", "",
              "| transitions | planning time per transition (8 GPUs + node evictions, best of 3): mean | p95 | max |",
              "|---|---:|---:|---:|"]
    for name, rows in sets:
        times = sorted(r["seconds"] * 1000 for r in rows)
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        lines.append("| %s | %.1f ms | %.1f ms | %.1f ms |" % (name, statistics.mean(times), p95, times[-1]))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=200, help="number of transitions (default 200)")
    parser.add_argument("--seed", type=int, default=20261125, help="seed (default 20261125)")
    parser.add_argument("--write-docs", action="store_true", help="write the results into docs/planner.md")
    parser.add_argument("--multi-gpu", action="store_true",
                        help="pods holding devices on two GPUs of a node (docs/rollout.md); "
                             "not written to the docs")
    args = parser.parse_args()
    if args.multi_gpu:
        started = time.perf_counter()
        rows = [measure_spanning(*t) for t in spanning_transitions(args.transitions, args.seed)]
        print("Produced by `.venv/bin/python bench/bench_evictions.py --multi-gpu "
              "--transitions %d "
              "--seed %d` in %.0f s (Python %s, %s).\n"
              % (args.transitions, args.seed, time.perf_counter() - started,
                 platform.python_version(), platform.machine()))
        print(spanning_table(rows, args.seed))
        if any(r["node"] != r["minimum"] for r in rows):
            sys.exit("the node's plans evicted more than the minimum in %d transitions"
                     % sum(r["node"] != r["minimum"] for r in rows))
        return

    started = time.perf_counter()
    sets = []
    for per_gpu in (False, True):
        rows = {}
        for model, existing, targets in transitions(args.transitions, args.seed, per_gpu=per_gpu):
            rows.setdefault(model, []).append(measure(model, existing, targets))
        kind = "per-GPU configs, half the GPUs change" if per_gpu else "one config per node"
        sets += [("%s, %s" % (model, kind), rows[model]) for model in sorted(rows)]
        sets.append(("%s, both models (seed %d)" % (kind, args.seed), [r for m in sorted(rows) for r in rows[m]]))
    elapsed = time.perf_counter() - started
    configs = ", ".join("%s %d" % (model, len(named_configs(model))) for model in sorted(MODELS))
    command = ".venv/bin/python bench/bench_evictions.py --transitions %d --seed %d%s" % (
        args.transitions, args.seed, " --write-docs" if args.write_docs else "")
    report = "\n".join([
        "Produced by `%s` in %.0f s (Python %s, %s). Named configs of config-default.yaml usable per model: %s."
        % (command, elapsed, platform.python_version(), platform.machine(), configs),
        "",
        table(sets),
    ])
    print(report)
    mismatches = sum(r["devices"] != r["minimum"] for name, rows in sets if "both models" in name for r in rows)
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
    if mismatches:
        sys.exit("devices mode evicted more than the minimum in %d transitions" % mismatches)


if __name__ == "__main__":
    main()
