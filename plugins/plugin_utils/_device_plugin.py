# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The nvidia-device-plugin chart's values from the mig_device_plugin role's variables, checked.

Value names follow NVIDIA/k8s-device-plugin v0.20.0: the chart's values.yaml and
templates/daemonset-device-plugin.yml (migStrategy, nvidiaDriverRoot, config.map,
config.default), and the plugin's --shared-devices-allocation-policy (distributed or packed,
cmd/nvidia-device-plugin/main.go), which the chart has no value for, so it goes into the config
files as flags.plugin.sharedDevicesAllocationPolicy (api/config/v1/flags.go). Other chart values
(failOnInitError, deviceListStrategy, ...) come from the free-form values alone.

A node without the nvidia.com/device-plugin.config label gets the config-manager's DEFAULT_CONFIG
(config.default), else its fallbacks (an entry named "default", else the only entry); a
config.default the map lacks stops the plugin there ("specified config ... does not exist").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import describe
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing

MIG_STRATEGIES = ("none", "single", "mixed")
ALLOCATION_POLICIES = ("distributed", "packed")
# The config.map entry of nodes without the config label: always there (the one the user names so,
# else one that shares nothing) and always config.default, whatever config.fallbackStrategies says.
DEFAULT_ENTRY = "default"
LABEL = "nvidia.com/device-plugin.config"
_BOOLS = {"true": True, "false": False, "yes": True, "no": False}


class DevicePluginError(GpuopsError):
    """A device-plugin setting that cannot be used (found before helm runs)."""


