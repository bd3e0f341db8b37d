# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The nvidia-device-plugin chart's values from the mig_device_plugin role's typed variables, checked before helm.

Value names and choices follow NVIDIA/k8s-device-plugin v0.20.0: the chart's values.yaml and
templates/daemonset-device-plugin.yml (migStrategy, failOnInitError, deviceListStrategy, nvidiaDriverRoot,
config.map / config.default), the plugin's flags (cmd/nvidia-device-plugin/main.go: device list strategies
envvar, volume-mounts, cdi-annotations, cdi-cri; --shared-devices-allocation-policy distributed or packed,
which the chart has no value for, so it goes into the config files as flags.plugin.sharedDevicesAllocationPolicy,
api/config/v1/flags.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import describe
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing

MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
ALLOCATION_POLICIES = ("distributed", "packed")
# The config-manager's "named" fallback picks this entry on a node without the config label.
DEFAULT_ENTRY = "default"
_BOOLS = {"true": True, "false": False, "yes": True, "no": False}


class DevicePluginError(GpuopsError):
    """A device-plugin setting that cannot be used (found before helm runs)."""


def chart_values(settings: Mapping[str, Any], facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The release values: the typed settings, then ``settings['values']`` (free-form) merged over them.

    settings: mig_strategy, gfd, fail_on_init_error, device_list_strategy, driver_root, allocation_policy,
    sharing_configs, config_default, values (the role's variables without the prefix); facts: {host: the
    gpuops_mig facts} the driver root is detected from when driver_root is 'auto'."""
    strategy = str(settings.get("mig_strategy") or "").lower()
    if strategy not in MIG_STRATEGIES:
        raise DevicePluginError("mig_device_plugin_mig_strategy must be none, single or mixed, got %s"
                                % describe(settings.get("mig_strategy")))
    values = {"migStrategy": strategy, "gfd": {"enabled": _bool(settings.get("gfd", True), "mig_device_plugin_gfd")}}
    fail_on_init = settings.get("fail_on_init_error")
    if fail_on_init not in (None, ""):
        values["failOnInitError"] = _bool(fail_on_init, "mig_device_plugin_fail_on_init_error")
    device_list = _device_list(settings.get("device_list_strategy"))
    if device_list:
        values["deviceListStrategy"] = device_list
    root = driver_root(settings.get("driver_root"), facts)
    if root:
        values["nvidiaDriverRoot"] = root
    config = config_values(settings.get("sharing_configs"), strategy, settings.get("allocation_policy") or "",
                           settings.get("config_default") or "")
    if config:
        values["config"] = config
    free = settings.get("values") or {}
    if not isinstance(free, Mapping):
        raise DevicePluginError("mig_device_plugin_values must be a mapping of chart values, got %s" % describe(free))
    return _merge(values, free)


def _bool(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise DevicePluginError("%s must be true or false, got %s" % (name, describe(value)))


def _device_list(value):
    """A strategy or a list of them -> the chart's string (comma-separated, as the plugin's flag takes a list)."""
    if value in (None, "", []):
        return ""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise DevicePluginError("mig_device_plugin_device_list_strategy must be a strategy or a list of them, got %s"
                                % describe(value))
    items = [i.strip() for i in items]
    wrong = [i for i in items if i not in DEVICE_LIST_STRATEGIES]
    if wrong or len(set(items)) != len(items):
        raise DevicePluginError("mig_device_plugin_device_list_strategy: %s; each of %s at most once"
                                % (", ".join(map(repr, wrong)) or "a strategy given twice",
                                   ", ".join(DEVICE_LIST_STRATEGIES)))
    return ",".join(items)


def driver_root(setting: Any, facts: Mapping[str, Any] | None) -> str:
    """nvidiaDriverRoot: a path as given; 'auto', the driver root the nodes' facts report (the same on all of
    them; '/' for a driver on the host), nothing when no node was read; '' leaves the chart's default."""
    if setting in (None, ""):
        return ""
    if not isinstance(setting, str) or (setting != "auto" and not setting.startswith("/")):
        raise DevicePluginError("mig_device_plugin_driver_root must be auto, an absolute path, or empty, got %s"
                                % describe(setting))
    if setting != "auto":
        return setting
    found = {}
    for host, host_facts in sorted((facts or {}).items()):
        driver = (host_facts or {}).get("driver") if isinstance(host_facts, Mapping) else None
        if isinstance(driver, Mapping) and driver.get("present"):
            found.setdefault(driver.get("root") or "/", []).append(host)
    if len(found) > 1:
        raise DevicePluginError(
            "the nodes load the NVIDIA driver from different roots (%s), and one device plugin release has one "
            "nvidiaDriverRoot. Nothing was deployed. Set mig_device_plugin_driver_root, or deploy a release per "
            "kind of node." % "; ".join("%s on %s" % (root, ", ".join(hosts)) for root, hosts in sorted(found.items())))
    return next(iter(found), "")


def config_values(configs: Any, strategy: str, allocation_policy: Any, default: Any) -> dict[str, Any]:
    """config.map (and config.default) for named sharing configs and the allocation policy; {} for neither."""
    if allocation_policy not in ("",) + ALLOCATION_POLICIES:
        raise DevicePluginError("mig_device_plugin_shared_devices_allocation_policy must be distributed or packed "
                                "(v0.20.0), got %s" % describe(allocation_policy))
    configs = configs or {}
    if not isinstance(configs, Mapping):
        raise DevicePluginError("mig_device_plugin_sharing_configs must be a mapping of config name to a sharing "
                                "policy, got %s" % describe(configs))
    if not configs and not allocation_policy:
        if default:
            raise DevicePluginError("mig_device_plugin_config_default is %s, but mig_device_plugin_sharing_configs "
                                    "names no config" % describe(default))
        return {}
    entries = {}
    for name, policy in configs.items():
        if not isinstance(name, str) or not sharing.valid_entry_name(name):
            raise DevicePluginError("mig_device_plugin_sharing_configs: %s is not a config name (1 to 63 letters, "
                                    "digits, '-', '_' or '.', a ConfigMap key and a label value)" % describe(name))
        shared = sharing.policy(policy, "mig_device_plugin_sharing_configs, config %s" % name)
        if shared and strategy == "none":
            raise DevicePluginError("mig_device_plugin_sharing_configs, config %s: shares MIG devices, but under the "
                                    "MIG strategy none the device plugin advertises no MIG devices" % name)
        entries[name] = sharing.render(shared, strategy, allocation_policy)
    # Nodes without the nvidia.com/device-plugin.config label get this one (the config-manager's fallback).
    entries.setdefault(DEFAULT_ENTRY, sharing.render({}, strategy, allocation_policy))
    if default and default not in entries:
        raise DevicePluginError("mig_device_plugin_config_default is %s, which mig_device_plugin_sharing_configs "
                                "does not name (it names %s)" % (describe(default), ", ".join(sorted(entries))))
    config = {"map": entries}
    if default:
        config["default"] = default
    return config


def _merge(base, over):
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
