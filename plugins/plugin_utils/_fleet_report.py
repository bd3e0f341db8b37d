# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The read-only fleet report facts.yml writes: every host's GPUs and MIG layout (from gpuops.mig.mig_facts),
the layout declared for it and its Kubernetes node's MIG labels; and the text table laid out from it."""

from __future__ import annotations

from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    LABEL_CONFIG as CONFIG_LABEL,
    LABEL_STATE as STATE_LABEL,
)
from ansible_collections.gpuops.mig.plugins.plugin_utils import _layout_source as layout_source
from ansible_collections.gpuops.mig.plugins.module_utils._node_status import condition_of
from ansible_collections.gpuops.mig.plugins.plugin_utils._mig_ready import ready_cell

# Where the declared layout comes from, by the rollout's own rules (plugin_utils/_layout_source.py): a plan from
# plan.yml names the node's layout and wins, then mig_node_config_name, then the node's nvidia.com/mig.config
# label (mig_node_config_from_label, not with inline layouts), then inline layouts without a name ('custom').
SOURCE_PLAN = "plan"
SOURCE_INVENTORY = "inventory"
SOURCE_LABEL = "node label"
SOURCE_NONE = "none"

NO_FACTS = "no facts (the host failed or is unreachable)"

HEADER = ("HOST", "GPU", "MODEL", "MIG", "MIG DEVICES", "DECLARED", "FROM", "STATE")
# The first columns keep the widths the report has always had; wider content widens them.
MIN_WIDTHS = (16, 4, 24, 10, 0, 0, 0, 0)
# One space between the first columns, as the report has always had; two where columns hold spaces themselves.
SEPARATORS = (" ", " ", " ", " ", "  ", "  ", "  ")
NOT_APPLICABLE = "-"


class ReportError(Exception):
    """An input the report cannot use (the filter turns it into AnsibleFilterError)."""


def _mapping(value, what):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReportError("%s must be a dict, not %s" % (what, type(value).__name__))
    return value


def _flag(value, default):
    """A switch that may still be a string (a survey answer, -e key=value)."""
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off", "n", "f")
    return bool(value)


def gpu_entry(gpu: Mapping[str, Any]) -> dict[str, Any]:
    """The report's view of one GPU of gpuops.mig.mig_facts."""
    return {
        "index": gpu.get("index"),
        "name": gpu.get("name"),
        "uuid": gpu.get("uuid"),
        "pci_bus_id": gpu.get("pci_bus_id"),
        "mig_capable": gpu.get("mig_capable"),
        "mig_mode": gpu.get("mig_mode"),
        "mig_devices": gpu.get("mig_devices") or {},
        "gpu_instances": gpu.get("gpu_instances") or [],
    }


def node_index(nodes: Any) -> dict[str, dict[str, Any]] | None:
    """{name: Node} from the Node objects kubernetes.core.k8s_info returned; None stays None (not read)."""
    if nodes is None:
        return None
    if not isinstance(nodes, (list, tuple)):
        raise ReportError("nodes must be a list of Node objects, not %s" % type(nodes).__name__)
    index = {}
    for node in nodes:
        name = ((node or {}).get("metadata") or {}).get("name")
        if name:
            index[name] = node
    return index


def kubernetes_view(host: str, declared: Mapping[str, Any], nodes_by_name: Mapping[str, Mapping[str, Any]] | None
                    ) -> dict[str, Any] | None:
    """The host's Kubernetes node: None when it is not looked up (Kubernetes off for the host, or the nodes were
    not read); else C(node) (its name), C(found), and its C(mig_config) and C(mig_config_state) labels (null when
    absent)."""
    if nodes_by_name is None or not _flag(declared.get("kubernetes"), True):
        return None
    name = str(declared.get("k8s_node_name") or host)
    node = nodes_by_name.get(name)
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    view = {
        "node": name,
        "found": node is not None,
        "mig_config": labels.get(CONFIG_LABEL),
        "mig_config_state": labels.get(STATE_LABEL),
    }
    if condition_of(node) is not None:  # the MIG-ready gate's condition (docs/autoscaled-nodes.md)
        view["mig_ready"] = ready_cell(node)
    return view


def declared_layout(host: str, declared: Mapping[str, Any], plan: Any, kubernetes: Mapping[str, Any] | None
                    ) -> dict[str, Any]:
    """The config name the rollout would apply to the host, and where it comes from:
    {"layout": name or None, "source": plan | inventory | node label | none}."""
    planned = _mapping(_mapping(plan, "gpuops_mig_plan").get("nodes"), "gpuops_mig_plan.nodes")
    entry = planned.get(host)
    settings = {
        "plan": _mapping(entry, "gpuops_mig_plan.nodes[%s]" % host) if entry is not None else None,
        "layouts": True if _flag(declared.get("layouts"), False) else None,
        "config_name": str(declared.get("config_name") or ""),
        "config_from_label": _flag(declared.get("config_from_label"), True),
    }
    labels = {CONFIG_LABEL: (kubernetes or {}).get("mig_config")}
    # Not strict: a host that declares nothing is reported, not refused (the rollout refuses it).
    found = layout_source.layout_source(host, settings, labels, strict=False)
    if found["label"] is None:
        return {"layout": None, "source": SOURCE_NONE}
    if found["kind"] == layout_source.PLAN:
        source = SOURCE_PLAN
    elif found["name_from"] == layout_source.NAME_FROM_LABEL:
        source = SOURCE_LABEL
    else:
        source = SOURCE_INVENTORY
    return {"layout": str(found["label"]), "source": source}


