# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Filters for the mig_node role's failure messages (logic in plugin_utils/_node_messages.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_messages as messages


class FilterModule(object):
    def filters(self):
        return {
            "mig_mode_still_pending": messages.mode_still_pending,
        }
