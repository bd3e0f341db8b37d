# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Fleet planner: MIG layouts for a whole fleet from what workloads ask for.

Private to the collection; pure Python (no Ansible, no NVML calls). It runs only
on the controller (the action gpuops.mig.mig_plan), and the tests and bench/ run it.
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

This module is the entry point (plan_fleet); the jobs are in _plan_demand.py (the input),
_plan_search.py (the layouts) and _plan_output.py (the plan and its views).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError
from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import (
    check_applies,
    describe,
)
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_demand import (
    PlanInputError, _count, _flag, _names, _parse_demand, _text)
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_output import _build
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_search import (
    EXACT_LIMIT, _Budget, _exact, _greedy, _NodeModel, _read_fleet, _TooBig)

__all__ = [
    "EXACT_LIMIT",
    "plan_fleet",
]

# config_label_prefix + "-" + 10 hex digits is a Kubernetes label value (63 characters at most) and a config name.
_LABEL_PREFIX = checks.pattern(r"[A-Za-z0-9][-_.A-Za-z0-9]{0,51}")


def plan_fleet(fleet: Mapping[str, Any], demand: Any, policy: Mapping[str, Any] | None = None, in_use: Any = None,
               node_groups: Any = None, exact_limit: int = EXACT_LIMIT, unresolved: Sequence[Any] | None = None,
               whole_pending: int = 0, config_label_prefix: str = "gpuops-plan") -> dict[str, Any]:
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

    plan = _build(models, dims, choice_by_node, method, skipped, unresolved, whole_policy,
                  whole_pending, whole_free_now, config_label_prefix, exact_limit)
    _check_output(plan, nodes)
    return plan


def _check_output(plan, nodes):
    """Each node's layouts and mig-parted config, read as mig_config and mig_mode read them and
    resolved on the node's GPUs, and its config label checked as a label value. A plan the modules
    would refuse is the planner's bug: PlanInputError here, rather than a plan that fails on the
    node."""
    valid = set()     # (geometry, target) proven; the geometries live in ``nodes`` meanwhile
    for name, gpus in nodes.items():
        out = plan["nodes"][name]
        host = [migparted.HostGpu(index=g.index, pci_device_id=g.pci_device_id or 0,
                                  mig_capable=True, name=g.name) for g in gpus]
        geometries = dict((g.index, g.geometry) for g in gpus)
        label = out["config_label"]
        try:
            if not checks.whole(checks.LABEL_VALUE, label):
                raise ConfigError("config label %s is not a Kubernetes label value"
                                  % describe(label))
            if out["layouts"]:  # a node without MIG-capable GPUs is planned nothing to apply
                entries = migparted.entries_from_layouts(out["layouts"],
                                                         origin="%s layouts" % name)
                check_applies(entries, host, geometries, name, valid)
            if name in plan["mig_parted"]:
                config = migparted.load_config(plan["mig_parted"][name],
                                               origin="%s mig_parted" % name)
                check_applies(config.select(label), host, geometries, name, valid)
        except ConfigError as e:
            raise PlanInputError("the plan for %s is one mig_config would refuse, so nothing "
                                 "is planned (a bug of the planner; please report it with the "
                                 "facts): %s" % (name, e))


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
    if not checks.whole(_LABEL_PREFIX, config_label_prefix):
        raise PlanInputError("config_label_prefix must be 1 to 52 letters, digits, '-', '_' or '.', starting with a "
                             "letter or digit (it begins a Kubernetes label value), got %s"
                             % describe(config_label_prefix))
