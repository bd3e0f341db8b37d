# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import copy
import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import LayoutError, plan_gpu
from ansible_collections.gpuops.mig.plugins.module_utils._migparted import (
    ConfigError,
    HostGpu,
    entries_from_layouts,
    load_config,
    normalize_pci_id,
    resolve_targets,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (
    MODELS,
    PCI_IDS,
    assert_plan_valid,
)

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mig-parted-config.yaml")

with open(FIXTURE) as _f:
    FIXTURE_TEXT = _f.read()


def gpu(index, model="A100-40GB", capable=True, subsystem=None):
    return HostGpu(index, PCI_IDS.get(model, "0x1EB810DE"), capable, model, subsystem)


DGX_A100 = [gpu(i) for i in range(8)]
MIXED_HOST = [gpu(0), gpu(1), gpu(2, "H100-80GB"), gpu(3, "A30"), gpu(4, "T4", capable=False),
              gpu(5, "H100-NVL"), gpu(6, "H200"), gpu(7, "B200")]


def minimal(**entry):
    base = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 1}}
    base.update(entry)
    for key in [k for k, v in base.items() if v is DROP]:
        del base[key]
    return {"version": "v1", "mig-configs": {"cfg": [base]}}


DROP = object()


# --------------------------------------------------------------------------
# The shipped configs
# --------------------------------------------------------------------------

def test_fixture_parses_from_yaml_and_from_a_mapping():
    config = load_config(FIXTURE_TEXT, origin=FIXTURE)
    assert config.names == sorted(["all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-1g.10gb",
                                   "all-2g.10gb", "all-3g.20gb", "all-balanced", "custom-config",
                                   "compute-instances"])
    assert load_config(yaml.safe_load(FIXTURE_TEXT), origin=FIXTURE).configs == config.configs
    assert load_config(FIXTURE_TEXT.encode(), origin=FIXTURE).configs == config.configs
    assert config.select("all-1g.5gb")[0].label.startswith(FIXTURE + ": config 'all-1g.5gb' entry [0]")


def test_dgx_a100_all_balanced():
    entries = load_config(FIXTURE_TEXT).select("all-balanced")
    result = resolve_targets(entries, DGX_A100)
    assert [t.gpu.index for t in result.targets] == list(range(8))
    assert all(t.mig_devices == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1} for t in result.targets)
    assert all("0x20B010DE" in t.entry.label for t in result.targets)
    # The other models' entries select nothing on this host; that is reported, not an error.
    assert len(result.unmatched) == 5


def test_mixed_host_resolves_each_model_to_its_entry_and_plans():
    entries = load_config(FIXTURE_TEXT).select("all-balanced")
    result = resolve_targets(entries, MIXED_HOST)
    assert [t.gpu.index for t in result.targets] == [0, 1, 2, 3, 5, 6, 7]
    assert result.skipped == () and result.unmatched == ()   # no filter matches the T4: left alone
    by_index = {t.gpu.index: t for t in result.targets}
    assert by_index[2].mig_devices == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert by_index[3].mig_devices == {"1g.6gb": 2, "2g.12gb": 1}
    # Names resolve per GPU model in the planner.
    for target in result.targets:
        geometry = MODELS[target.gpu.name]
        plan = plan_gpu(geometry, [], target.mig_devices)
        assert_plan_valid(geometry, [], target.mig_devices, plan)


def test_same_name_means_different_profiles_per_model():
    entries = load_config(FIXTURE_TEXT).select("all-1g.10gb")
    result = resolve_targets(entries, [gpu(0), gpu(1, "H100-80GB"), gpu(2, "A30")])
    by_index = {t.gpu.index: t.mig_devices for t in result.targets}
    assert by_index == {0: {"1g.10gb": 4}, 1: {"1g.10gb": 7}}
    a100 = plan_gpu(MODELS["A100-40GB"], [], by_index[0])
    h100 = plan_gpu(MODELS["H100-80GB"], [], by_index[1])
    assert {g.profile_id for g in a100.result} == {15} and {g.profile_id for g in h100.result} == {19}


def test_wrong_model_names_fail_in_the_planner_with_the_valid_list():
    entries = load_config(FIXTURE_TEXT).select("all-3g.20gb")
    (target,) = resolve_targets(entries, [gpu(0, "H100-80GB")]).targets
    with pytest.raises(LayoutError, match="3g.40gb"):
        plan_gpu(MODELS["H100-80GB"], [], target.mig_devices)


