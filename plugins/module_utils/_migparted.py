# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

# mig-parted v1 configs and inline per-GPU layouts -> per-GPU targets.
#
# No NVML and no Ansible here. PyYAML is needed only to read YAML text; an
# already-parsed mapping (e.g. inline in a playbook) works without it.
# Profile names are checked for form here and resolved per GPU model later
# by the planner (_gpu_layout), so one config can serve several GPU models.
#
# The schema follows mig-parted v0.15.0 (api/spec/v1): see docs/planner.md.

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _bounded_yaml as bounded_yaml
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError, excerpt
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import PinnedGi
from ansible_collections.gpuops.mig.plugins.module_utils._input import pattern, read_file, whole

__all__ = [
    "ConfigError",
    "ConfigEntry",
    "MigPartedConfig",
    "HostGpu",
    "GpuTarget",
    "Resolution",
    "load_config",
    "entries_from_layouts",
    "resolve_targets",
    "normalize_pci_id",
]

TOP_LEVEL_KEYS = ("version", "mig-configs")
ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
LAYOUT_KEYS = ("gpus", "device_filter", "mig_enabled", "devices")
# Items of a layout's devices when given as a list (one GPU instance each).
DEVICE_ITEM_KEYS = ("profile", "placement", "compute_instances")
CI_ITEM_KEYS = ("profile", "placement")
PLACEMENT_KEYS = ("start", "size")

# [Nc.]Ng.Mgb followed by +attr (repeatable, e.g. +me, +me.all, +gfx) or a single -attr (e.g. -me).
_PROFILE_NAME = pattern(
    r"(?:(?P<c>[1-9][0-9]*)c\.)?(?P<g>[1-9][0-9]*)g\.[1-9][0-9]*gb"
    r"(?:(?:\+[a-z]+(?:\.[a-z]+)*)+|-[a-z]+(?:\.[a-z]+)*)?")
