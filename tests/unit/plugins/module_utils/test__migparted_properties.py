# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The mig-parted reader and inline layouts under any input: a valid parse, or a refusal with a
GpuopsError message, never another exception.

Budget: fuzz_profile.py (GPUOPS_HYPOTHESIS_EXAMPLES for a long run).
"""

from __future__ import annotations

import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import PinnedGi
from ansible_collections.gpuops.mig.plugins.module_utils._migparted import (
    ConfigEntry,
    HostGpu,
    MigPartedConfig,
    entries_from_layouts,
    load_config,
    resolve_targets,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.fuzz_profile import FUZZ
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import PCI_IDS
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.test__bounded_yaml_properties import YAML_SOUP

# A message names where and what, with short excerpts of values: never the whole of a big one.
MESSAGE_LIMIT = 4000

PROFILES = ["1g.5gb", "3g.20gb", "1c.3g.20gb", "2c.1g.5gb", "7g.80gb", "1g.10gb+me", "1g.24gb-me", "1g.24gb+gfx",
            "3g.40gb", "1c.3g.40gb", "0g.5gb", "3g.20", "x" * 80, "9" * 70 + "g.1gb"]
PCI = sorted(PCI_IDS.values()) + ["0x20b010de", "0x20B010DE:0x145F10DE", "0x1234", "nope", ""]

# Values of every kind, including the awkward ones: huge ints, deep and wide nesting, odd text.
# (An int of more than 4300 digits has no repr() in Python 3.11+.)
ODD = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(0, 9).map(lambda n: 10 ** 5000 + n),
                st.floats(), st.text(max_size=20), st.text(min_size=5000, max_size=6000), st.binary(max_size=10),
                st.sampled_from(PROFILES + PCI + ["all", "v1", "true"]))
ANY = st.recursive(ODD, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(ODD, inner, max_size=4)), max_leaves=20)
SMALL_INT = st.integers(-2, 9)


def maybe(value_strategy, anything=ANY):
    """The value, or now and then anything at all."""
    return st.one_of(value_strategy, value_strategy, value_strategy, anything)


MIG_DEVICES = maybe(st.dictionaries(maybe(st.sampled_from(PROFILES), ODD), maybe(st.integers(-1, 8)), max_size=4))
ENTRY = st.fixed_dictionaries(
    {},
    optional={"devices": maybe(st.one_of(st.just("all"), st.lists(SMALL_INT, max_size=4))),
              "device-filter": maybe(st.one_of(st.sampled_from(PCI), st.lists(st.sampled_from(PCI), max_size=3),
                                               st.integers(0, 2 ** 33))),
              "mig-enabled": maybe(st.booleans()),
              "mig-devices": MIG_DEVICES,
              "colour": ANY})
CONFIG = st.fixed_dictionaries(
    {},
    optional={"version": maybe(st.just("v1")),
              "mig-configs": maybe(st.dictionaries(maybe(st.text(min_size=1, max_size=8), ODD),
                                                   maybe(st.lists(maybe(ENTRY), max_size=3)), max_size=3)),
              "extra": ANY})

PLACEMENT = maybe(st.fixed_dictionaries({"start": maybe(SMALL_INT)}, optional={"size": maybe(SMALL_INT)}))
COMPUTE_INSTANCE = maybe(st.fixed_dictionaries({"profile": maybe(st.sampled_from(PROFILES))},
                                               optional={"placement": PLACEMENT}))
DEVICE_ITEM = maybe(st.fixed_dictionaries(
    {"profile": maybe(st.sampled_from(PROFILES))},
    optional={"placement": PLACEMENT, "compute_instances": maybe(st.lists(COMPUTE_INSTANCE, max_size=3))}))
LAYOUT = maybe(st.fixed_dictionaries(
    {},
    optional={"gpus": maybe(st.one_of(st.just("all"), st.lists(SMALL_INT, max_size=4))),
              "device_filter": maybe(st.one_of(st.sampled_from(PCI), st.lists(st.sampled_from(PCI), max_size=2))),
              "mig_enabled": maybe(st.booleans()),
              "devices": maybe(st.one_of(MIG_DEVICES, st.lists(DEVICE_ITEM, max_size=4))),
              "colour": ANY}))

HOST = st.lists(st.tuples(st.sampled_from(sorted(PCI_IDS.values()) + [0x20B010DE, "0x1EB810DE"]), st.booleans(),
                          st.one_of(st.none(), st.sampled_from(["0x145F10DE", 0x147F10DE]))),
                max_size=6).map(lambda gpus: [HostGpu(i, pci, capable, "GPU model %d" % i, subsystem)
                                              for i, (pci, capable, subsystem) in enumerate(gpus)])


def refused(call, *args, **kwargs):
    """call(*args) -> (result, None) or (None, the GpuopsError); any other exception fails the test."""
    try:
        return call(*args, **kwargs), None
    except GpuopsError as err:
        assert 0 < len(str(err)) < MESSAGE_LIMIT, str(err)[:MESSAGE_LIMIT]
        return None, err


def check_resolution(entries, host, allow_unmatched):
    resolution, dummy = refused(resolve_targets, entries, host, allow_unmatched=allow_unmatched)
    if resolution is None:
        return
    indexes = [t.gpu.index for t in resolution.targets]
    assert indexes == sorted(set(indexes))               # one entry per GPU, in index order
    assert all(t.gpu.mig_capable for t in resolution.targets)
    assert all(t.entry in entries for t in resolution.targets)
    assert all(isinstance(p, PinnedGi) for t in resolution.targets for p in t.pinned)


def check_config(config, host, allow_unmatched):
    assert isinstance(config, MigPartedConfig)
    for name in config.names + [None, "no-such-config"]:
        entries, dummy = refused(config.select, name)
        if entries is not None:
            assert entries and all(isinstance(e, ConfigEntry) for e in entries)
            check_resolution(entries, host, allow_unmatched)


@FUZZ
@given(data=CONFIG, host=HOST, allow_unmatched=st.booleans())
def test_any_config_data_parses_and_resolves_or_is_refused(data, host, allow_unmatched):
    config, dummy = refused(load_config, data)
    if config is not None:
        check_config(config, host, allow_unmatched)


@FUZZ
@given(data=CONFIG, host=HOST, style=st.sampled_from([None, True, False]))
def test_any_config_text_parses_and_resolves_or_is_refused(data, host, style):
    try:
        text = yaml.safe_dump(data, default_flow_style=style)
    except (yaml.YAMLError, ValueError):
        return                                  # not data PyYAML writes (bytes keys, ints of 5000 digits)
    config, dummy = refused(load_config, text, origin="cfg.yaml")
    if config is not None:
        check_config(config, host, False)


@FUZZ
@given(text=st.one_of(YAML_SOUP, st.text(max_size=300), st.binary(max_size=100), YAML_SOUP.map(str.encode),
                      YAML_SOUP.map(lambda soup: "version: v1\nmig-configs:\n  c:\n    - " + soup)),
       host=HOST)
def test_any_text_parses_and_resolves_or_is_refused(text, host):
    config, dummy = refused(load_config, text, origin="cfg.yaml")
    if config is not None:
        check_config(config, host, True)


@FUZZ
@given(layouts=maybe(st.lists(LAYOUT, max_size=4)), host=HOST, allow_unmatched=st.booleans())
def test_any_inline_layouts_with_pins_parse_and_resolve_or_are_refused(layouts, host, allow_unmatched):
    entries, dummy = refused(entries_from_layouts, layouts)
    if entries is not None:
        assert all(isinstance(e, ConfigEntry) for e in entries)
        for entry in entries:
            # Every pinned GPU instance is counted among the entry's devices.
            for pin in entry.pinned:
                assert entry.mig_devices.get(pin.profile, 0) >= 1 or pin.compute_instances
        check_resolution(entries, host, allow_unmatched)