def test_custom_config_on_a_dgx():
    result = resolve_targets(load_config(FIXTURE_TEXT).select("custom-config"), DGX_A100)
    assert [(t.gpu.index, t.mig_enabled) for t in result.targets] == [
        (0, False), (1, False), (2, False), (3, False), (4, True), (5, True), (6, True), (7, True)]
    assert result.targets[0].mig_devices == {}
    assert result.targets[4].mig_devices == {"1g.5gb": 7}
    assert "entry [3]" in result.targets[6].entry.label and "devices: [6]" in result.targets[6].entry.label


def test_explicit_indices_the_host_lacks():
    entries = load_config(FIXTURE_TEXT).select("custom-config")
    with pytest.raises(ConfigError) as err:
        resolve_targets(entries, DGX_A100[:4])
    assert "custom-config" in str(err.value) and "entry [1]" in str(err.value)
    assert "GPU index 4" in str(err.value) and "0, 1, 2, 3" in str(err.value)
    result = resolve_targets(entries, DGX_A100[:4], allow_unmatched=True)
    assert len(result.targets) == 4 and len(result.unmatched) == 4


def test_enabled_and_disabled_and_empty():
    config = load_config(FIXTURE_TEXT)
    result = resolve_targets(config.select("all-disabled"), [gpu(0), gpu(1, "T4", capable=False)])
    (t,) = result.targets
    assert (t.mig_enabled, t.mig_devices) == (False, {})
    assert [g.index for g, dummy in result.skipped] == [1]   # devices: all skips non-MIG GPUs silently
    result = resolve_targets(config.select("all-1g.5gb"), [gpu(0), gpu(1, "T4", capable=False)])
    assert [t.gpu.index for t in result.targets] == [0] and [g.index for g, dummy in result.skipped] == [1]
    (t,) = resolve_targets(config.select("all-enabled"), [gpu(0)]).targets
    assert (t.mig_enabled, t.mig_devices) == (True, {})


def test_select():
    config = load_config(FIXTURE_TEXT)
    with pytest.raises(ConfigError) as err:
        config.select("all-balancd")
    assert "'all-balancd'" in str(err.value) and "all-balanced, all-disabled" in str(err.value)
    with pytest.raises(ConfigError, match="config name is needed"):
        config.select()
    single = load_config(minimal())
    assert single.select() == single.select("cfg")


# --------------------------------------------------------------------------
# Rejections: every one names the config, the entry and the key
# --------------------------------------------------------------------------

@pytest.mark.parametrize("entry, words", [
    ({"mig_devices": {}}, ["unknown key", "'mig_devices'"]),
    ({"devices": DROP}, ["'devices' is missing"]),
    ({"devices": 7}, ["'devices'", "'all' or a list", "7"]),
    ({"devices": "0"}, ["'devices'", "'0'"]),
    ({"devices": "ALL"}, ["'devices'"]),
    ({"devices": []}, ["empty list"]),
    ({"devices": [0, -1]}, ["non-negative", "-1"]),
    ({"devices": [0, True]}, ["non-negative", "True"]),
    ({"devices": [1, 1]}, ["more than once"]),
    ({"device-filter": "0x20B0"}, ["'device-filter'", "0xDDDDVVVV", "0x20B0"]),
    ({"device-filter": "20B010DE"}, ["'device-filter'"]),
    ({"device-filter": ["0x20B010DE", "0x20B010DE:nope"]}, ["'device-filter'", "nope"]),
    ({"device-filter": []}, ["'device-filter'", "empty"]),
    ({"device-filter": None}, ["'device-filter'"]),
    ({"device-filter": 0x1FFFFFFFF}, ["'device-filter'"]),
    ({"mig-enabled": DROP}, ["'mig-enabled' is missing"]),
    ({"mig-enabled": "true"}, ["'mig-enabled'", "true or false", "'true'"]),
    ({"mig-enabled": 1}, ["'mig-enabled'"]),
    ({"mig-devices": DROP}, ["'mig-devices' is missing", "{}"]),
    ({"mig-enabled": False}, ["'mig-devices'", "absent or empty when MIG is disabled"]),
    ({"mig-devices": ["1g.5gb"]}, ["'mig-devices'", "mapping"]),
    ({"mig-devices": {"1g.5gb": -1}}, ["'mig-devices'", "'1g.5gb'", "non-negative", "-1"]),
    ({"mig-devices": {"1g.5gb": "2"}}, ["'mig-devices'", "'2'"]),
    ({"mig-devices": {"1g.5gb": True}}, ["'mig-devices'", "True"]),
    ({"mig-devices": {"1g.5gb": 1.5}}, ["'mig-devices'", "1.5"]),
    ({"mig-devices": {"1g.5gb": 0, "2g.10gb": 0}}, ["only zero counts", "{}"]),
    ({"mig-devices": {"1g5gb": 1}}, ["malformed profile name", "'1g5gb'"]),
    ({"mig-devices": {"3g.20GB": 1}}, ["malformed", "'3g.20GB'"]),
    ({"mig-devices": {"MIG 3g.20gb": 1}}, ["malformed"]),
    ({"mig-devices": {"1c.3g": 1}}, ["malformed"]),
    ({"mig-devices": {"0g.5gb": 1}}, ["malformed"]),
    ({"mig-devices": {"1g.5gb+": 1}}, ["malformed"]),
    ({"mig-devices": {"1g.24gb-me+gfx": 1}}, ["malformed"]),
    ({"mig-devices": {"1g.24gb-me-gfx": 1}}, ["malformed"]),
    ({"mig-devices": {"4c.3g.20gb": 1}}, ["more compute slices"]),
    ({"mig-devices": {7: 1}}, ["malformed", "7"]),
])
def test_entry_rejections_name_config_entry_and_key(entry, words):
    data = minimal(**entry)
    with pytest.raises(ConfigError) as err:
        load_config(data, origin="/etc/mig.yaml")
    text = str(err.value)
    assert text.startswith("/etc/mig.yaml: config 'cfg' entry [0] (devices: ")
    for word in words:
        assert word in text


