# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""One round of the demand loop (playbooks/demand_round.yml, docs/dynamic.md): which planned nodes may
change now, which are held for a person, and what the round reports.

- ``settings``: the round's variables (``gpuops_mig_round_*``), checked and with their defaults,
  before the round takes its lease; the report shows them, and the apply takes its batch size from
  them (a play's ``serial`` is not templated from inventory variables).
- ``gate``: whether the cooldown since the last change a person approved still holds.
- ``select``: from the plan (playbooks/plan.yml's JSON), the pods and the Nodes, the nodes applied
  and the ones held, and why. A change that evicts no pod and changes no MIG mode only destroys
  free devices: it is applied at once (``fast``), all such nodes together, bounded by the demand
  alone. A change that evicts pods or changes a MIG mode is held until a person approves its
  plan's ``config_label``; approved, it waits out the cooldown and at most ``max_nodes`` of them
  change in a round, ``serial`` at a time.
- ``plan_policy``: the planner's policy for the round: the nodes ``select`` would hold whatever
  their plan (their last change failed, or an earlier round did not finish them) are not offered to
  the planner, so the demand goes to nodes the round may change.
- ``record``: the state the next round reads (when a round last applied an approved change, which
  changes never finished). Written before the apply (its nodes unfinished) and again after it
  (finished), so a round that dies half-way leaves its nodes held.
- ``round_record``: what the round's opening and closing each need at once (the filter
  ``mig_round_record``): the state ``record`` writes, the lines ``outcome_lines`` prints and, at
  the closing, the deferred nodes ``deferred_nodes`` finds in the rollout's reports.
- ``deferral``: whether a node's failed change is left for the next round rather than for a person:
  in a round, a refusal before any change whose only cause is a pod bound after the plan to a
  device the plan destroys. ``deferred_nodes`` collects those nodes from the rollout's report rows.

Eviction: a plan that lists ``evicted_pods`` per node (planned with the nodes' pod maps, which
keeps every device a pod holds: plugin_utils/_demand_allocations.py) is taken at its word, so a
node running GPU pods on devices its change keeps is applied. Without approval it is applied with
``mig_node_drain: none`` (``drain``; None: as the inventory says), so a pod that got a device the
change destroys after the plan makes mig_config refuse the change before touching the GPUs, never
an eviction; the node is then deferred (``deferral``). Without a pod map (the plan's
``pod_map_unknown`` says why) a node change drains the node's GPU pods, so a node running any is
held.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils._input import count
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import describe

FAILED_STATE_LABEL = "nvidia.com/mig.config.state"
# The group demand_round.yml puts the nodes it applies in (site.yml's gpuops_mig_hosts in a round).
APPLY_GROUP = "gpuops_mig_round_apply"
DEFERRED = "deferred"
_FINISHED = ("Succeeded", "Failed")
_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


class RoundError(ValueError):
    """Round input that cannot be used; nothing is applied."""


def _mapping(value, what):
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RoundError("%s must be a mapping, got %s" % (what, describe(value)))
    return value


def _seconds(value, what):
    """A whole number: an int, or ASCII digits as text (the rulebook renders its variables as
    text); " 5", "5\\n", "\\uff15" or "5.0" is no number of seconds."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise RoundError("%s must not be negative, got %s" % (what, describe(value)))
    number = count(value)
    if number is None:
        raise RoundError("%s must be a whole number of seconds, got %s" % (what, describe(value)))
    return number


# setting: (variable, default, kind). "count": a whole number >= 0; "positive": >= 1; "flag": true
# or false (the rulebook renders its variables as text); "batch": a number >= 1 or a percentage;
# "name": text.
SETTINGS = {
    "max_nodes": ("gpuops_mig_round_max_nodes", 1, "count"),
    "cooldown": ("gpuops_mig_round_cooldown", 300, "count"),
    "dry_run": ("gpuops_mig_round_dry_run", False, "flag"),
    "serial": ("gpuops_mig_round_serial", 1, "batch"),
    "lease_duration": ("gpuops_mig_round_lease_duration", 900, "positive"),
    "lease_wait": ("gpuops_mig_round_lease_wait", 0, "count"),
    "lease_namespace": ("gpuops_mig_round_lease_namespace", "default", "name"),
    "deploy_device_plugin": ("gpuops_mig_round_deploy_device_plugin", False, "flag"),
}
# Round variables that are not settings (the round directory, the event), and the round's artifact.
_OTHER_VARIABLES = ("gpuops_mig_round_dir", "gpuops_mig_round_event", "gpuops_mig_round")
_FLAGS = {"true": True, "yes": True, "on": True, "1": True,
          "false": False, "no": False, "off": False, "0": False}


def _setting(variable, value, kind):
    if kind in ("count", "positive"):
        number = _seconds(value, variable)
        if kind == "positive" and number < 1:
            raise RoundError("%s must be at least 1, got %s" % (variable, describe(value)))
        return number
    if kind == "flag":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _FLAGS:
            return _FLAGS[value.strip().lower()]
        raise RoundError("%s must be true or false, got %s" % (variable, describe(value)))
    if kind == "batch":
        text = str(value).strip() if not isinstance(value, bool) else ""
        percent = count(text[:-1], 3) if text.endswith("%") else None
        if percent is not None and 1 <= percent <= 100:
            return text
        number = count(text)
        if number is not None and number >= 1:
            return number
        raise RoundError("%s must be a number of nodes (at least 1) or a percentage, got %s"
                         % (variable, describe(value)))
    if not isinstance(value, str) or not value.strip():
        raise RoundError("%s must be a name, got %s" % (variable, describe(value)))
    return value.strip()


def settings(variables: Any) -> dict[str, Any]:
    """The round's settings from its variables ({gpuops_mig_round_*: value}, as the play sees them:
    extra vars from the rulebook, group_vars), checked, with the defaults of docs/dynamic.md for
    those unset (None or ''). A value of the wrong type or a negative number of seconds is refused
    naming the variable, and so is an unknown gpuops_mig_round_* variable (a misspelt setting would
    otherwise be ignored)."""
    variables = _mapping(variables, "the round's variables")
    known = set(v for v, dummy, dummy in SETTINGS.values()) | set(_OTHER_VARIABLES)
    unknown = sorted(str(name) for name in variables if str(name) not in known)
    if unknown:
        raise RoundError("unknown round variable(s) %s; the round's settings are %s"
                         % (", ".join(unknown),
                            ", ".join(v for v, dummy, dummy in SETTINGS.values())))
    out = {}
    for name, (variable, default, kind) in SETTINGS.items():
        value = variables.get(variable)
        out[name] = default if value is None or value == "" else _setting(variable, value, kind)
    return out


def _time(text):
    try:
        stamp = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.timezone.utc)


def _now(now):
    stamp = _time(now) if now is not None else datetime.datetime.now(datetime.timezone.utc)
    if stamp is None:
        raise RoundError("now must be an ISO 8601 time, got %s" % describe(now))
    return stamp


def gate(state: Any, cooldown_seconds: Any, now: Any = None) -> dict[str, Any]:
    """{wait_seconds, why}: how long the cooldown still holds the approved changes (those that
    evict pods or change a MIG mode; 0: they may change now). It runs from the end of the last
    round that applied one (``record``'s ``last_change``)."""
    state = _mapping(state, "the round state")
    cooldown = _seconds(cooldown_seconds, "gpuops_mig_round_cooldown")
    last = _time(state.get("last_change")) if state.get("last_change") else None
    if last is None or cooldown == 0:
        return {"wait_seconds": 0,
                "why": "no approved change within the cooldown (%d s)" % cooldown}
    left = cooldown - int((_now(now) - last).total_seconds())
    if left <= 0:
        return {"wait_seconds": 0, "why": "the last approved change was %d s ago (cooldown %d s)"
                                          % (cooldown - left, cooldown)}
    return {"wait_seconds": left, "why": "the last approved change ended at %s; cooldown %d s"
                                         % (state["last_change"], cooldown)}


def gpu_pods(pods: Any, node_name: str) -> list[str]:
    """namespace/name of the pods on ``node_name`` that use GPUs (what a drain of the node evicts)."""
    names = []
    for pod in pods or []:
        if not isinstance(pod, Mapping):
            continue
        spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
        if spec.get("nodeName") != node_name or status.get("phase") in _FINISHED:
            continue
        wanted = set()
        for container in spec.get("containers") or []:
            resources = (container or {}).get("resources") or {}
            for part in ("limits", "requests"):
                wanted.update(str(k) for k in (resources.get(part) or {}))
        if any(r == _GPU_RESOURCES[0] or r.startswith(_GPU_RESOURCES[1]) for r in wanted):
            names.append("%s/%s" % (meta.get("namespace") or "default", meta.get("name")))
    return sorted(names)


def _node_labels(nodes):
    out = {}
    for node in nodes or []:
        if isinstance(node, Mapping):
            meta = node.get("metadata") or {}
            out[meta.get("name")] = meta.get("labels") or {}
    return out


def _approved(approvals):
    approvals = _mapping(approvals, "the approvals")
    approved = _mapping(approvals.get("approved", approvals), "approved")
    for node, label in approved.items():
        if not isinstance(label, str):
            raise RoundError("approved[%s] must be the config_label of the plan approved, got %s"
                             % (node, describe(label)))
    return approved


def blocked(nodes: Any, state: Any) -> dict[str, list[str]]:
    """{node: [why, ...]} of the nodes a round holds whatever their plan: the Node's last change
    failed (nvidia.com/mig.config.state=failed), or an earlier round did not finish changing it."""
    state = _mapping(state, "the round state")
    unfinished = _mapping(state.get("unfinished"), "the round state's unfinished nodes")
    out = {}
    for name, labels in _node_labels(nodes).items():
        if labels.get(FAILED_STATE_LABEL) == "failed":
            out.setdefault(name, []).append(
                "the last change failed on this node (%s=failed): a person must look at it and "
                "clear the label" % FAILED_STATE_LABEL)
    for name in unfinished:
        out.setdefault(name, []).append(
            "round %s did not finish changing this node: a person must check it and remove it "
            "from the state file's unfinished nodes" % unfinished[name])
    return out


def plan_policy(policy: Any, hosts: Any, nodes: Any = None, state: Any = None) -> dict[str, Any]:
    """The planner's policy for a round: gpuops_mig_plan_policy with the nodes the round would hold
    whatever their plan (``blocked``) taken out of the nodes it may touch (all ``hosts`` when the
    policy names none), so the planner gives the demand to nodes the round can change."""
    policy = dict(_mapping(policy, "gpuops_mig_plan_policy"))
    held = blocked(nodes, state)
    if not held:
        return policy
    touchable = policy.get("nodes")
    if touchable is None:
        touchable = hosts or []
    if not isinstance(touchable, (list, tuple)):
        return policy   # the planner says what is wrong with it
    policy["nodes"] = [n for n in touchable if n not in held]
    return policy


def select(plan: Any, pods: Any = None, nodes: Any = None, settings: Any = None, approvals: Any = None,
           state: Any = None, now: Any = None) -> dict[str, Any]:
    """The round's decision for every node the plan touches.

    ``plan`` the plan (plan.yml's JSON, or mig_plan's ``plan``); ``pods`` and ``nodes`` the cluster's Pod
    and Node manifests (None without Kubernetes); ``settings`` {max_nodes, cooldown, serial, dry_run,
    k8s_node_names}; ``approvals`` {node: config_label} (or {"approved": {...}}); ``state`` what
    ``record`` wrote last. Returns {apply, fast, held, planned, nodes: {node: {decision, fast,
    reasons, ...}}, cooldown (``gate``), serial (the apply's batch size: every node at once when
    all of them are fast), dry_run, max_nodes, report}.
    """
    plan = _mapping(plan, "the plan")
    planned_nodes = _mapping(plan.get("nodes"), "the plan's nodes")
    settings = _mapping(settings, "the round settings")
    max_nodes = _seconds(settings.get("max_nodes", 1), "gpuops_mig_round_max_nodes")
    cooldown = gate(state, settings.get("cooldown", 0), now)
    dry_run = settings.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise RoundError("gpuops_mig_round_dry_run must be true or false, got %s" % describe(dry_run))
    k8s_names = _mapping(settings.get("k8s_node_names"), "k8s_node_names")
    approved = _approved(approvals)
    state = _mapping(state, "the round state")
    held = blocked(nodes, state)

    decisions = {}
    candidates = []
    for name in sorted(planned_nodes):
        entry = _mapping(planned_nodes[name], "the plan's node %s" % name)
        if not entry.get("touched"):
            continue
        k8s_name = k8s_names.get(name, name)
        gpus = entry.get("gpus") or []
        mode_changes = [g.get("index") for g in gpus
                        if isinstance(g, Mapping) and bool(g.get("mig_enabled")) != bool(g.get("mig_enabled_before"))]
        pod_map = isinstance(entry.get("evicted_pods"), list)
        if pod_map:
            evicts, evicts_from = sorted(str(p) for p in entry["evicted_pods"]), "the plan"
            why = dict((e.get("pod"), e.get("reason")) for e in entry.get("evictions") or [] if isinstance(e, Mapping))
            if any(why.get(p) for p in evicts):
                evicts_from = "the plan: %s" % ", ".join(sorted(set(why[p] for p in evicts if why.get(p))))
        else:
            evicts, evicts_from = gpu_pods(pods, k8s_name), "the node's GPU pods (the node is drained)"
            if entry.get("pod_map_unknown"):
                evicts_from = ("the node's GPU pods: the node is drained, since which pod holds which MIG device "
                               "is unknown: %s" % entry["pod_map_unknown"])
        reasons = []
        blockers = [why for key in dict.fromkeys((k8s_name, name)) for why in held.get(key, [])]
        if mode_changes:
            reasons.append("turns MIG on for GPU %s (a MIG mode change: a GPU reset or a reboot)"
                           % ", ".join(str(i) for i in mode_changes))
        if evicts:
            reasons.append("evicts %d running pod(s) (%s): %s" % (len(evicts), evicts_from, ", ".join(evicts)))
        label = entry.get("config_label")
        is_approved = bool(label) and approved.get(name) == label
        decision = {
            "config_label": label,
            "destroyed": sum(int(g.get("destroyed") or 0) for g in gpus if isinstance(g, Mapping)),
            "created": sum(int(g.get("created") or 0) for g in gpus if isinstance(g, Mapping)),
            "mode_changes": mode_changes,
            "evicts": evicts,
            "supplies": entry.get("supplies") or {},
            "approved": is_approved,
            # Applied without approval: the plan's word that it evicts nobody is enforced, not
            # assumed.
            "drain": "none" if pod_map and not is_approved else None,
            "reasons": blockers + reasons,
            # Destroys only free devices: applied without a person, the cooldown or max_nodes.
            "fast": not blockers and not reasons,
        }
        decisions[name] = decision
        if blockers:
            decision["decision"] = "held"
        elif reasons and not is_approved:
            decision["decision"] = "held"
            decision["reasons"].append("approve it: add %s: %s to the approval file" % (name, label))
        else:
            if reasons:
                decision["reasons"].append("approved by a person (config_label %s)" % label)
            candidates.append(name)

    # Approved changes: those that supply the most demand first, within the cooldown and max_nodes.
    candidates.sort(key=lambda n: (-sum(decisions[n]["supplies"].values()), n))
    apply = []
    slow = 0
    for name in candidates:
        if not decisions[name]["fast"] and cooldown["wait_seconds"] > 0:
            decisions[name]["decision"] = "held"
            decisions[name]["reasons"].append(
                "the cooldown holds changes that evict pods or change a MIG mode for %d s more "
                "(%s; gpuops_mig_round_cooldown); a round after that takes it"
                % (cooldown["wait_seconds"], cooldown["why"]))
            continue
        if not decisions[name]["fast"] and slow >= max_nodes:
            decisions[name]["decision"] = "held"
            decisions[name]["reasons"].append(
                "over this round's limit of %d change(s) that evict pods or change a MIG mode "
                "(gpuops_mig_round_max_nodes); the next round takes it" % max_nodes)
            continue
        slow += not decisions[name]["fast"]
        if dry_run:
            decisions[name]["decision"] = "dry-run"
            decisions[name]["reasons"].append("would be applied (gpuops_mig_round_dry_run)")
            apply.append(name)
        else:
            decisions[name]["decision"] = "apply"
            apply.append(name)
    report = plan.get("report") or {}
    return {
        "apply": [] if dry_run else sorted(apply),
        "fast": [] if dry_run else sorted(n for n in apply if decisions[n]["fast"]),
        "would_apply": sorted(apply) if dry_run else [],
        "cooldown": cooldown,
        # Nodes that evict nobody change together; approved ones ``serial`` at a time.
        "serial": settings.get("serial", 1) if slow else max(1, len(apply)),
        "held": sorted(n for n, d in decisions.items() if d["decision"] == "held"),
        "planned": sorted(decisions),
        "nodes": decisions,
        "dry_run": dry_run,
        "max_nodes": max_nodes,
        "asked": [{k: row.get(k) for k in ("request", "requested", "met", "unmet", "reason") if k in row}
                  for row in report.get("demand") or []],
        "unresolved": report.get("unresolved") or [],
        "approval_request": {n: decisions[n]["config_label"] for n in sorted(decisions)
                             if decisions[n]["decision"] == "held" and not decisions[n]["approved"]},
        "held_reasons": {n: decisions[n]["reasons"] for n in sorted(decisions) if decisions[n]["decision"] == "held"},
    }


def record(state: Any, round_id: str, selection: Mapping[str, Any], finished: bool,
           now: Any = None, failed: Any = None, deferred: Any = None) -> dict[str, Any]:
    """The state with this round in it: when a round last applied an approved change, and which
    changes did not finish.

    Before the apply ``finished`` is False: the round's nodes are unfinished, and stay so (held by the next
    rounds until a person removes them) if the apply never comes back. After it, True takes them out and
    stamps the end of an approved change (the cooldown runs from there; ``fast`` nodes are not
    counted): the playbook hands both calls the state the round read at its start, so the
    finishing call must not rely on the first one's stamp.
    ``failed``: the nodes whose change failed (the apply went on with the others): only they stay
    unfinished; a node the round never reached is not. ``deferred``: the nodes put back unchanged
    (``deferral``): finished, and no change for the cooldown.
    """
    state = dict(_mapping(state, "the round state"))
    selection = _mapping(selection, "the round's selection")
    unfinished = dict(_mapping(state.get("unfinished"), "the round state's unfinished nodes"))
    applied = list(selection.get("apply") or [])
    decisions = _mapping(selection.get("nodes"), "the round's nodes")
    # The cooldown spaces out approved changes only; one that destroys free devices does not count.
    slow = [n for n in applied if not _mapping(decisions.get(n), "a round node").get("fast")]
    failed = set(failed or ())
    stamp = _now(now).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name in applied:
        if finished and name not in failed:
            unfinished.pop(name, None)
        else:
            unfinished[name] = round_id
    if set(slow) - set(deferred or ()):
        state["last_change"] = stamp
    state.update(unfinished=unfinished, last_round=round_id, last_round_at=stamp)
    return state


def outcome_lines(selection: Mapping[str, Any], failed: Any = None,
                  deferred: Any = None) -> list[str]:
    """What the round prints: one line per planned node, the demand no GPU of the fleet can meet
    (naming who asks for it), then the totals. ``failed``: {node: why} of the nodes whose change
    failed; ``deferred``: {node: {pods, why}} of those put back unchanged for the next round
    (``deferred_nodes``)."""
    failed = _mapping(failed, "the failed nodes")
    deferred = _mapping(deferred, "the deferred nodes")
    lines = []
    for name in selection.get("planned") or []:
        entry = selection["nodes"][name]
        decision = ("failed" if name in failed else DEFERRED if name in deferred
                    else entry["decision"])
        reasons = list(entry["reasons"]) + ([str(failed[name])] if name in failed else [])
        if name in deferred and name not in failed:
            reasons.append(str(_mapping(deferred[name], "a deferred node").get("why") or DEFERRED))
        lines.append("%-20s %-8s destroys %d, creates %d%s" % (
            name, decision, entry["destroyed"], entry["created"],
            (": " + "; ".join(reasons)) if reasons else ""))
    for row in selection.get("unresolved") or []:
        if isinstance(row, Mapping):
            lines.append("not planned: %s x%s, %s; asked by %s" % (
                row.get("request"), row.get("count"),
                row.get("reason") or "no GPU of the fleet offers it",
                ", ".join(str(s) for s in row.get("sources") or []) or "?"))
    later = sorted(set(deferred) - set(failed))
    applied = len(selection.get("apply") or selection.get("would_apply") or [])
    applied -= len(failed) + len(later)
    lines.append("round: %d planned, %d applied%s, %d held%s%s" % (
        len(selection.get("planned") or []), applied,
        " (dry run: none changed)" if selection.get("dry_run") else "",
        len(selection.get("held") or []),
        ", %d failed (%s): held until a person clears them"
        % (len(failed), ", ".join(sorted(failed))) if failed else "",
        ", %d deferred (%s): planned again next round"
        % (len(later), ", ".join(later)) if later else ""))
    return lines


def deferral(result: Any, groups: Any, changed: Any = False, labels: Any = None,
             label_names: Any = ()) -> dict[str, Any]:
    """Whether a node's failed change is left for the next round (``deferred``) rather than failed.

    ``result``: the failed task's result; ``groups``: the node's groups (a round applies its nodes
    in APPLY_GROUP; a plain rollout never defers); ``changed``: whether anything on the node
    changed before (a mode change, a reboot, an eviction); ``labels``: the Node's labels before the
    change, of which ``label_names`` are put back as they were (None: removed). Deferred only when
    mig_config refused before any change and every refused GPU's only obstacle is MIG devices that
    pods hold (its ``refusals``, all ``allocated``): in a round the plan kept every device the
    node's pod map showed held, so those pods got their devices after the plan, and the next round
    plans the node with them in its map. Returns ``deferred``, ``pods`` (namespace/pod),
    ``devices`` (UUIDs), ``labels`` (the patch that puts them back) and ``why``."""
    result = result if isinstance(result, Mapping) else {}
    refusals = result.get("refusals")
    refusals = [r for r in (refusals if isinstance(refusals, list) else [])
                if isinstance(r, Mapping)]
    devices = [d for r in refusals for d in (r.get("devices") or []) if isinstance(d, Mapping)]
    # A holder is namespace/pod/container (a DRA claim's: namespace/pod): the pod is what is named.
    pods = sorted(set("/".join(str(pod).split("/")[:2])
                      for d in devices for pod in d.get("pods") or []))
    deferred = bool(
        APPLY_GROUP in (groups or ()) and refusals and pods and not changed
        and all(r.get("reason") == "allocated" for r in refusals)
        and not result.get("changed") and not result.get("failed_part_way"))
    labels = _mapping(labels, "the node's labels")
    out = {"deferred": deferred, "pods": pods, "devices": [d.get("uuid") for d in devices],
           "labels": dict((name, labels.get(name)) for name in label_names or ())}
    out["why"] = ("pod(s) %s got MIG device(s) %s after the plan, which destroys them: nothing "
                  "was changed, the node is put back as it was and planned again next round"
                  % (", ".join(pods), ", ".join(str(u) for u in out["devices"]))
                  if deferred else "")
    return out


def deferred_nodes(reports: Any) -> dict[str, Any]:
    """{node: {pods, why}} of the nodes whose change was deferred, from {node: the rollout's report
    row (mig_node_report) or None}."""
    out = {}
    for name, row in sorted(_mapping(reports, "the nodes' reports").items()):
        if isinstance(row, Mapping) and row.get("outcome") == DEFERRED:
            why = row.get("deferred") if isinstance(row.get("deferred"), Mapping) else {}
            out[name] = {"pods": list(why.get("pods") or []), "why": why.get("why") or DEFERRED}
    return out


def round_record(state: Any, round_id: str, selection: Mapping[str, Any], finished: bool,
                 failed: Any = None, reports: Any = None, now: Any = None) -> dict[str, Any]:
    """The round's record at its opening (``finished`` False) or its closing (True): ``state``,
    what ``record`` makes of the state the round read at its start; ``lines``, what
    ``outcome_lines`` prints; ``deferred``, ``deferred_nodes`` of ``reports`` ({node: the
    rollout's report row or None}; none before the apply). ``failed``: {node: why} of the nodes
    whose change failed. One call, so the state, the lines and the outcome agree on which nodes
    failed and which were deferred."""
    failed = _mapping(failed, "the failed nodes")
    deferred = deferred_nodes(reports)
    return {"state": record(state, round_id, selection, finished, now=now, failed=list(failed),
                            deferred=list(deferred)),
            "lines": outcome_lines(selection, failed, deferred),
            "deferred": deferred}