_PCI_ID = pattern(r"0[xX][0-9a-fA-F]{8}")
# Longer names are not profiles (and their slice counts would not be small ints).
_MAX_PROFILE_CHARS = 64
# How many items of a list a message shows.
_SHOWN_ITEMS = 8


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of a mig-parted config (or one inline layout), validated.

    devices: "all" or a tuple of GPU indices.
    device_filter: tuple of (device id "0xDDDDVVVV", subsystem id "0xSSSSVVVV" or None).
    mig_devices: {profile name: count} as written (zeros kept); empty when disabled. For an
        inline layout whose devices are a list, the count of every device the list names.
    label: where it is in the input plus what it selects, for messages, e.g.
        "mig-parted config: config 'all-balanced' entry [2] (devices: all; device-filter: 0x20B010DE)".
    pinned: PinnedGi values, the list items that carry a placement (inline layouts only).
    """

    label: str
    devices: object
    device_filter: tuple
    mig_enabled: bool
    mig_devices: dict
    pinned: tuple = ()


@dataclass(frozen=True)
class MigPartedConfig:
    """A parsed mig-parted v1 file: {config name: (ConfigEntry, ...)}."""

    origin: str
    configs: dict

    @property
    def names(self) -> list[str]:
        return sorted(self.configs)

    def select(self, name: str | None = None) -> tuple[ConfigEntry, ...]:
        """The entries of one named config. The name may be left out when the file has exactly one."""
        if name is None:
            if len(self.configs) == 1:
                return next(iter(self.configs.values()))
            raise ConfigError("%s: %d configs, so a config name is needed; available: %s"
                              % (self.origin, len(self.configs), _list_text(self.names)))
        if name not in self.configs:
            raise ConfigError("%s: no config named %s; available: %s"
                              % (self.origin, excerpt(name), _list_text(self.names)))
        return self.configs[name]


@dataclass(frozen=True)
class HostGpu:
    """What config resolution needs to know about one GPU of the host.

    pci_device_id: packed 0xDDDDVVVV (int, or a string such as "0x20B010DE").
    pci_subsystem_id: packed 0xSSSSVVVV or None. When None, a filter's
    subsystem part is not checked (the device part still must match).
    """

    index: int
    pci_device_id: object
    mig_capable: bool
    name: str = ""
    pci_subsystem_id: object = None

    @property
    def label(self) -> str:
        return "GPU %d (%s)" % (self.index, self.name) if self.name else "GPU %d" % self.index


@dataclass(frozen=True)
class GpuTarget:
    """The layout one config entry asks for on one GPU."""

    gpu: HostGpu
    entry: ConfigEntry
    mig_enabled: bool
    mig_devices: dict    # {profile name: count}; {} when MIG is disabled or enabled-but-empty
    pinned: tuple = ()   # PinnedGi values: GPU instances at fixed placements (part of mig_devices)


@dataclass(frozen=True)
class Resolution:
    """Result of resolve_targets().

    targets: GpuTarget per selected GPU, by index. GPUs absent here are left alone.
    unmatched: entries that selected no GPU (a config often serves several
        models); the caller decides whether that is an error.
    skipped: (HostGpu, ConfigEntry) for GPUs that are not MIG-capable and were
        selected by devices: all, or explicitly with mig-enabled false.
    """

    targets: tuple
    unmatched: tuple
    skipped: tuple


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

def load_config(source: str | bytes | Mapping[str, Any], origin: str = "mig-parted config") -> MigPartedConfig:
    """Parse and validate a mig-parted v1 config.

    source: YAML (or JSON) text, or an already-parsed mapping.
    origin: how to name the input in messages (e.g. its path).
    Raises ConfigError naming the config, the entry and the key on any problem (ParseError
    for text that is not valid YAML or goes past the limits of _bounded_yaml).
    """
    if isinstance(source, bytes):
        source = _utf8_text(source, origin)
    if isinstance(source, str):
        data = parse_yaml(source, origin)
    else:
        data = source
    if not isinstance(data, Mapping):
        raise ConfigError("%s: expected a mapping with 'version' and 'mig-configs', got %s"
                          % (origin, _type_name(data)))
    unknown = [k for k in data if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise ConfigError("%s: unknown top-level key(s) %s; allowed: %s"
                          % (origin, _keys_text(unknown), ", ".join(TOP_LEVEL_KEYS)))
    if "version" not in data:
        raise ConfigError("%s: 'version' is missing; it must be v1" % origin)
    if data["version"] != "v1":
        raise ConfigError("%s: unsupported version %s; only v1 is known" % (origin, excerpt(data["version"])))
    configs = data.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise ConfigError("%s: 'mig-configs' must be a non-empty mapping of config name to a list of entries"
                          % origin)
    parsed = {}
    for name, entries in configs.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("%s: config names must be non-empty strings, got %s" % (origin, excerpt(name)))
        where = "%s: config %s" % (origin, excerpt(name))
        if not isinstance(entries, list) or not entries:
            got = "an empty list" if isinstance(entries, list) else _type_name(entries)
            raise ConfigError("%s must be a non-empty list of entries, got %s" % (where, got))
        parsed[name] = tuple(_parse_entry(entry, "%s entry [%d]" % (where, i)) for i, entry in enumerate(entries))
    return MigPartedConfig(origin, parsed)


def read_config_file(path: str, option: str = "config_file") -> str:
    """The text of a config file on this host (the value of ``option``), read no further than
    the limit on a config's size; ConfigError naming the option and the path when it is not a
    regular file, cannot be read, is larger, or is not UTF-8 text (_input.read_file: a FIFO or a
    device is never opened)."""
    return read_file(path, option, bounded_yaml.MAX_CHARS)


def _utf8_text(data, origin):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError("%s: not UTF-8 text (%s)" % (origin, e))


def parse_yaml(text: str, origin: str) -> Any:
    """YAML text as data, read within the limits of _bounded_yaml (size, nesting, aliases, value
    length) and with a key given twice refused; raises ParseError (a ConfigError) naming ``origin``."""
    data = bounded_yaml.load(text, origin)
    if data is None:
        raise ConfigError("%s: empty document" % origin)
    return data


def _parse_entry(entry, where):
    if not isinstance(entry, Mapping):
        raise ConfigError("%s: an entry must be a mapping, got %s" % (where, _type_name(entry)))
    label = _raw_label(where, entry.get("devices"), entry.get("device-filter"))
    unknown = [k for k in entry if k not in ENTRY_KEYS]
    if unknown:
        raise ConfigError("%s: unknown key(s) %s; allowed: %s" % (label, _keys_text(unknown), ", ".join(ENTRY_KEYS)))
    return _build_entry(where, label, entry, "devices", "device-filter", "mig-enabled", "mig-devices",
                        enabled_default=None)


def entries_from_layouts(layouts: list[Mapping[str, Any]], origin: str = "layouts") -> tuple[ConfigEntry, ...]:
    """Turn inline per-GPU layouts into ConfigEntry values (same rules as a mig-parted entry).

    Shape (a list; keys use underscores, as Ansible options do):

        - gpus: all            # or a list of GPU indices; required
          device_filter: "0x20B010DE"   # optional; one id or a list
          mig_enabled: true    # optional, default true
          devices:             # required when MIG is enabled ({} = enabled, empty)
            3g.20gb: 2

    devices may instead be a list, one GPU instance per item, with an optional
    pinned placement (what mig_facts' checkpoint gives):

          devices:
            - profile: 3g.40gb                 # the GPU instance profile
              placement: {start: 4, size: 4}   # memory slices; size optional
              compute_instances:               # optional; default one spanning the GI
                - {profile: 1c.3g.40gb, placement: {start: 0}}
                - {profile: 2c.3g.40gb, placement: {start: 1}}
            - profile: 1g.10gb                 # no placement: the planner chooses

    devices must be absent or empty when mig_enabled is false.
    """
    if not isinstance(layouts, list) or not layouts:
        raise ConfigError("%s: expected a non-empty list of layouts, got %s" % (origin, _type_name(layouts)))
    entries = []
    for i, layout in enumerate(layouts):
        where = "%s[%d]" % (origin, i)
        if not isinstance(layout, Mapping):
            raise ConfigError("%s: a layout must be a mapping, got %s" % (where, _type_name(layout)))
        label = _raw_label(where, layout.get("gpus"), layout.get("device_filter"), "gpus", "device_filter")
        unknown = [k for k in layout if k not in LAYOUT_KEYS]
        if unknown:
            raise ConfigError("%s: unknown key(s) %s; allowed: %s"
                              % (label, _keys_text(unknown), ", ".join(LAYOUT_KEYS)))
        entries.append(_build_entry(where, label, layout, "gpus", "device_filter", "mig_enabled", "devices",
                                    enabled_default=True))
    return tuple(entries)


def _build_entry(where, label, raw, devices_key, filter_key, enabled_key, mig_devices_key, enabled_default):
    if devices_key not in raw:
        raise ConfigError("%s: %r is missing; use 'all' or a list of GPU indices" % (label, devices_key))
    devices = _parse_devices(raw[devices_key], label, devices_key)
    device_filter = _parse_filter(raw.get(filter_key), label, filter_key) if filter_key in raw else ()
    if enabled_key in raw:
        enabled = raw[enabled_key]
    elif enabled_default is None:
        raise ConfigError("%s: %r is missing; it must be true or false" % (label, enabled_key))
    else:
        enabled = enabled_default
    if not isinstance(enabled, bool):
        raise ConfigError("%s: %r must be true or false, got %s" % (label, enabled_key, excerpt(enabled)))
    pinned = ()
    if enabled:
        if mig_devices_key not in raw:
            raise ConfigError("%s: %r is missing; it is required when MIG is enabled "
                              "(use {} for MIG enabled with no devices)" % (label, mig_devices_key))
        if isinstance(raw[mig_devices_key], list) and enabled_default is not None:
            mig_devices, pinned = _parse_device_list(raw[mig_devices_key], label, mig_devices_key)
        else:
            mig_devices = _parse_mig_devices(raw[mig_devices_key], label, mig_devices_key)
    else:
        value = raw.get(mig_devices_key)
        if value is not None and not (isinstance(value, (Mapping, list)) and not value):
            raise ConfigError("%s: %r must be absent or empty when MIG is disabled"
                              % (label, mig_devices_key))
        mig_devices = {}
    parts = ["%s: %s" % (devices_key, _devices_text(devices))]
    if device_filter:
        shown = [_filter_text(f) for f in device_filter[:_SHOWN_ITEMS + 1]]
        parts.append("%s: %s" % (filter_key, _list_text(shown, len(device_filter))))
    return ConfigEntry("%s (%s)" % (where, "; ".join(parts)), devices, device_filter, enabled, mig_devices, pinned)


def _parse_devices(value, label, key):
    if value == "all":
        return "all"
    if not isinstance(value, list):
        raise ConfigError("%s: %r must be 'all' or a list of GPU indices, got %s" % (label, key, excerpt(value)))
    if not value:
        raise ConfigError("%s: %r is an empty list; use 'all' or list GPU indices" % (label, key))
    for index in value:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError("%s: %r must list GPU indices (non-negative integers), got %s"
                              % (label, key, excerpt(index)))
    if len(set(value)) != len(value):
        raise ConfigError("%s: %r lists a GPU index more than once" % (label, key))
    return tuple(value)


def _parse_filter(value, label, key):
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ConfigError("%s: %r is an empty list" % (label, key))
    parsed = []
    for item in items:
        device, dummy, subsystem = item.partition(":") if isinstance(item, str) else (item, "", "")
        device_id = _pci_id_or_none(device)
        subsystem_id = _pci_id_or_none(subsystem) if subsystem else None
        if device_id is None or (subsystem and subsystem_id is None):
            raise ConfigError("%s: %r entries must look like 0xDDDDVVVV (PCI device and vendor id, "
                              "e.g. 0x20B010DE), optionally followed by :0xSSSSVVVV; got %s"
                              % (label, key, excerpt(item)))
        parsed.append((device_id, subsystem_id))
    return tuple(parsed)


def _parse_device_list(items, label, key):
    """An inline layout's devices as a list of GPU instances: ({device name: count}, PinnedGi values).

    Names are checked for form here; whether the GPU has them, and whether a
    placement is one it can hold, is checked per GPU model by the planner.
    """
    counts = {}
    pinned = []
    for i, item in enumerate(items):
        where = "%s[%d]" % (key, i)
        if not isinstance(item, Mapping):
            raise ConfigError("%s: %s must be a mapping with 'profile' (and optionally 'placement' and "
                              "'compute_instances'), got %s" % (label, where, _type_name(item)))
        _check_keys(item, DEVICE_ITEM_KEYS, label, where)
        name = _profile_name(item.get("profile"), label, where)
        if _profile_match(name).group("c"):
            raise ConfigError("%s: %s profile %r is a compute-instance profile; name the GPU instance profile "
                              "and list %r under compute_instances" % (label, where, name, name))
        start, size = _parse_placement(item["placement"], label, where) if "placement" in item else (None, None)
        cis = []
        raw_cis = item.get("compute_instances")
        if raw_cis is not None:
            if not isinstance(raw_cis, list) or not raw_cis:
                raise ConfigError("%s: %s compute_instances must be a non-empty list, got %s"
                                  % (label, where, _type_name(raw_cis)))
            for j, ci in enumerate(raw_cis):
                ci_where = "%s compute_instances[%d]" % (where, j)
                if not isinstance(ci, Mapping):
                    raise ConfigError("%s: %s must be a mapping with 'profile' and optionally 'placement', got %s"
                                      % (label, ci_where, _type_name(ci)))
                _check_keys(ci, CI_ITEM_KEYS, label, ci_where)
                ci_name = _profile_name(ci.get("profile"), label, ci_where)
                ci_start = None
                if "placement" in ci:
                    if start is None:
                        raise ConfigError("%s: %s has a placement, but its GPU instance has none; pin the GPU "
                                          "instance too" % (label, ci_where))
                    ci_start, _ci_size = _parse_placement(ci["placement"], label, ci_where)
                cis.append((ci_name, ci_start))
        for device in [n for n, _s in cis] or [name]:
            counts[device] = counts.get(device, 0) + 1
        if start is not None:
            pinned.append(PinnedGi(name, start, size, tuple(cis), where))
    return counts, tuple(pinned)


def _check_keys(item, allowed, label, where):
    unknown = [k for k in item if k not in allowed]
    if unknown:
        raise ConfigError("%s: %s has unknown key(s) %s; allowed: %s"
                          % (label, where, _keys_text(unknown), ", ".join(allowed)))


def _profile_name(name, label, where):
    if _profile_match(name) is None:
        raise ConfigError("%s: %s needs 'profile', a MIG profile name such as 3g.40gb or 1c.3g.40gb; got %s"
                          % (label, where, excerpt(name)))
    return name


def _profile_match(name):
    """The match of a well-formed profile name, None for anything else."""
    if not isinstance(name, str) or len(name) > _MAX_PROFILE_CHARS:
        return None
    return whole(_PROFILE_NAME, name)


def _parse_placement(value, label, where):
    if not isinstance(value, Mapping) or "start" not in value:
        raise ConfigError("%s: %s placement must be a mapping with 'start' (and optionally 'size'), got %s"
                          % (label, where, excerpt(value)))
    _check_keys(value, PLACEMENT_KEYS, label, "%s placement" % where)
    numbers = []
    for k in PLACEMENT_KEYS:
        number = value.get(k)
        if k in value and (isinstance(number, bool) or not isinstance(number, int) or number < (0 if k == "start" else 1)):
            raise ConfigError("%s: %s placement %s must be a %s integer, got %s"
                              % (label, where, k, "non-negative" if k == "start" else "positive", excerpt(number)))
        numbers.append(number)
    return tuple(numbers)


def _parse_mig_devices(value, label, key):
    if not isinstance(value, Mapping):
        raise ConfigError("%s: %r must be a mapping of MIG profile name to count, got %s"
                          % (label, key, _type_name(value)))
    for name, count in value.items():
        match = _profile_match(name)
        if match is None:
            raise ConfigError("%s: %r has a malformed profile name %s; expected [Nc.]Ng.Mgb[+attr...|-attr], "
                              "e.g. 3g.20gb, 1c.3g.20gb, 1g.5gb+me" % (label, key, excerpt(name)))
        if match.group("c") and int(match.group("c")) > int(match.group("g")):
            raise ConfigError("%s: %r profile %r has more compute slices than GPU slices" % (label, key, name))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("%s: %r count for %r must be a non-negative integer, got %s"
                              % (label, key, name, excerpt(count)))
    if value and not any(value.values()):
        raise ConfigError("%s: %r has only zero counts; use {} for MIG enabled with no devices" % (label, key))
    return dict(value)


# --------------------------------------------------------------------------
# Selecting GPUs
# --------------------------------------------------------------------------

def resolve_targets(entries: Iterable[ConfigEntry], gpus: Iterable[HostGpu], allow_unmatched: bool = False) -> Resolution:
    """Match entries to the host's GPUs.

    entries: ConfigEntry values (MigPartedConfig.select() or entries_from_layouts()).
    gpus: HostGpu values for every GPU of the host.

    An entry selects the GPUs named by its devices AND matching its
    device-filter. GPUs no entry selects are left alone. Errors (ConfigError):
    a GPU selected by two entries; an entry naming a GPU index the host does
    not have (unless allow_unmatched); a GPU that is not MIG-capable named
    explicitly by an entry that enables MIG. An entry that selects nothing
    otherwise (typically a device-filter for another model) is reported in
    Resolution.unmatched, and so are missing indices when allow_unmatched.
    """
    by_index = {}
    for gpu in gpus:
        by_index[gpu.index] = gpu
    claimed = {}
    targets = []
    unmatched = []
    skipped = []
    for entry in entries:
        if entry.devices == "all":
            candidates = [by_index[i] for i in sorted(by_index)]
        else:
            missing = [i for i in entry.devices if i not in by_index]
            if missing and not allow_unmatched:
                raise ConfigError("%s selects GPU index %s, but this host has %s"
                                  % (entry.label, _list_text([str(i) for i in missing[:_SHOWN_ITEMS + 1]], len(missing)),
                                     _host_text(by_index)))
            candidates = [by_index[i] for i in entry.devices if i in by_index]
        selected = []
        for gpu in candidates:
            if entry.device_filter and not _filter_matches(entry.device_filter, gpu):
                continue
            if not gpu.mig_capable:
                if entry.devices != "all" and entry.mig_enabled:
                    raise ConfigError("%s enables MIG on %s, which is not MIG-capable" % (entry.label, gpu.label))
                skipped.append((gpu, entry))
                continue
            selected.append(gpu)
        if not selected:
            unmatched.append(entry)
        for gpu in selected:
            if gpu.index in claimed:
                raise ConfigError("%s is selected by two entries: %s and %s"
                                  % (gpu.label, claimed[gpu.index].label, entry.label))
            claimed[gpu.index] = entry
            targets.append(GpuTarget(gpu, entry, entry.mig_enabled, dict(entry.mig_devices), entry.pinned))
    targets.sort(key=lambda t: t.gpu.index)
    return Resolution(tuple(targets), tuple(unmatched), tuple(skipped))


def unmatched_text(entries: Sequence[ConfigEntry], gpus: Sequence[HostGpu]) -> str:
    """Why each of ``entries`` (Resolution.unmatched) selects no GPU of ``gpus`` (HostGpu values), for a
    refusal: the entry's label names its device-filter, and this names the model of each GPU it names."""
    texts = []
    for entry in entries[:_SHOWN_ITEMS]:
        named = [gpu for gpu in gpus if entry.devices == "all" or gpu.index in entry.devices]
        if not named:
            texts.append("%s selects no GPU (this host has %s)"
                         % (entry.label, _host_text({gpu.index: gpu for gpu in gpus})))
        else:
            models = [_model_text(gpu) for gpu in named[:_SHOWN_ITEMS + 1]]
            texts.append("%s is for another GPU model: %s" % (entry.label, _list_text(models, len(named))))
    if len(entries) > _SHOWN_ITEMS:
        texts.append("... (%d entries in all)" % len(entries))
    return "; ".join(texts)


def _model_text(gpu):
    text = "%s has PCI device ID %s" % (gpu.label, _pci_id_or_none(gpu.pci_device_id) or excerpt(gpu.pci_device_id))
    if gpu.pci_subsystem_id is not None:
        text += " (subsystem %s)" % (_pci_id_or_none(gpu.pci_subsystem_id) or excerpt(gpu.pci_subsystem_id))
    return text


def _filter_matches(device_filter, gpu):
    device_id = normalize_pci_id(gpu.pci_device_id)
    subsystem_id = normalize_pci_id(gpu.pci_subsystem_id) if gpu.pci_subsystem_id is not None else None
    for wanted_device, wanted_subsystem in device_filter:
        if wanted_device != device_id:
            continue
        if wanted_subsystem is None or subsystem_id is None or wanted_subsystem == subsystem_id:
            return True
    return False


def normalize_pci_id(value: int | str) -> str:
    """0xDDDDVVVV in the form used for matching ("0x20B010DE"); accepts an int or a string."""
    normalized = _pci_id_or_none(value)
    if normalized is None:
        raise ConfigError("not a PCI id (0xDDDDVVVV): %s" % excerpt(value))
    return normalized


def _pci_id_or_none(value):
    # An unquoted 0x20B010DE in YAML 1.1 arrives as an int.
    if isinstance(value, int) and not isinstance(value, bool):
        return "0x%08X" % value if 0 <= value <= 0xFFFFFFFF else None
    if whole(_PCI_ID, value):
        return "0x" + value[2:].upper()
    return None


# --------------------------------------------------------------------------
# Message helpers
# --------------------------------------------------------------------------

def _raw_label(where, devices, device_filter, devices_key="devices", filter_key="device-filter"):
    parts = ["%s: %s" % (devices_key, _devices_text(devices))]
    if device_filter is not None:
        shown = device_filter if isinstance(device_filter, list) else [device_filter]
        texts = [_raw_filter_text(f) for f in shown[:_SHOWN_ITEMS + 1]]
        parts.append("%s: %s" % (filter_key, _list_text(texts, len(shown))))
    return "%s (%s)" % (where, "; ".join(parts))


def _raw_filter_text(value):
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF:
        return "0x%08X" % value
    return excerpt(value, quote=False)


def _devices_text(devices):
    if devices == "all":
        return "all"
    if isinstance(devices, (list, tuple)):
        return "[%s]" % _list_text([excerpt(d) for d in devices[:_SHOWN_ITEMS + 1]], len(devices))
    return excerpt(devices)


def _list_text(texts, count=None):
    """Texts joined with commas, at most _SHOWN_ITEMS of them; ``count`` is how many there are in all
    when ``texts`` holds only the first ones."""
    count = len(texts) if count is None else count
    if count <= _SHOWN_ITEMS:
        return ", ".join(texts)
    return "%s, ... (%d in all)" % (", ".join(texts[:_SHOWN_ITEMS]), count)


def _filter_text(item):
    device, subsystem = item
    return device if subsystem is None else "%s:%s" % (device, subsystem)


def _host_text(by_index):
    if not by_index:
        return "no GPUs"
    return "GPU index %s" % ", ".join(str(i) for i in sorted(by_index))


def _keys_text(keys):
    return _list_text([excerpt(k) for k in keys[:_SHOWN_ITEMS + 1]], len(keys))


def _type_name(value):
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "%s %s" % (type(value).__name__, excerpt(value))
