# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Sharing MIG devices through NVIDIA's device plugin (time-slicing), on the controller.

A sharing policy is {MIG profile: {strategy, replicas, rename, fail_requests_greater_than_one}} (or
``none``). What the device plugin v0.20.0 makes of it (NVIDIA/k8s-device-plugin):

- ``sharing.timeSlicing.resources[{name, replicas}]`` turns each device of the resource into
  ``replicas`` devices (internal/rm/device_map.go); fewer than 2 replicas is refused when the config
  is read (api/config/v1/replicas.go).
- ``renameByDefault`` advertises a shared resource as ``<name>.shared`` (api/config/v1/consts.go);
  a per-resource ``rename`` is ignored (api/config/v1/config.go), so renaming is one switch per
  config, and so is ``failRequestsGreaterThanOne`` (internal/rm/rm.go).
- GFD labels a shared resource ``<name>.replicas=<n>``, ``<name>.sharing-strategy=time-slicing`` and,
  when it is not renamed, appends ``-SHARED`` to ``<name>.product`` (internal/lm/resource.go).
- MPS is refused for MIG devices (internal/plugin/mps.go) and with migStrategy=mixed
  (cmd/nvidia-device-plugin/main.go): the plugin exits and its pod crash-loops.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Collection, Sequence

from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import describe
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _k8s_objects as k8s_objects
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as decision

TIME_SLICING = "time-slicing"
NONE = "none"
MPS = "mps"
SHARED_SUFFIX = ".shared"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_KEYS = ("strategy", "replicas", "rename", "fail_requests_greater_than_one")
_MPS_WHY = ("the NVIDIA device plugin refuses MPS for MIG devices ('sharing using MPS is not supported for MIG "
            "devices') and with migStrategy=mixed, and its pod then crash-loops on the node; use time-slicing")


class SharingError(GpuopsError):
    """A sharing policy or device-plugin config that cannot be used (found before anything changes)."""


def policy(sharing: Any, where: str = "mig_node_sharing") -> dict[str, dict[str, Any]]:
    """The shared profiles of a sharing policy: {profile: {replicas, rename, fail_requests_greater_than_one}}.

    ``sharing``: None, {}, 'none' (nothing shared) or {profile: 'none' | {strategy, replicas, rename,
    fail_requests_greater_than_one}}. ``where`` names the source in errors (host and variable)."""
    if sharing is None or sharing == NONE or (isinstance(sharing, (Mapping, str)) and not sharing):
        return {}
    if not isinstance(sharing, Mapping):
        raise SharingError("%s must be 'none' or a mapping of MIG profile to a sharing policy, got %s"
                           % (where, describe(sharing)))
    shared = {}
    for profile, entry in sharing.items():
        if not isinstance(profile, str) or not profile:
            raise SharingError("%s: keys must be MIG profile names such as 1g.10gb, got %s" % (where, describe(profile)))
        spec = _entry(entry, "%s, profile %s" % (where, profile))
        if spec:
            shared[profile] = spec
    for switch in ("rename", "fail_requests_greater_than_one"):
        values = set(spec[switch] for spec in shared.values())
        if len(values) > 1:
            raise SharingError(
                "%s: %s differs between profiles (%s), but the device plugin has one such switch per config "
                "(renameByDefault / failRequestsGreaterThanOne; a per-resource rename is ignored). Give every "
                "shared profile the same %s." % (where, switch, ", ".join(
                    "%s: %s" % (p, str(s[switch]).lower()) for p, s in sorted(shared.items())), switch))
    return shared


