# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Filters that choose the pods the mig_node role's steps touch (logic in plugin_utils/_node_pods.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_pods as node_pods
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter


class FilterModule(object):
    def filters(self):
        return {
            "mig_plugin_pods": node_pods.plugin_pods,
            "mig_smoke_pods": node_pods.smoke_pods,
            "mig_smoke_failure": node_pods.smoke_failure,
            "mig_drain_plan": as_filter(node_pods.drain_plan, ValueError),
            "mig_kept_pods_problems": node_pods.kept_pods_problems,
        }