def host_entry(host: str, facts: Mapping[str, Any] | None, declared: Any = None, plan: Any = None,
               nodes_by_name: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """One host of the report: C(driver), C(simulated) and C(gpus), or C(error) when the host has no facts;
    always C(declared) and C(kubernetes)."""
    declared = _mapping(declared, "the declared settings of %s" % host)
    if facts is None:
        entry = {"error": NO_FACTS}
    else:
        facts = _mapping(facts, "the gpuops_mig facts of %s" % host)
        entry = {
            "driver": (facts.get("driver") or {}).get("version"),
            "simulated": facts.get("simulated"),
            "gpus": [gpu_entry(gpu) for gpu in facts.get("gpus") or []],
        }
    kubernetes = kubernetes_view(host, declared, nodes_by_name)
    entry["declared"] = declared_layout(host, declared, plan, kubernetes)
    entry["kubernetes"] = kubernetes
    return entry


def fleet_report(facts_by_host: Any, declared: Any = None, nodes: Any = None, plan: Any = None) -> dict[str, Any]:
    """The fleet report, {"hosts": {host: entry}}.

    ``facts_by_host``: {host: the host's gpuops_mig facts, or None when it has none (failed, unreachable)}.
    ``declared``: {host: {config_name, layouts (bool: mig_node_layouts given), config_from_label (bool),
    kubernetes (bool), k8s_node_name}}; a host left out gets the role defaults.
    ``nodes``: the Node objects of the cluster, or None when Kubernetes was not read.
    ``plan``: gpuops_mig_plan (plan.yml's vars file), or None.
    """
    facts_by_host = _mapping(facts_by_host, "the facts by host")
    declared = _mapping(declared, "the declared settings by host")
    nodes_by_name = node_index(nodes)
    return {"hosts": dict((host, host_entry(host, facts_by_host[host], declared.get(host), plan, nodes_by_name))
                          for host in sorted(facts_by_host))}


def mig_mode_text(mode: Mapping[str, Any] | None) -> str:
    """'n/a' (not MIG-capable), 'enabled', or 'disabled (pending enabled)' while a change waits for a reset."""
    if mode is None:
        return "n/a"
    current, pending = mode.get("current"), mode.get("pending")
    return str(current) if current == pending or pending is None else "%s (pending %s)" % (current, pending)


def devices_text(devices: Mapping[str, int] | None) -> str:
    """'1g.10gb x2, 3g.40gb x1', or '-' for none."""
    return ", ".join("%s x%s" % (name, count) for name, count in sorted((devices or {}).items())) or NOT_APPLICABLE


def node_cells(entry: Mapping[str, Any]) -> list[str]:
    """The DECLARED, FROM and STATE cells of a host."""
    declared = entry.get("declared") or {}
    kubernetes = entry.get("kubernetes")
    if kubernetes is None:
        state = NOT_APPLICABLE
    elif not kubernetes.get("found"):
        state = "no node %s" % kubernetes.get("node")
    else:
        state = kubernetes.get("mig_config_state") or "unset"
        if kubernetes.get("mig_ready"):
            state += ", MIG-ready " + kubernetes["mig_ready"]
    return [declared.get("layout") or NOT_APPLICABLE, declared.get("source") or SOURCE_NONE, state]


def table_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The report as rows of cells: one row per GPU (the host and node cells on its first), one row spanning the
    GPU columns for a host without facts or without GPUs. A spanning row is (host, text, declared, from, state)."""
    rows = []
    for host, entry in sorted(_mapping(report, "the report").get("hosts", {}).items()):
        node = node_cells(entry)
        if "error" in entry:
            rows.append([host, entry["error"]] + node)
            continue
        gpus = entry.get("gpus") or []
        if not gpus:
            rows.append([host, "no GPUs"] + node)
            continue
        for position, gpu in enumerate(gpus):
            first = position == 0
            rows.append([host if first else "", str(gpu.get("index")), str(gpu.get("name")),
                         mig_mode_text(gpu.get("mig_mode")), devices_text(gpu.get("mig_devices"))]
                        + (node if first else ["", "", ""]))
    return rows


def table(report: Mapping[str, Any]) -> list[str]:
    """The report as lines of a fixed-width text table (header first)."""
    rows = table_rows(report)
    # A spanning row's cells, placed in their columns (None under the span) for the widths.
    placed = [list(HEADER)] + [r if len(r) == len(HEADER) else [r[0], None, None, None, None] + r[2:] for r in rows]
    widths = [max([MIN_WIDTHS[i]] + [len(r[i]) for r in placed if r[i] is not None]) for i in range(len(HEADER))]
    # A spanning text (an error) takes the GPU to MIG DEVICES columns; MIG DEVICES widens if it needs more.
    for row in rows:
        if len(row) != len(HEADER):
            widths[4] = max(widths[4], len(row[1]) - sum(widths[1:4]) - len("".join(SEPARATORS[1:4])))
    span = sum(widths[1:5]) + len("".join(SEPARATORS[1:4]))
    lines = []
    for row in [list(HEADER)] + rows:
        if len(row) == len(HEADER):
            cells = [cell.ljust(width) for cell, width in zip(row, widths)]
            seps = SEPARATORS
        else:
            cells = [row[0].ljust(widths[0]), row[1].ljust(span)] + [c.ljust(w) for c, w in zip(row[2:], widths[5:])]
            seps = SEPARATORS[:1] + SEPARATORS[4:]
        lines.append("".join(cell + sep for cell, sep in zip(cells, seps + ("",))).rstrip())
    return lines


def report_and_table(facts_by_host: Any, declared: Any = None, nodes: Any = None,
                     plan: Any = None) -> dict[str, Any]:
    """{"report": fleet_report(...), "table": table(report)}: the JSON and the text of facts.yml."""
    report = fleet_report(facts_by_host, declared, nodes, plan)
    return {"report": report, "table": table(report)}
