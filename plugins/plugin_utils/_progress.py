# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the gpuops.mig.rollout stdout callback prints, decided here so it can be unit-tested: which
steps of the node workflow are worth a line, how a debug message becomes lines, and the closing tally.
Controller-side; no Ansible imports."""

from __future__ import annotations

import os
from typing import Any, Mapping

# The node workflow's steps, by the task file that runs them (roles/mig_node/tasks), as an operator
# names them. Files not listed (labels, reports, leases, reads) are bookkeeping and print nothing.
NODE_STEPS = {
    "takeover.yml": "take the node over from mig-manager",
    "drain.yml": "cordon and drain",
    "drive.yml": "cordon, drain and let mig-manager apply the layout",
    "clients_pause.yml": "pause the GPU clients",
    "mode.yml": "MIG mode",
    "reboot.yml": "reboot",
    "geometry.yml": "MIG geometry",
    "persist.yml": "boot-time restore",
    "clients_restore.yml": "restore the GPU clients",
    "device_plugin_restart.yml": "restart the device plugin",
    "validate.yml": "validate what the node advertises",
    "handoff.yml": "hand the node to its dynamic MIG partitioner",
    "take_back.yml": "take the node back from its dynamic MIG partitioner",
    "smoke_test.yml": "smoke workloads",
    "uncordon.yml": "uncordon",
}


def node_step(path: str | None) -> str | None:
    """The operator's name for the step a role task file runs, or None when it is not a step."""
    return NODE_STEPS.get(os.path.basename(path or ""))


def message_lines(msg: Any) -> list[str]:
    """A debug task's msg as lines: a list gives one line per item, a text one per line; empty lines go."""
    items = msg if isinstance(msg, (list, tuple)) else [msg]
    lines = []
    for item in items:
        lines.extend(line.rstrip() for line in str(item).splitlines())
    return [line for line in lines if line.strip()]


# The controller: site.yml's summary and lease plays run there; it is no node of the fleet.
CONTROLLER = "localhost"


def tally(per_host: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The closing lines from {host: {"ok", "changed", "failures", "unreachable", ...}} (Ansible's
    stats.summarize per host): one count line of the nodes (the controller counted only when it
    failed), then one line per host that failed or was unreachable."""
    failed = sorted(h for h, t in per_host.items() if t.get("failures"))
    unreachable = sorted(h for h, t in per_host.items() if t.get("unreachable"))
    nodes = [h for h in per_host if h != CONTROLLER]
    changed = [h for h in nodes if per_host[h].get("changed")]
    lines = ["%d node(s): %d changed, %d failed, %d unreachable" % (
        len(nodes), len(changed), len(failed), len(unreachable))]
    lines += ["  failed: %s" % host for host in failed]
    lines += ["  unreachable: %s" % host for host in unreachable]
    return lines


def failure_line(host: str, task: str, result: Mapping[str, Any]) -> str:
    """One line for a failed task: the host, the task and the module's message (else the result)."""
    message = result.get("msg") or result.get("stderr") or result.get("reason") or ""
    if not message and "results" in result:   # a loop: the first failed item's message
        message = next((r.get("msg", "") for r in result["results"] if isinstance(r, dict) and r.get("failed")), "")
    text = " ".join(str(message).split()) or "failed (no message; run with -v for the whole result)"
    return "FAILED %s: %s: %s" % (host, task, text)