def test_the_failing_entry_is_the_one_named():
    data = yaml.safe_load(FIXTURE_TEXT)
    data["mig-configs"]["all-balanced"][3]["mig-devices"]["2g.24gb"] = -2
    with pytest.raises(ConfigError) as err:
        load_config(data)
    assert "config 'all-balanced' entry [3] (devices: all; device-filter: 0x232110DE, 0x233A10DE)" in str(err.value)
    assert "'2g.24gb'" in str(err.value)


@pytest.mark.parametrize("name", ["1g.5gb", "1g.5gb+me", "1g.24gb+me.all", "1g.24gb-me", "1g.24gb+gfx",
                                  "1c.3g.20gb", "7g.180gb", "2c.7g.80gb", "1g.24gb+me+gfx"])
def test_well_formed_names_pass(name):
    config = load_config(minimal(**{"mig-devices": {name: 1}}))
    assert config.select()[0].mig_devices == {name: 1}


@pytest.mark.parametrize("data, words", [
    ({"mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}}, ["'version' is missing"]),
    ({"version": "v2", "mig-configs": {}}, ["unsupported version", "'v2'"]),
    ({"version": "v1"}, ["'mig-configs'"]),
    ({"version": "v1", "mig-configs": {}}, ["'mig-configs'", "non-empty"]),
    ({"version": "v1", "mig-configs": []}, ["'mig-configs'"]),
    ({"version": "v1", "mig-configs": {"a": []}}, ["config 'a'", "non-empty list"]),
    ({"version": "v1", "mig-configs": {"a": {"devices": "all"}}}, ["config 'a'", "list"]),
    ({"version": "v1", "mig-configs": {"a": ["all"]}}, ["config 'a' entry [0]", "mapping"]),
    ({"version": "v1", "mig-configs": {1: []}}, ["config names"]),
    ({"version": "v1", "mig-configs": {"a": []}, "hooks": {}}, ["unknown top-level", "'hooks'"]),
    ([1, 2], ["expected a mapping"]),
])
def test_file_level_rejections(data, words):
    with pytest.raises(ConfigError) as err:
        load_config(data)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("text, words", [
    ("version: v1\nmig-configs: {a: [\n", ["not valid YAML"]),
    ("", ["empty document"]),
    ("version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: false}\n  a:\n"
     "    - {devices: all, mig-enabled: true, mig-devices: {}}\n", ["duplicate key 'a'"]),
    ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n"
     "        1g.5gb: 1\n        1g.5gb: 2\n", ["duplicate key '1g.5gb'"]),
    ("version: v1\nmig-configs: !!python/object:os.system {}\n", ["not valid YAML"]),
])
def test_yaml_rejections(text, words):
    with pytest.raises(ConfigError) as err:
        load_config(text, origin="cfg.yaml")
    assert str(err.value).startswith("cfg.yaml: ")
    for word in words:
        assert word in str(err.value)


def test_unquoted_hex_filter_and_subsystem_part():
    text = ("version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: 0x20b010de\n"
            "      mig-enabled: false\n")
    (entry,) = load_config(text).select()
    assert entry.device_filter == (("0x20B010DE", None),)
    config = load_config(minimal(**{"device-filter": ["0x20B010DE:0x145f10de"]}))
    entries = config.select()
    assert entries[0].device_filter == (("0x20B010DE", "0x145F10DE"),)
    # Subsystem known: it must match. Unknown (None): only the device part is compared.
    assert len(resolve_targets(entries, [gpu(0, subsystem="0x145F10DE")]).targets) == 1
    assert len(resolve_targets(entries, [gpu(0, subsystem=0x147E10DE)]).targets) == 0
    assert len(resolve_targets(entries, [gpu(0)]).targets) == 1


# --------------------------------------------------------------------------
# Resolution rules
# --------------------------------------------------------------------------

def two_entries(first, second):
    return load_config({"version": "v1", "mig-configs": {"c": [first, second]}}).select()


def test_gpu_selected_twice_names_both_entries():
    entries = two_entries({"devices": "all", "mig-enabled": False},
                          {"devices": [2], "mig-enabled": True, "mig-devices": {}})
    with pytest.raises(ConfigError) as err:
        resolve_targets(entries, DGX_A100)
    text = str(err.value)
    assert "GPU 2 (A100-40GB)" in text and "entry [0] (devices: all)" in text and "entry [1] (devices: [2])" in text


def test_filters_make_overlapping_entries_disjoint():
    entries = two_entries({"devices": "all", "device-filter": PCI_IDS["A30"], "mig-enabled": False},
                          {"devices": "all", "device-filter": [PCI_IDS["A100-40GB"]], "mig-enabled": True,
                           "mig-devices": {"7g.40gb": 1}})
    result = resolve_targets(entries, [gpu(0), gpu(1, "A30")])
    assert [(t.gpu.index, t.mig_enabled) for t in result.targets] == [(0, True), (1, False)]


def test_devices_and_filter_both_apply():
    entries = load_config(minimal(devices=[0, 1], **{"device-filter": PCI_IDS["A30"]})).select()
    result = resolve_targets(entries, [gpu(0), gpu(1, "A30"), gpu(2, "A30")])
    assert [t.gpu.index for t in result.targets] == [1]


def test_non_mig_gpus():
    enable = load_config(minimal(devices=[4])).select()
    with pytest.raises(ConfigError) as err:
        resolve_targets(enable, MIXED_HOST)
    assert "GPU 4 (T4)" in str(err.value) and "not MIG-capable" in str(err.value)
    disable = load_config(minimal(devices=[4], **{"mig-enabled": False, "mig-devices": DROP})).select()
    result = resolve_targets(disable, MIXED_HOST)
    assert result.targets == () and [g.index for g, dummy in result.skipped] == [4]
    assert result.unmatched == disable


def test_filter_only_entry_that_matches_nothing_is_reported():
    entries = load_config(minimal(**{"device-filter": PCI_IDS["B200"]})).select()
    result = resolve_targets(entries, DGX_A100)
    assert result.targets == () and result.unmatched == entries
    assert resolve_targets(entries, []).unmatched == entries


def test_pci_ids():
    assert normalize_pci_id(0x20B010DE) == "0x20B010DE"
    assert normalize_pci_id("0X20b010de") == "0x20B010DE"
    for bad in ("20B010DE", "0x20B010D", True, -1, None):
        with pytest.raises(ConfigError):
            normalize_pci_id(bad)
    result = resolve_targets(load_config(minimal(**{"device-filter": "0x20b010de"})).select(),
                             [HostGpu(0, 0x20B010DE, True)])
    assert len(result.targets) == 1 and result.targets[0].gpu.label == "GPU 0"


# --------------------------------------------------------------------------
# Inline per-GPU layouts
# --------------------------------------------------------------------------

def test_layouts_convert_to_the_same_entries():
    layouts = [
        {"gpus": [0, 1, 2, 3], "mig_enabled": False},
        {"gpus": [4], "devices": {"1g.5gb": 7}},
        {"gpus": [5], "mig_enabled": True, "devices": {"2g.10gb": 3}},
        {"gpus": [6], "devices": {"3g.20gb": 2}},
        {"gpus": [7], "devices": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},
    ]
    from_layouts = resolve_targets(entries_from_layouts(layouts), DGX_A100)
    from_config = resolve_targets(load_config(FIXTURE_TEXT).select("custom-config"), DGX_A100)
    shape = [(t.gpu.index, t.mig_enabled, t.mig_devices) for t in from_layouts.targets]
    assert shape == [(t.gpu.index, t.mig_enabled, t.mig_devices) for t in from_config.targets]
    assert from_layouts.targets[4].entry.label == "layouts[1] (gpus: [4])"


def test_layouts_with_filters_and_enabled_empty():
    layouts = [{"gpus": "all", "device_filter": [PCI_IDS["H100-80GB"]], "devices": {}},
               {"gpus": "all", "device_filter": PCI_IDS["A30"], "devices": {"4g.24gb": 1}}]
    result = resolve_targets(entries_from_layouts(layouts), MIXED_HOST)
    assert [(t.gpu.index, t.mig_devices) for t in result.targets] == [(2, {}), (3, {"4g.24gb": 1})]


@pytest.mark.parametrize("layouts, words", [
    ([], ["non-empty list"]),
    ({"gpus": "all"}, ["non-empty list"]),
    (["all"], ["layouts[0]", "mapping"]),
    ([{"devices": {}}], ["layouts[0] (gpus: None)", "'gpus' is missing"]),
    ([{"gpus": "all", "devices": {}}, {"gpus": 3, "devices": {}}], ["layouts[1] (gpus: 3)", "'gpus'"]),
    ([{"gpus": "all"}], ["'devices' is missing", "{}"]),
    ([{"gpus": "all", "mig_enabled": False, "devices": {"1g.5gb": 1}}], ["'devices'", "absent or empty"]),
    ([{"gpus": "all", "mig-enabled": True, "devices": {}}], ["unknown key", "'mig-enabled'"]),
    ([{"gpus": "all", "device_filter": "A100", "devices": {}}],
     ["layouts[0] (gpus: all; device_filter: A100)", "'device_filter'"]),
    ([{"gpus": [0], "devices": {"3g.20gb": -1}}], ["'devices'", "non-negative"]),
])
def test_layout_rejections(layouts, words):
    with pytest.raises(ConfigError) as err:
        entries_from_layouts(layouts)
    for word in words:
        assert word in str(err.value)


# --------------------------------------------------------------------------
# Property: resolution is a partition of the selected GPUs
# --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, derandomize=True)
@given(models=st.lists(st.sampled_from(sorted(PCI_IDS) + ["T4"]), min_size=1, max_size=8),
       filters=st.lists(st.lists(st.sampled_from(sorted(PCI_IDS)), max_size=2, unique=True),
                        min_size=1, max_size=4))
def test_filter_entries_select_exactly_the_matching_gpus(models, filters):
    host = [gpu(i, m, capable=m != "T4") for i, m in enumerate(models)]
    entries = [{"devices": "all", "mig-enabled": False} if not f else
               {"devices": "all", "device-filter": [PCI_IDS[m] for m in f], "mig-enabled": False}
               for f in filters]
    config = load_config({"version": "v1", "mig-configs": {"c": entries}})
    expected_owner = {}
    conflict = False
    for k, f in enumerate(filters):
        for g in host:
            if g.mig_capable and (not f or g.name in f):
                conflict = conflict or g.index in expected_owner
                expected_owner.setdefault(g.index, k)
    if conflict:
        with pytest.raises(ConfigError, match="selected by two entries"):
            resolve_targets(config.select(), host)
        return
    result = resolve_targets(config.select(), host)
    assert {t.gpu.index: config.select().index(t.entry) for t in result.targets} == expected_owner
    assert sorted(g.index for g, dummy in result.skipped) == sorted(
        g.index for g in host if not g.mig_capable for f in filters if not f)
    selected_by = set(expected_owner.values())
    assert {config.select().index(e) for e in result.unmatched} == set(range(len(filters))) - selected_by


def test_fixture_is_not_modified_by_parsing():
    data = yaml.safe_load(FIXTURE_TEXT)
    before = copy.deepcopy(data)
    config = load_config(data)
    config.select("all-balanced")[0].mig_devices["1g.5gb"] = 99
    assert data == before
