# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""mig_ready, mig_ready_taint and mig_ready_bootstrap: the MIG-ready gate's decision per Node, the
startup taint checked, the layout a node pool's bootstrap installs (plugin_utils/_mig_ready.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _mig_ready as ready


def mig_ready_taint(text):
    """The taint {key, value, effect} of 'key[=value]:effect', refused when Kubernetes would refuse
    it."""
    try:
        return ready.parse_taint(text)
    except ValueError as e:
        raise ready.MigReadyError(str(e))


class FilterModule(object):
    def filters(self):
        return {
            "mig_ready": as_filter(ready.verdicts, ready.MigReadyError),
            "mig_ready_taint": as_filter(mig_ready_taint, ready.MigReadyError),
            "mig_ready_bootstrap": as_filter(ready.bootstrap_layout, ready.MigReadyError),
        }
