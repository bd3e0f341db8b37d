# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The mig_node role's and site.yml's filters over the node decisions (logic in plugin_utils/_node_decision.py;
mig_node_decision, mig_config_from_configmaps and mig_operator_view are deprecated, see meta/runtime.yml)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as decision
from ansible_collections.gpuops.mig.plugins.plugin_utils import _rollout_report as rollout_report
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing


def _wrap(function):
    return as_filter(function, (RefusedError, sharing.SharingError))


def node_decision(info, node, operator, settings):
    """decide(), with a refusal returned as {"path": "refused", "error": message} for the role to report."""
    try:
        return dict(decision.decide(info, node, operator, settings), error=None)
    except RefusedError as e:
        return {"path": "refused", "error": str(e)}


class FilterModule(object):
    def filters(self):
        return {
            "mig_operator_view": _wrap(decision.operator_view),
            "mig_node_decision": node_decision,
            "mig_config_from_configmaps": decision.config_from_configmaps,
            "mig_manager_run": _wrap(decision.mig_manager_run),
            "mig_node_report": rollout_report.node_report,
            "mig_fleet_summary": rollout_report.fleet_summary,
            "mig_preview_lines": rollout_report.preview_lines,
            "mig_preview_failure": as_filter(rollout_report.preview_failure, ValueError),
            "mig_expected_advertisement": _wrap(sharing.expected_advertisement),
            "mig_advertised": _wrap(decision.advertised),
            "mig_expected_slices": _wrap(decision.expected_slices),
            "mig_published_slices": _wrap(decision.published_slices),
        }
