# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The mig_node role's filters for the hand-off to a dynamic MIG partitioner and back (logic in
plugins/plugin_utils/_handoff.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _handoff as handoff


class FilterModule(object):
    def filters(self):
        return {
            "mig_partitioner_published": as_filter(handoff.published, handoff.HandoffError),
            "mig_hami_node_config": as_filter(handoff.hami_node_config, handoff.HandoffError),
            "mig_handoff_record": as_filter(handoff.record_text, handoff.HandoffError),
        }