def _entry(entry, where):
    if entry is None or entry == NONE:
        return None
    if not isinstance(entry, Mapping):
        raise SharingError("%s: the policy must be 'none' or a mapping with strategy, replicas, rename, "
                           "fail_requests_greater_than_one; got %s" % (where, describe(entry)))
    unknown = sorted(set(entry) - set(_KEYS), key=str)
    if unknown:
        raise SharingError("%s: unknown key(s) %s; allowed: %s" % (where, ", ".join(map(repr, unknown)),
                                                                   ", ".join(_KEYS)))
    strategy = entry.get("strategy", TIME_SLICING)
    if strategy == MPS:
        raise SharingError("%s: MPS cannot share MIG devices: %s." % (where, _MPS_WHY))
    if strategy == NONE:
        return None
    if strategy != TIME_SLICING:
        raise SharingError("%s: strategy must be time-slicing or none, got %s" % (where, describe(strategy)))
    if "replicas" not in entry:
        raise SharingError("%s: time-slicing needs replicas (how many pods share one device)" % where)
    return {"replicas": _replicas(entry["replicas"], where),
            "rename": _switch(entry.get("rename", False), where, "rename"),
            "fail_requests_greater_than_one": _switch(entry.get("fail_requests_greater_than_one", False), where,
                                                      "fail_requests_greater_than_one")}


def _replicas(value, where):
    # Extra vars and surveys give strings; a string of up to 9 ASCII digits is a number too.
    if isinstance(value, str) and checks.count(value, 9) is not None:
        value = checks.count(value, 9)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise SharingError("%s: replicas must be a whole number of 2 or more (the device plugin refuses fewer; "
                           "use strategy none not to share), got %s" % (where, describe(value)))
    return value


def _switch(value, where, name):
    if not isinstance(value, bool):
        raise SharingError("%s: %s must be true or false, got %s" % (where, name, describe(value)))
    return value


def resource_name(profile: str, strategy: str) -> str:
    """The device plugin's resource for MIG devices of ``profile``: nvidia.com/gpu under single, else
    nvidia.com/mig-<profile> ('+' written '.')."""
    return GPU_RESOURCE if strategy == "single" else MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def check_for_layout(shared: Mapping[str, Any], devices: Collection[str], strategy: str, host: str,
                     source: str) -> None:
    """Refuse sharing the node's layout and MIG strategy cannot serve (nothing has changed yet).

    devices: the MIG device names the layout creates on the node; source: where the layout comes from."""
    missing = sorted(p for p in shared if p not in devices)
    if missing:
        raise SharingError(
            "%s: mig_node_sharing shares %s, which the layout from %s does not create on this node (it creates %s). "
            "Nothing was changed." % (host, ", ".join(missing), source, ", ".join(sorted(devices)) or "no MIG devices"))
    if shared and strategy == "none":
        raise SharingError(
            "%s: mig_node_sharing shares %s, but under the MIG strategy none the device plugin advertises whole GPUs "
            "and no MIG devices. Nothing was changed. Use the mixed or single strategy." % (
                host, ", ".join(sorted(shared))))


def expected_advertisement(gpus: Sequence[Mapping[str, Any]], strategy: str, with_labels: bool = True,
                           sharing: Any = None) -> dict[str, Any]:
    """What the node must advertise (decision.expected_advertisement) with the shared profiles time-sliced:
    devices x replicas under the resource's name, '.shared' appended with rename, and GFD's replicas,
    sharing-strategy and (not renamed) '-SHARED' product labels."""
    shared = policy(sharing)
    expected = decision.expected_advertisement(gpus, strategy, with_labels)
    resources, labels = dict(expected["resources"]), dict(expected["labels"])
    for profile, spec in sorted(shared.items()):
        name = resource_name(profile, strategy)
        if strategy == "none" or name not in resources or not _advertises(gpus, strategy, profile):
            continue
        devices = int(resources.pop(name))
        resources[name + SHARED_SUFFIX if spec["rename"] else name] = str(devices * spec["replicas"])
        if with_labels:
            labels[name + ".replicas"] = str(spec["replicas"])
            labels[name + ".sharing-strategy"] = TIME_SLICING
            if strategy == "mixed":
                labels[name + ".product"] = "%s-MIG-%s" % (_model_of(gpus, profile), profile.replace("+", "."))
            if not spec["rename"] and name + ".product" in labels:
                labels[name + ".product"] += "-SHARED"
    return {"resources": resources, "labels": labels}


def _model_of(gpus, profile):
    """The name of the first GPU with devices of ``profile``, as GFD writes a model in a product label."""
    return next(g["name"] for g in gpus if (g.get("mig_devices") or {}).get(profile)).replace(" ", "-")


