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

Usage (from the repository root):
    .venv/bin/python bench/bench_evictions.py [--transitions N] [--seed S] [--write-docs]

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
    normalize_target,
    plan_gpu,
    validate_target,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (  # noqa: E402
    A100_40GB,
    H100_80GB,
    PCI_IDS,
    exhaustive_best_evictions,
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
    args = parser.parse_args()

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