def chart_values(settings: Mapping[str, Any],
                 facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The release values: the typed settings, then ``settings['values']`` merged over them.

    settings: mig_strategy, gfd, driver_root (gpuops_mig_driver_root), allocation_policy,
    sharing_configs, values (free-form; the role's variables without the prefix). facts: {host:
    the gpuops_mig facts}, for driver_root 'auto' when the values set no nvidiaDriverRoot."""
    strategy = str(settings.get("mig_strategy") or "").lower()
    if strategy not in MIG_STRATEGIES:
        raise DevicePluginError("mig_device_plugin_mig_strategy must be none, single or mixed, "
                                "got %s" % describe(settings.get("mig_strategy")))
    free = settings.get("values") or {}
    if not isinstance(free, Mapping):
        raise DevicePluginError("mig_device_plugin_values must be a mapping of chart values, "
                                "got %s" % describe(free))
    gfd = _bool(settings.get("gfd", True), "mig_device_plugin_gfd")
    values = {"migStrategy": strategy, "gfd": {"enabled": gfd}}
    if "nvidiaDriverRoot" not in free:      # the values win: nothing to detect or refuse
        root = driver_root(settings.get("driver_root"), facts)
        if root:
            values["nvidiaDriverRoot"] = root
    configs = settings.get("sharing_configs")
    config = config_values(configs, strategy, settings.get("allocation_policy") or "")
    if config:
        values["config"] = config
    merged = _merge(values, free)
    _check_default(merged.get("config"), isinstance(configs, Mapping) and DEFAULT_ENTRY in configs)
    return merged


def _bool(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise DevicePluginError("%s must be true or false, got %s" % (name, describe(value)))


def driver_root(setting: Any, facts: Mapping[str, Any] | None) -> str:
    """nvidiaDriverRoot from gpuops_mig_driver_root: a path as given; 'auto', the driver root the
    nodes' facts report (the same on all of them; '/' for a driver on the host), nothing when no
    node was read; '' leaves the chart's default."""
    if setting in (None, ""):
        return ""
    if not isinstance(setting, str) or (setting != "auto" and not setting.startswith("/")):
        raise DevicePluginError("gpuops_mig_driver_root must be auto, an absolute path, or empty, "
                                "got %s" % describe(setting))
    if setting != "auto":
        return setting
    found = {}
    for host, host_facts in sorted((facts or {}).items()):
        driver = (host_facts or {}).get("driver") if isinstance(host_facts, Mapping) else None
        if isinstance(driver, Mapping) and driver.get("present"):
            found.setdefault(driver.get("root") or "/", []).append(host)
    if len(found) > 1:
        raise DevicePluginError(
            "the nodes load the NVIDIA driver from different roots (%s), and one device plugin "
            "release has one nvidiaDriverRoot. Nothing was deployed. Set nvidiaDriverRoot in "
            "mig_device_plugin_values, or deploy a release per kind of node." % "; ".join(
                "%s on %s" % (root, ", ".join(hosts)) for root, hosts in sorted(found.items())))
    return next(iter(found), "")


def config_values(configs: Any, strategy: str, allocation_policy: Any) -> dict[str, Any]:
    """config.map and config.default for the sharing configs and the allocation policy ({} for
    neither). The map always has an entry ``default`` (the one named so, else one that shares
    nothing), and config.default names it: the config of nodes without the config label."""
    if allocation_policy not in ("",) + ALLOCATION_POLICIES:
        raise DevicePluginError("mig_device_plugin_shared_devices_allocation_policy must be "
                                "distributed or packed (v0.20.0), got %s"
                                % describe(allocation_policy))
    configs = configs or {}
    if not isinstance(configs, Mapping):
        raise DevicePluginError("mig_device_plugin_sharing_configs must be a mapping of config "
                                "name to a sharing policy, got %s" % describe(configs))
    if not configs and not allocation_policy:
        return {}
    entries = {}
    for name, policy in configs.items():
        if not isinstance(name, str) or not sharing.valid_entry_name(name):
            raise DevicePluginError(
                "mig_device_plugin_sharing_configs: %s is not a config name (1 to 63 letters, "
                "digits, '-', '_' or '.', a ConfigMap key and a label value)" % describe(name))
        # default: ts4 (not none, the policy that shares nothing, even beside a config named none)
        if name == DEFAULT_ENTRY and isinstance(policy, str) and policy in configs \
                and policy not in (name, sharing.NONE):
            raise DevicePluginError(
                "mig_device_plugin_sharing_configs, config default: %s names another config, but "
                "default is the config of nodes without the %s label itself and takes a sharing "
                "policy. Give it the policy of %s (a YAML anchor repeats it), or leave default "
                "out and set config.default: %s in mig_device_plugin_values."
                % (describe(policy), LABEL, policy, policy))
        shared = sharing.policy(policy, "mig_device_plugin_sharing_configs, config %s" % name)
        if shared and strategy == "none":
            raise DevicePluginError(
                "mig_device_plugin_sharing_configs, config %s: shares MIG devices, but under the "
                "MIG strategy none the device plugin advertises no MIG devices" % name)
        entries[name] = sharing.render(shared, strategy, allocation_policy)
    entries.setdefault(DEFAULT_ENTRY, sharing.render({}, strategy, allocation_policy))
    return {"map": entries, "default": DEFAULT_ENTRY}


def _check_default(config: Any, named_default: bool) -> None:
    """Refuses a config.default from mig_device_plugin_values (they win) that overrides the
    default entry of mig_device_plugin_sharing_configs (two answers for the nodes without the
    label) or that config.map lacks (none that the config-manager can use)."""
    if not isinstance(config, Mapping) or config.get("default") in (None, "", DEFAULT_ENTRY):
        return
    chosen = config["default"]
    if named_default:
        raise DevicePluginError(
            "mig_device_plugin_sharing_configs names a config default, for the nodes without "
            "the %s label, but mig_device_plugin_values sets config.default to %s. Say it in "
            "one place." % (LABEL, describe(chosen)))
    known = config.get("map")
    if config.get("name") or not isinstance(known, Mapping) or not known:
        return      # the values' own ConfigMap, or no map: its entries are not known here
    if not isinstance(chosen, str) or chosen not in known:
        raise DevicePluginError(
            "mig_device_plugin_values sets config.default to %s, which config.map does not name "
            "(it names %s): the device plugin would not start on nodes without the %s label."
            % (describe(chosen), ", ".join(sorted(map(str, known))), LABEL))


def _merge(base, over):
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
