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

The facts are checked first (check_profiles, check_pci_id: what the planner reuses),
and build() reads the config's YAML text back with the modules' parser and resolves
it on one GPU of each model, so no config leaves here that mig_config would refuse.
describe() is how the planner and the builder show a value from the input in a message.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as gpu_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError

__all__ = ["build", "generate_config", "models_from_facts", "check_profiles", "check_pci_id",
           "check_applies", "describe"]

_BASE = checks.pattern(r"([0-9]+)g\.[0-9]+gb")
# A GPU-instance profile as mig_facts names it: Ng.Mgb, then +attr(.attr) or one -attr (mig-parted's form).
_GI_PROFILE = checks.pattern(r"[1-9][0-9]?g\.[1-9][0-9]{0,3}gb"
                             r"(?:(?:\+[a-z]+(?:\.[a-z]+)*)+|-[a-z]+(?:\.[a-z]+)*)?")
# No GPU has more than 8 memory or SM slices; the bound keeps odd facts from costing time.
_SLICES_MAX = 64
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = 40
_SHORT.maxother = 40
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 4
_EXCERPT = 80
# (key, least, most); NVML's profile IDs are small numbers that differ per model.
_PROFILE_INTS = (("id", 0, 1023), ("sm_slices", 1, _SLICES_MAX), ("memory_slices", 1, _SLICES_MAX),
                 ("max_count", 1, _SLICES_MAX))


def models_from_facts(gpu_facts: Any) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """{pci_device_id: (GPU name, supported_profiles)} for the MIG-capable GPUs, in first-seen order.

    The facts are checked as the modules would see the GPU: ConfigError names the GPU and the field."""
    if not isinstance(gpu_facts, list):
        raise ConfigError("GPU facts must be a list (gpuops.mig.mig_facts gpus), got %s" % describe(gpu_facts))
    models = {}
    missing = {}
    for position, gpu in enumerate(gpu_facts):
        if not isinstance(gpu, Mapping):
            raise ConfigError("GPU facts must be mappings (gpuops.mig.mig_facts gpus); item %d is %s"
                              % (position, describe(gpu)))
        label = _gpu_label(gpu, position)
        capable = gpu.get("mig_capable", False)
        if not isinstance(capable, bool):
            raise ConfigError("%s: mig_capable must be true or false, got %s" % (label, describe(capable)))
        if not capable:
            continue
        pci = check_pci_id(gpu.get("pci_device_id"), label)
        name = gpu.get("name", "")
        if not isinstance(name, str):
            raise ConfigError("%s: name must be a string, got %s" % (label, describe(name)))
        profiles = check_profiles(gpu.get("supported_profiles"), label)
        if profiles and pci not in models:
            models[pci] = (str(name), profiles)
        elif not profiles:
            missing.setdefault(pci, str(name))
    for pci, name in missing.items():
        if pci not in models:
            raise ConfigError("%s (%s) lists no MIG profiles: older drivers (such as 535) list them only while "
                              "MIG is enabled; enable MIG on one such GPU, or use a shipped config" % (name, pci))
    if not models:
        raise ConfigError("no MIG-capable GPU in the facts: nothing to generate a config from")
    return models


def _gpu_label(gpu, position):
    index = gpu.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError("GPU facts item %d: index must be a non-negative integer, got %s" % (position, describe(index)))
    return "GPU %d" % index


def check_pci_id(value: Any, label: str) -> str:
    """The GPU's PCI device ID as "0xDDDDVVVV"; ConfigError naming the GPU when it is not one."""
    if value is None or value == "":
        raise ConfigError("%s has no pci_device_id in its facts" % label)
    try:
        return migparted.normalize_pci_id(value)
    except ConfigError:
        raise ConfigError("%s: pci_device_id must be a PCI device ID 0xDDDDVVVV (8 hex digits), got %s"
                          % (label, describe(value)))


def check_profiles(value: Any, label: str) -> list[dict[str, Any]]:
    """supported_profiles, checked and copied as plain values; the GPU's geometry must build from them.

    The copy is shared between GPUs that list the same profiles: callers must not change it."""
    if value is None:
        return []
    try:
        key = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):   # not JSON: the checks below refuse it
        key = None
    if key in _CHECKED_PROFILES:
        return _CHECKED_PROFILES[key]
    profiles = _checked_profiles(value, label)
    if key is not None:
        if len(_CHECKED_PROFILES) > 64:
            _CHECKED_PROFILES.clear()
        _CHECKED_PROFILES[key] = profiles
    return profiles


# A fleet repeats a few models' profile lists thousands of times: each distinct list is checked once.
_CHECKED_PROFILES = {}


