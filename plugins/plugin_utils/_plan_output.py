# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The fleet planner's output: the chosen layouts as the plan (per node layouts, a mig-parted config, the
report), proved with plan_gpu, and the views of it (a table for people, the vars file site.yml reads).
Part of the planner of _fleet_plan.py; controller-only.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_demand import PlanInputError
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_search import _allocate, _current_cover, _lower_bound_nodes

__all__ = [
    "plan_table",
    "vars_file_data",
]


# --------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------

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
# Views
# --------------------------------------------------------------------------

def _counts_text(counts):
    return ", ".join("%s x%d" % item for item in counts.items()) or "-"


def plan_table(plan: Mapping[str, Any]) -> list[str]:
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


def vars_file_data(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What site.yml -e @file reads: gpuops_mig_plan with version, nodes (layouts, config_label, touched), report."""
    return {"gpuops_mig_plan": {
        "version": 1,
        "nodes": dict((node, {"layouts": data["layouts"], "config_label": data["config_label"],
                              "touched": data["touched"]})
                      for node, data in sorted(plan["nodes"].items())),
        "report": plan["report"],
    }}
