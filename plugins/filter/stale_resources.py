# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""mig_stale_resources: the MIG resources a Node lists at zero that its layout no longer has
(logic in plugin_utils/_stale_resources.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _stale_resources as stale


class FilterModule(object):
    def filters(self):
        return {"mig_stale_resources": as_filter(stale.stale_resources, stale.StaleResourcesError)}
