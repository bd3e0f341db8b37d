# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""A mig-parted v1 config from the hardware, as ``nvidia-mig-parted generate-config`` builds it.

Private to the collection; pure Python. Input: the GPUs of mig_facts (any number
of hosts). Output: all-disabled, all-enabled, all-<profile> at the profile's
maximum count and all-balanced (7-slice GPUs: 2 x 1g + 1 x 2g + 1 x 3g; 4-slice:
2 x 1g + 1 x 2g; base profiles only, the 1g with the highest maximum count).
Each entry is per GPU model (device-filter) when the fleet has several models,
so one file serves a mixed fleet. mig-facts.md section 2.2 describes the rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError

__all__ = ["generate_config", "models_from_facts"]

_BASE = re.compile(r"^([0-9]+)g\.[0-9]+gb$")


def models_from_facts(gpu_facts):
    """{pci_device_id: (GPU name, supported_profiles)} for the MIG-capable GPUs, in first-seen order."""
    models = {}
    missing = {}
    for gpu in gpu_facts:
        if not isinstance(gpu, Mapping):
            raise ConfigError("GPU facts must be mappings (gpuops.mig.mig_facts gpus), got %r" % (gpu,))
        if not gpu.get("mig_capable"):
            continue
        pci = str(gpu.get("pci_device_id") or "").upper().replace("0X", "0x")
        if not pci:
            raise ConfigError("GPU %s has no pci_device_id in its facts" % gpu.get("index"))
        profiles = gpu.get("supported_profiles") or []
        if profiles and pci not in models:
            models[pci] = (gpu.get("name", ""), profiles)
        elif not profiles:
            missing.setdefault(pci, gpu.get("name", ""))
    for pci, name in missing.items():
        if pci not in models:
            raise ConfigError("%s (%s) lists no MIG profiles: older drivers (such as 535) list them only while "
                              "MIG is enabled; enable MIG on one such GPU, or use a shipped config" % (name, pci))
    if not models:
        raise ConfigError("no MIG-capable GPU in the facts: nothing to generate a config from")
    return models


def _one_profile_configs(profiles):
    """{profile name: max count} for GPU-instance profiles (compute-instance-only profiles are not listed)."""
    return dict((p["name"], p["max_count"]) for p in sorted(profiles, key=_order) if p.get("max_count"))


def _order(p):
    return (p["sm_slices"], p["memory_slices"], p["name"])


def _balanced(profiles):
    base = [p for p in profiles if _BASE.match(p["name"])]
    by_g = {}
    for p in base:
        by_g.setdefault(p["sm_slices"], []).append(p)
    total = max(p["sm_slices"] for p in profiles)
    ones = sorted(by_g.get(1, []), key=lambda p: (-p["max_count"], p["memory_slices"], p["name"]))
    if not ones or 2 not in by_g:
        return None
    mix = {ones[0]["name"]: 2, sorted(by_g[2], key=_order)[0]["name"]: 1}
    if total >= 7:
        if 3 not in by_g:
            return None
        mix[sorted(by_g[3], key=_order)[0]["name"]] = 1
    return mix


def generate_config(gpu_facts):
    """The mig-parted v1 config (a mapping) for the GPUs of these facts."""
    models = models_from_facts(gpu_facts)
    several = len(models) > 1

    def entry(pci, enabled, devices=None):
        item = {"devices": "all"}
        if several:
            item["device-filter"] = pci
        item["mig-enabled"] = enabled
        if enabled:
            item["mig-devices"] = dict(devices or {})
        return item

    configs = {"all-disabled": [{"devices": "all", "mig-enabled": False}],
               "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]}
    singles = {}
    for pci, (dummy, profiles) in models.items():
        for name, count in _one_profile_configs(profiles).items():
            singles.setdefault("all-" + name.replace("+", "."), []).append(entry(pci, True, {name: count}))
    for name in sorted(singles, key=_config_order(models)):
        configs[name] = singles[name]
    balanced = [entry(pci, True, _balanced(profiles)) for pci, (dummy, profiles) in models.items()
                if _balanced(profiles)]
    if balanced:
        configs["all-balanced"] = balanced
    return {"version": "v1", "mig-configs": configs}


def _config_order(models):
    rank = {}
    for dummy, profiles in models.values():
        for p in profiles:
            key = "all-" + p["name"].replace("+", ".")
            rank[key] = min(rank.get(key, (99, 99, "")), _order(p))

    def order(name):
        return (rank.get(name, (99, 99, "")), name)
    return order
