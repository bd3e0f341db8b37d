# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""mig_ready and mig_ready_bootstrap: the MIG-ready gate's decision per Node (which refuses a
startup taint Kubernetes would refuse), the layout a node pool's bootstrap installs
(plugin_utils/_mig_ready.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _mig_ready as ready


class FilterModule(object):
    def filters(self):
        return {
            "mig_ready": as_filter(ready.verdicts, ready.MigReadyError),
            "mig_ready_bootstrap": as_filter(ready.bootstrap_layout, ready.MigReadyError),
        }
