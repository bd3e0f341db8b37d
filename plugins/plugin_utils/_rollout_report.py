# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The rollout's per-node report and the fleet summary table site.yml prints and hands to AWX."""

from __future__ import annotations

import datetime
from typing import Any, Iterable, Mapping, Sequence

COLUMNS = ("node", "outcome", "path", "mode changes", "destroyed", "created", "evicted", "reboots", "seconds")
KEYS = ("node", "outcome", "path", "mode_changes", "destroyed", "created", "evicted", "reboots", "seconds")


def node_report(decision: Mapping[str, Any] | None, mode: Mapping[str, Any] | None = None,
                geometry: Mapping[str, Any] | None = None, rebooted: bool = False, started: Any = None,
                outcome: str | None = None, evicted: Sequence[Mapping[str, Any]] | None = None,
                left: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One node's row: outcome converged/changed/failed/repaired, GPUs whose mode changed, devices destroyed and
    created, pods evicted (evicted: the drain's pods, each {"pod", "reasons"}; None: no drain ran).

    left: the pods to evict still on the node after the drain (Pod objects; None: not checked).
    Only pods seen gone count as evicted: after a failed drain the others are listed as still on
    the node (not_evicted, a key only then), every one of them when the drain failed before the
    check."""
    plans = [g.get("plan") or {} for g in (geometry or {}).get("gpus") or []]
    changed_modes = [g for g in (mode or {}).get("gpus") or [] if g.get("changed")]
    still = []
    if evicted is not None and (left or (left is None and outcome == "failed")):
        names = None if left is None else set(
            "%s/%s" % ((p.get("metadata") or {}).get("namespace"),
                       (p.get("metadata") or {}).get("name")) for p in left)
        still = [e.get("pod") for e in evicted if names is None or e.get("pod") in names]
        evicted = [e for e in evicted if e.get("pod") not in still]
    row = {
        "outcome": outcome or ("converged" if (decision or {}).get("path") == "converged" else "changed"),
        "path": (decision or {}).get("path"),
        "mode_changes": len(changed_modes),
        "destroyed": sum(p.get("destroyed_devices", 0) for p in plans),
        "created": sum(p.get("created_devices", 0) for p in plans),
        "evicted": None if evicted is None else len(evicted),
        "evicted_pods": [{"pod": e.get("pod"), "reasons": sorted({r.get("reason") for r in e.get("reasons") or []})}
                         for e in evicted or ()],
        "reboots": 1 if rebooted else 0,
        "seconds": _seconds_since(started),
    }
    if still:
        row["not_evicted"] = still
    return row


def _seconds_since(started):
    if not started:
        return None
    try:
        begin = datetime.datetime.fromisoformat(str(started))
    except ValueError:
        return None
    now = datetime.datetime.now(begin.tzinfo) if begin.tzinfo else datetime.datetime.now()
    return round((now - begin).total_seconds(), 1)


PREVIEW_FAILURE_POLICIES = ("stop", "skip")


def preview_failure(message: str | None, policy: str | None = "stop", node: str = "",
                    step: str = "") -> dict[str, Any]:
    """What a node refused in site.yml's preview means for the rollout (gpuops_mig_preview_failure).

    stop: the rollout stops before any node changes ({"skip": False}); skip: the node is left untouched,
    the others go on, and the summary lists it with the reason ({"skip": True, "reason": message}).
    "message" says it for the person: the node, the step that failed, why, and the other choice."""
    policy = str(policy if policy is not None else "stop").strip().lower() or "stop"
    if policy not in PREVIEW_FAILURE_POLICIES:
        raise ValueError("gpuops_mig_preview_failure must be stop or skip, not '%s'" % policy)
    reason = " ".join(str(message or "").split())
    where = " at '%s'" % step if step else ""
    why = reason.rstrip(".") or "no message"
    said = "%s: its preview failed%s: %s." % (node or "a node", where, why)
    if policy == "skip":
        said += " It is left as it is; the other nodes go on."
    else:
        said += (" No node was changed: the rollout stops here. To roll out the other nodes and"
                 " leave the nodes whose preview fails as they are, set"
                 " gpuops_mig_preview_failure: skip.")
    return {"skip": policy == "skip", "reason": reason or "the preview failed", "message": said}


# Converged nodes listed one by one up to this many; beyond it one line names them, so a converged re-run of a
# large fleet fits a screen.
LIST_CONVERGED = 10
NAMES_SHOWN = 20


def _names(hosts):
    """Host names for one line: the first NAMES_SHOWN, then how many more."""
    hosts = list(hosts)
    shown = ", ".join(hosts[:NAMES_SHOWN])
    return shown + (" and %d more" % (len(hosts) - NAMES_SHOWN) if len(hosts) > NAMES_SHOWN else "")


def preview_lines(hosts: Sequence[str], messages: Mapping[str, str], changing: Iterable[str] | None,
                  skipped: Iterable[str] | None = ()) -> list[str]:
    """What site.yml says after the preview: each node's message (converged nodes folded into one line
    past LIST_CONVERGED), then the count of nodes to change, converged and skipped.

    hosts: the nodes previewed, in order; messages: {host: the preview's one-line message}; changing: the
    nodes that change; skipped: the nodes the preview refused with gpuops_mig_preview_failure=skip."""
    changing, skipped = list(changing or []), list(skipped or [])
    converged = [h for h in hosts if h not in changing and h not in skipped]
    lines = [messages.get(h) or h for h in hosts if len(converged) <= LIST_CONVERGED or h not in converged]
    if len(converged) > LIST_CONVERGED:
        lines.append("%d node(s) already converged: %s." % (len(converged), _names(converged)))
    total = "%d node(s) to change (%s), %d already converged." % (
        len(changing), ", ".join(changing) or "none", len(converged))
    if skipped:
        total += " %d skipped, left as they are (%s)." % (len(skipped), ", ".join(skipped))
    return lines + [total]


def fleet_summary(reports: Mapping[str, Mapping[str, Any] | None], hosts: Sequence[str],
                  decisions: Mapping[str, Any] | None = None,
                  skipped: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rows for every host, and totals.

    reports: {host: node_report() or None}; decisions: {host: the preview's decision or None}; skipped:
    {host: preview_failure() for a node the preview refused, or {}} (gpuops_mig_preview_failure=skip; a
    failure that stopped the rollout is no skip). A converged host with no
    report was finished by its preview alone; any other host without one did not get its turn (the rollout
    stopped before its batch) or failed before the role could record it."""
    rows = []
    for host in sorted(hosts):
        report = reports.get(host) or None         # {} or None: no report
        decision = (decisions or {}).get(host)
        failure = (skipped or {}).get(host) or {}
        reason = failure.get("reason") if failure.get("skip") else None
        if report is None and (decision or {}).get("path") == "converged":
            report = node_report(decision)
        missing = {"outcome": "skipped" if reason else "not done", "path": (decision or {}).get("path"),
                   "mode_changes": None, "destroyed": None, "created": None, "evicted": None, "reboots": None,
                   "seconds": None}
        row = dict(node=host, **(report or missing))
        if reason and not report:
            row["reason"] = reason
        rows.append(row)
    totals = {}
    for row in rows:
        totals[row["outcome"]] = totals.get(row["outcome"], 0) + 1
    reasons = ["%s skipped: %s" % (row["node"], row["reason"]) for row in rows if row.get("reason")]
    reasons += ["%s evicted %s" % (row["node"], ", ".join("%s (%s)" % (e["pod"], ", ".join(e["reasons"]))
                                                          for e in row["evicted_pods"]))
                for row in rows if row.get("evicted_pods")]
    reasons += ["%s: not evicted, still on the node (the drain did not finish): %s"
                % (row["node"], ", ".join(row["not_evicted"]))
                for row in rows if row.get("not_evicted")]
    converged = [row["node"] for row in rows if row["outcome"] == "converged"]
    if len(converged) > LIST_CONVERGED:   # the table lists what happened; the converged nodes in one line
        shown = table([row for row in rows if row["outcome"] != "converged"])
        shown.append("%d node(s) converged, nothing to do: %s" % (len(converged), _names(converged)))
    else:
        shown = table(rows)
    return {"nodes": rows, "totals": totals, "table": shown + reasons}


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A fixed-width text table of the rows."""
    cells = [list(COLUMNS)] + [["-" if r.get(k) is None else str(r.get(k)) for k in KEYS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(KEYS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
