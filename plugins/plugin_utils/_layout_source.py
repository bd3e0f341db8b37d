# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Where a node's MIG layout comes from and the name the rollout gives it: one set of rules for the rollout
(gpuops.mig.mig_node_preview) and the fleet report of facts.yml (_fleet_report.py).

A plan from plan.yml for the node wins over every other source; else exactly one of mig_node_config,
mig_node_config_file, mig_node_layouts or mig_node_config_configmap, or, with none, the GPU Operator's ConfigMap.
The config name is mig_node_config_name, else the node's nvidia.com/mig.config label (mig_node_config_from_label;
never with inline layouts or a plan). The label of the layout is the plan's config label, else the config name,
else 'custom' for inline layouts, else the one name the config holds (label_from_config, once it is read).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import LABEL_CONFIG

__all__ = ["UNSET", "PLAN", "LAYOUTS", "CONFIGMAP", "NAME_FROM_SETTING", "NAME_FROM_LABEL",
           "sources_of", "check_one_source", "layout_source", "label_from_config"]

# What counts as "not set" for a setting (the roles' defaults are empty strings and lists).
UNSET = (None, "", [], {})

PLAN = "gpuops_mig_plan"
LAYOUTS = "mig_node_layouts"
# The GPU Operator's ConfigMap: named by mig_node_config_configmap, or found through its ClusterPolicy.
CONFIGMAP = "configmap"
# The role variables each source comes from (keys of the settings), in the order messages name them.
SOURCES = (("config", "mig_node_config"), ("config_file", "mig_node_config_file"),
           ("layouts", LAYOUTS), ("configmap", "mig_node_config_configmap"))
NAME_FROM_SETTING = "mig_node_config_name"
NAME_FROM_LABEL = "node label"

_ONE_OF = ("declare the MIG layout with exactly one of mig_node_config (a mig-parted config), mig_node_config_file "
           "(a mig-parted file on the controller), mig_node_layouts (inline layouts) or mig_node_config_configmap "
           "(a ConfigMap in the cluster)")


def sources_of(settings: Mapping[str, Any]) -> list[str]:
    """The layout sources set, by role variable name (a plan for this node wins over all of them)."""
    if settings.get("plan") is not None:
        return [PLAN]
    return [name for key, name in SOURCES if settings.get(key) not in UNSET]


def check_one_source(host: str, sources: Sequence[str]) -> None:
    """RefusedError when more than one source is set (sources_of)."""
    if len(sources) > 1:
        raise RefusedError("%s: %s; found %s." % (host, _ONE_OF, ", ".join(sources)))


def layout_source(host: str, settings: Mapping[str, Any], node_labels: Mapping[str, str] | None = None,
                  operator_present: bool = False, strict: bool = True) -> dict[str, Any]:
    """Where the host's layout comes from and what names it.

    ``settings``: plan (the node's entry of gpuops_mig_plan.nodes, or None), config, config_file, layouts,
    configmap (values; UNSET ones count as not given), config_name, config_from_label. ``node_labels``: the
    labels of the host's Kubernetes node ({} or None outside Kubernetes). ``operator_present``: a GPU Operator
    whose ConfigMap can be used when no source is set.

    Returns {kind: PLAN, a source's role variable name, CONFIGMAP or None (strict=False and nothing set),
    config_name: the name (empty for none), name_from: NAME_FROM_SETTING, NAME_FROM_LABEL or None, label: the
    layout's label, or None when it is the name the config holds (label_from_config)}.
    Raises RefusedError for two sources, and (strict) for none."""
    sources = sources_of(settings)
    check_one_source(host, sources)
    if sources == ["mig_node_config_configmap"] or (not sources and operator_present):
        kind = CONFIGMAP
    elif sources:
        kind = sources[0]
    elif strict:
        raise RefusedError("%s: %s; none is set, and no GPU Operator was found whose config could be used."
                           % (host, _ONE_OF))
    else:
        kind = None
    name, name_from = settings.get("config_name"), None
    if name:
        name_from = NAME_FROM_SETTING
    elif settings.get("config_from_label") and kind not in (LAYOUTS, PLAN):
        name = (node_labels or {}).get(LABEL_CONFIG, "")
        name_from = NAME_FROM_LABEL if name else None
    if kind == PLAN:
        label = settings["plan"].get("config_label") or "planned"
    elif name:
        label = name
    elif kind == LAYOUTS:
        label = "custom"
    else:
        label = None
    return {"kind": kind, "config_name": name, "name_from": name_from, "label": label}


def label_from_config(names: Sequence[str]) -> str:
    """The label of a layout read from a config without a config name: its one config's name, else 'custom'."""
    return names[0] if len(names) == 1 else "custom"