def _advertises(gpus, strategy, profile):
    """Whether the resource of ``profile`` is made of that profile's MIG devices (under single,
    nvidia.com/gpu is whole GPUs when MIG is off)."""
    return any(g.get("mig_enabled") and (g.get("mig_devices") or {}).get(profile) for g in gpus or ())


# -- the device plugin's per-node config (the mig_node role) ------------------------

CONFIG_LABEL = "nvidia.com/device-plugin.config"
ENTRY_PREFIX = "gpuops-mig-"
UNMANAGED = {"managed": False, "policy": {}}


def render(shared: Mapping[str, Mapping[str, Any]], strategy: str, allocation_policy: str = "") -> str:
    """The device plugin's config file (api/config/v1) for the shared profiles: YAML text, keys sorted.
    allocation_policy: flags.plugin.sharedDevicesAllocationPolicy (distributed or packed), left out when empty."""
    import yaml      # PyYAML: a controller requirement (README, Install)

    config = {"version": "v1", "flags": {"migStrategy": strategy}}
    if allocation_policy:
        config["flags"]["plugin"] = {"sharedDevicesAllocationPolicy": allocation_policy}
    if shared:
        first = next(iter(shared.values()))
        config["sharing"] = {"timeSlicing": {
            "renameByDefault": first["rename"],
            "failRequestsGreaterThanOne": first["fail_requests_greater_than_one"],
            "resources": [{"name": resource_name(profile, strategy), "replicas": spec["replicas"]}
                          for profile, spec in sorted(shared.items())]}}
    return yaml.safe_dump(config, default_flow_style=False, sort_keys=True)


def valid_entry_name(name: str) -> bool:
    """A ConfigMap key that is also a label value (the nvidia.com/device-plugin.config label names it)."""
    return bool(checks.whole(checks.LABEL_VALUE, name))


def policy_from_config(text: str | None, devices: Collection[str], strategy: str,
                       where: str) -> dict[str, dict[str, Any]]:
    """The shared profiles of an existing device-plugin config entry (its time-slicing resources that are the
    layout's MIG devices); MPS is refused."""
    import yaml

    try:
        config = yaml.safe_load(text or "") or {}
    except yaml.YAMLError as e:
        raise SharingError("%s is not YAML: %s" % (where, e))
    sharing = (config.get("sharing") or {}) if isinstance(config, Mapping) else None
    if not isinstance(sharing, Mapping):
        raise SharingError("%s is not a device plugin config (a mapping with version, flags, sharing)" % where)
    if sharing.get("mps"):
        raise SharingError("%s shares with MPS: %s." % (where, _MPS_WHY))
    time_slicing = sharing.get("timeSlicing") or {}
    by_resource = dict((resource_name(profile, strategy), profile) for profile in devices)
    shared = {}
    for resource in time_slicing.get("resources") or []:
        name = str((resource or {}).get("name", ""))
        name = name if "/" in name else "nvidia.com/" + name
        if name in by_resource:
            shared[by_resource[name]] = {
                "replicas": _replicas(resource.get("replicas"), "%s, resource %s" % (where, name)),
                "rename": bool(time_slicing.get("renameByDefault", False)),
                "fail_requests_greater_than_one": bool(time_slicing.get("failRequestsGreaterThanOne", False))}
    return shared


def _device_names(planned):
    return dict((name, True) for gpu in planned or () if gpu.get("mig_enabled") for name in gpu.get("devices") or {})


