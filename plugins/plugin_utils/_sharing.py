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

import re
from collections.abc import Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._config_builder import describe
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as decision

TIME_SLICING = "time-slicing"
NONE = "none"
MPS = "mps"
SHARED_SUFFIX = ".shared"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_KEYS = ("strategy", "replicas", "rename", "fail_requests_greater_than_one")
_DIGITS = re.compile(r"^[0-9]{1,9}$")
_MPS_WHY = ("the NVIDIA device plugin refuses MPS for MIG devices ('sharing using MPS is not supported for MIG "
            "devices') and with migStrategy=mixed, and its pod then crash-loops on the node; use time-slicing")


class SharingError(GpuopsError):
    """A sharing policy or device-plugin config that cannot be used (found before anything changes)."""


def policy(sharing, where="mig_node_sharing"):
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
    # Extra vars and surveys give strings; a string of digits is a number too.
    if isinstance(value, str) and _DIGITS.match(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise SharingError("%s: replicas must be a whole number of 2 or more (the device plugin refuses fewer; "
                           "use strategy none not to share), got %s" % (where, describe(value)))
    return value


def _switch(value, where, name):
    if not isinstance(value, bool):
        raise SharingError("%s: %s must be true or false, got %s" % (where, name, describe(value)))
    return value


def resource_name(profile, strategy):
    """The device plugin's resource for MIG devices of ``profile``: nvidia.com/gpu under single, else
    nvidia.com/mig-<profile> ('+' written '.')."""
    return GPU_RESOURCE if strategy == "single" else MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def check_for_layout(shared, devices, strategy, host, source):
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


def expected_advertisement(gpus, strategy, with_labels=True, sharing=None):
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
