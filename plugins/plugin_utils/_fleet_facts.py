# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The fleet's gpuops_mig facts from the play's hostvars, for the controller-side actions that read every
host's facts at once (gpuops.mig.mig_plan, gpuops.mig.mig_generate_config)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import plain

__all__ = ["fleet_from_hostvars"]


def fleet_from_hostvars(task_vars: Mapping[str, Any], hosts: Sequence[str] | None = None
                        ) -> dict[str, dict[str, Any] | None]:
    """{host: its gpuops_mig facts, or None when the host has none (unreachable, failed)}, as plain values.

    ``hosts`` defaults to every host of the play (ansible_play_hosts_all)."""
    if hosts is None:
        hosts = task_vars.get("ansible_play_hosts_all", [])
    hostvars = task_vars.get("hostvars", {})
    fleet = {}
    for host in hosts:
        facts = None
        if host in hostvars:
            facts = (hostvars[host].get("ansible_facts") or {}).get("gpuops_mig")
        fleet[host] = facts
    return plain(fleet, "the hosts' gpuops_mig facts")