def node_plan(host: str, settings: Mapping[str, Any], planned: Sequence[Mapping[str, Any]] | None, strategy: str,
              source: str, operator: Mapping[str, Any], node: Mapping[str, Any] | None,
              configmaps: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> dict[str, Any]:
    """What the rollout does about the device plugin's config for this node, checked before any change.

    settings: sharing (mig_node_sharing), entry (mig_node_device_plugin_config_name), configmap
    (mig_node_device_plugin_config_map, [namespace/]name); planned: mig_node_info's per-GPU devices after the change;
    operator: decision.operator_view(); node: the Node; configmaps: {namespace: [ConfigMap objects]} as read.
    Returns UNMANAGED, or {managed, policy, entry, configmap, namespace, data (entries to write), label (the node
    label to set, or None when it is already there)}. Raises SharingError naming the host and the source."""
    declared = settings.get("sharing")
    entry = settings.get("entry") or ""
    if declared in (None, "", {}) and not entry:
        return dict(UNMANAGED)
    devices = _device_names(planned)
    shared = policy(declared, "%s: mig_node_sharing" % host)
    configmap, namespace = _config_map(host, settings, operator)
    found = next((cm for cm in (configmaps or {}).get(namespace) or ()
                  if (cm.get("metadata") or {}).get("name") == configmap), None)
    data = dict((found or {}).get("data") or {})
    where = "%s: entry '%s' of the device plugin's ConfigMap %s/%s" % (host, entry, namespace, configmap)
    if entry and not valid_entry_name(entry):
        raise SharingError("%s: mig_node_device_plugin_config_name must be 1 to 63 letters, digits, '-', '_' or '.', "
                           "starting and ending with a letter or digit (a ConfigMap key and a label value), got %s"
                           % (host, describe(entry)))
    write = {}
    if declared in (None, "", {}):
        if entry not in data:
            has = ("it has %s" % (", ".join(sorted(data)) or "no entries")) if found else "the ConfigMap was not found"
            raise SharingError("%s does not exist (%s). Nothing was changed. Name an existing entry, or declare "
                               "mig_node_sharing so the rollout writes one." % (where, has))
        shared = policy_from_config(data[entry], devices, strategy, where)
    else:
        content = render(shared, strategy)
        if not entry:
            entry = ENTRY_PREFIX + hashlib.sha256(content.encode("utf-8")).hexdigest()[:10]
        elif entry in data and data[entry] != content:
            raise SharingError("%s already holds another config than mig_node_sharing gives. Nothing was changed. "
                               "Name a new entry, or leave mig_node_device_plugin_config_name empty for one named "
                               "after its content." % where)
        if data.get(entry) != content:
            write[entry] = content
    check_for_layout(shared, devices, strategy, host, source)
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    return {"managed": True, "policy": shared, "entry": entry, "configmap": configmap, "namespace": namespace,
            "data": write, "label": None if labels.get(CONFIG_LABEL) == entry else entry}


def config_map_ref(host: str, value: Any, variable: str = "mig_node_device_plugin_config_map") -> tuple[str, str]:
    """(namespace, name) of a ConfigMap variable written `[namespace/]name`; an empty namespace means the
    GPU Operator's. Raises SharingError for anything else."""
    if value in (None, ""):
        return "", ""
    ref = k8s_objects.configmap_ref(value) if isinstance(value, str) else None
    if ref is None:
        raise SharingError("%s: %s must be a ConfigMap name or namespace/name (lowercase letters, digits, "
                           "'-' and '.'), got %s. Nothing was changed." % (host, variable, describe(value)))
    return ref["namespace"], ref["name"]


def _config_map(host, settings, operator):
    """The ConfigMap the node's device plugin reads its configs from, and its namespace."""
    namespace, named = config_map_ref(host, settings.get("configmap"))
    if operator.get("present") and operator.get("device_plugin"):
        theirs = operator.get("device_plugin_config") or ""
        ours = operator.get("namespace") or "gpu-operator"
        if not theirs:
            raise SharingError(
                "%s: the GPU Operator runs the device plugin, and its ClusterPolicy names no config ConfigMap "
                "(devicePlugin.config.name), so the plugin reads no per-node config. Nothing was changed. Set "
                "devicePlugin.config.name (and .default) in the ClusterPolicy, then run again." % host)
        if (named and named != theirs) or namespace not in ("", ours):
            raise SharingError(
                "%s: mig_node_device_plugin_config_map is %s, but the GPU Operator's device plugin reads %s/%s "
                "(devicePlugin.config.name). Nothing was changed."
                % (host, settings.get("configmap"), ours, theirs))
        return theirs, ours
    if not named:
        raise SharingError(
            "%s: mig_node_sharing needs mig_node_device_plugin_config_map: the ConfigMap the device plugin reads its "
            "per-node configs from (the chart's config.name). Nothing was changed." % host)
    return named, namespace or operator.get("namespace") or "gpu-operator"
