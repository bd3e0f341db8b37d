# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The filter that wires a simulated host from gpuops_mig_simulate (plugin_utils/_simulate.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _simulate as simulate
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter


def mig_simulated_host(value, host, python):
    return simulate.simulated_host(value, host, python)


class FilterModule(object):
    def filters(self):
        return {"mig_simulated_host": as_filter(mig_simulated_host, RefusedError)}
