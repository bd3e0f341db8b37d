# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The mig_device_plugin role's chart values (logic in plugin_utils/_device_plugin.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _device_plugin as device_plugin
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import plain


def device_plugin_values(settings, hostvars=None, hosts=()):
    """chart_values() with the nodes' gpuops_mig facts (from their preview, else from mig_facts) taken from
    ``hostvars`` for ``hosts``."""
    facts = {}
    for host in hosts or ():
        host_vars = (hostvars or {}).get(host) or {}
        found = (host_vars.get("mig_node_preview") or {}).get("facts") \
            or (host_vars.get("ansible_facts") or {}).get("gpuops_mig")
        if found:
            facts[host] = {"driver": (found or {}).get("driver")}
    return device_plugin.chart_values(plain(settings, "the mig_device_plugin settings"),
                                      plain(facts, "the nodes' facts"))


class FilterModule(object):
    def filters(self):
        return {"mig_device_plugin_values": as_filter(device_plugin_values, GpuopsError)}
