# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The filters that size the roles' waits and retries (logic in plugin_utils/_waits.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _waits as waits
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter


class FilterModule(object):
    def filters(self):
        return {
            "mig_retries": as_filter(waits.retries, RefusedError),
            "mig_api_settled": waits.api_settled,
        }