def _checked_profiles(value, label):
    if not isinstance(value, list):
        raise ConfigError("%s: supported_profiles must be a list of MIG profiles, got %s" % (label, describe(value)))
    profiles = []
    for i, p in enumerate(value):
        where = "%s supported_profiles[%d]" % (label, i)
        if not isinstance(p, Mapping):
            raise ConfigError("%s must be a mapping (name, id, sm_slices, memory_slices, max_count, placements), "
                              "got %s" % (where, describe(p)))
        name = p.get("name")
        if not checks.whole(_GI_PROFILE, name):
            raise ConfigError("%s: name must be a MIG profile name such as 3g.40gb or 1g.10gb+me, got %s"
                              % (where, describe(name)))
        profile = {"name": str(name)}
        for key, least, most in _PROFILE_INTS:
            number = p.get(key)
            if isinstance(number, bool) or not isinstance(number, int) or not least <= number <= most:
                raise ConfigError("%s (%s): %s must be an integer from %d to %d, got %s"
                                  % (where, name, key, least, most, describe(number)))
            profile[key] = int(number)
        if int(name.split("g.", 1)[0]) != profile["sm_slices"]:
            # mig_facts names a profile <SM slices>g.<memory>gb; anything else is not from a GPU.
            raise ConfigError("%s: %s names %s SM slices, but its sm_slices is %d"
                              % (where, name, name.split("g.", 1)[0], profile["sm_slices"]))
        placements = p.get("placements", [])
        if (not isinstance(placements, list) or len(placements) > _SLICES_MAX
                or not all(not isinstance(s, bool) and isinstance(s, int) and 0 <= s < _SLICES_MAX
                           for s in placements)):
            raise ConfigError("%s (%s): placements must be a list of memory-slice offsets (0 to %d), got %s"
                              % (where, name, _SLICES_MAX - 1, describe(placements)))
        profile["placements"] = [int(s) for s in placements]
        nvml_name = p.get("nvml_name")
        if nvml_name is not None:
            if not checks.whole(_GI_PROFILE, nvml_name):
                raise ConfigError("%s (%s): nvml_name must be a MIG profile name, got %s"
                                  % (where, name, describe(nvml_name)))
            profile["nvml_name"] = str(nvml_name)
        profiles.append(profile)
    if profiles:
        try:
            host_layout.geometry_from_profiles(profiles)
        except gpu_layout.LayoutError as e:
            raise ConfigError("%s: its supported_profiles do not describe a GPU: %s" % (label, e))
    return profiles


def describe(value: Any) -> str:
    """A value for a message: its repr (escaped: no control character of the input reaches a console),
    cut to about 80 characters whatever the value holds."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # a hostile __repr__ must not replace the refusal with its own error
        text = "<%s>" % type(value).__name__
    return text if len(text) <= _EXCERPT else text[:_EXCERPT - 3] + "..."


def _one_profile_configs(profiles):
    """{profile name: max count} for GPU-instance profiles (compute-instance-only profiles are not listed)."""
    return dict((p["name"], p["max_count"]) for p in sorted(profiles, key=_order) if p.get("max_count"))


def _order(p):
    return (p["sm_slices"], p["memory_slices"], p["name"])


def _balanced(profiles):
    base = [p for p in profiles if checks.whole(_BASE, p["name"])]
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


def generate_config(gpu_facts: Any) -> dict[str, Any]:
    """The mig-parted v1 config (a mapping) for the GPUs of these facts."""
    return build(gpu_facts)["config"]


def build(gpu_facts: Any) -> dict[str, Any]:
    """{config: the v1 config, content: it as YAML text, models: models_from_facts()}.

    The text is read back with the modules' own parser and every config resolved against each GPU
    model, so a config that mig_config or mig_mode would refuse is never handed out (ConfigError)."""
    models = models_from_facts(gpu_facts)
    config = _config(models)
    content = _yaml_text(config)
    _check_applies(content, models)
    return {"config": config, "content": content, "models": models}


def _config(models):
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


def _yaml_text(config):
    try:
        import yaml
    except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
        raise ConfigError("writing the config as YAML needs the PyYAML Python package")
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _check_applies(content, models):
    """Refuse the config when the modules would: parse the text and resolve every config on one GPU per model."""
    try:
        parsed = migparted.load_config(content, origin="the generated config")
        for pci, (name, profiles) in models.items():
            geometry = host_layout.geometry_from_profiles(profiles)
            gpu = migparted.HostGpu(index=0, pci_device_id=pci, mig_capable=True, name=name)
            for config_name in parsed.names:
                check_applies(parsed.select(config_name), [gpu], {0: geometry},
                              "%s (%s)" % (name or pci, pci))
    except ConfigError as e:
        raise ConfigError("the facts give a config that mig_config would refuse, so none is generated: %s" % e)


def check_applies(entries: Any, gpus: Any, geometries: Mapping[int, Any], where: str,
                  valid: set[Any] | None = None) -> None:
    """What mig_config and mig_mode check of a config before any change, on GPUs described by
    facts: ``entries`` (ConfigEntry values) resolved on ``gpus`` (HostGpu values: two entries
    for one GPU, an index the host lacks) and each target validated on its GPU's geometry
    ({index: GpuGeometry, or None when the facts list no profiles}). ConfigError as the modules
    word it; ``where`` names the host or the model for an entry that selects nothing. ``valid``
    (a set kept by the caller while the geometries live) remembers the targets already proven,
    so a fleet of GPUs alike validates each layout once."""
    resolution = migparted.resolve_targets(entries, gpus)
    for entry in resolution.unmatched:
        if not entry.device_filter:
            raise ConfigError("%s selects no GPU of %s" % (entry.label, where))
    for target in resolution.targets:
        geometry = geometries.get(target.gpu.index)
        if not target.mig_enabled or geometry is None:
            continue
        key = (id(geometry), tuple(sorted(target.mig_devices.items())))
        if valid is not None and key in valid:
            continue
        try:
            gpu_layout.validate_target(geometry, target.mig_devices)
        except gpu_layout.LayoutError as e:
            raise ConfigError("%s on %s: %s" % (target.entry.label, where, e))
        if valid is not None:
            valid.add(key)


def _config_order(models):
    rank = {}
    for dummy, profiles in models.values():
        for p in profiles:
            key = "all-" + p["name"].replace("+", ".")
            rank[key] = min(rank.get(key, (99, 99, "")), _order(p))

    def order(name):
        return (rank.get(name, (99, 99, "")), name)
    return order
