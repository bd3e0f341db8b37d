# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated GPU catalog against the facts in mig-facts.md section 1."""

import math
from fractions import Fraction

import pytest

from gpuops_mig_sim import models

# Profile names per model as the reference documents them (mig-facts.md 1.1-1.9).
DOCUMENTED_NAMES = {
    "A100-SXM4-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-SXM4-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "A30-24GB": ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"],
    "H100-SXM5-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-NVL": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H200": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "B200": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
    # Newer GPUs: the names NVIDIA's mig-parted v0.15.0 config-default.yaml uses for them
    # (tests/unit/plugins/modules/fixtures/mig-parted-config-default-v0.15.0.yaml).
    "H100-96GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "GH200-96GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "H20": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
    "GH200-144GB": ["1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"],
    "GB200": ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"],
    "B300": ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"],
    "GB300": ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"],
    "H200-NVL": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "A800-SXM4-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "A800-PCIE-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "A800-PCIE-40GB": ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "H800-SXM5-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H800-PCIE-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H800-NVL": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "RTX-PRO-6000-BSE": ["1g.24gb", "1g.24gb+me", "1g.24gb+gfx", "1g.24gb-me", "1g.24gb+me.all",
                         "2g.48gb", "2g.48gb+gfx", "2g.48gb-me", "2g.48gb+me.all", "4g.96gb", "4g.96gb+gfx"],
}

# The models added for mig-parted v0.15.0's config-default.yaml (issue 12).
NEWER_MODELS = ["H100-96GB", "GH200-96GB", "H20", "GH200-144GB", "GB200", "B300", "GB300", "H200-NVL",
                "A800-SXM4-80GB", "A800-PCIE-80GB", "A800-PCIE-40GB", "H800-SXM5-80GB", "H800-PCIE-80GB",
                "H800-NVL", "RTX-PRO-6000-BSE"]

SEVEN_SLICE_IDS = {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0}   # constant -> profile id on 7-slice GPUs
A30_IDS = {0: 14, 7: 21, 1: 5, 8: 6, 3: 0}                          # A30 (2g+me id 6 is assumed)
# RTX PRO 6000 Blackwell (mig-facts.md 1.10: -lgip captures).
RTX_PRO_IDS = {0: 14, 7: 21, 10: 47, 13: 67, 15: 65, 1: 5, 11: 35, 14: 66, 16: 64, 3: 0, 12: 32}


def documented_ids(key):
    if key == "A30-24GB":
        return A30_IDS
    if key.startswith("RTX-PRO-6000"):
        return RTX_PRO_IDS
    return SEVEN_SLICE_IDS


# go-nvlib's attribute suffix per profile constant.
SUFFIX = {7: "+me", 8: "+me", 10: "+gfx", 11: "+gfx", 12: "+gfx", 13: "-me", 14: "-me", 15: "+me.all",
          16: "+me.all"}


def go_nvlib_memory_gb(memory_size_mb, total_memory_mib):
    """go-nvlib getMigMemorySizeGB: fraction rounded up to 1/8, times total GiB (rounded up), rounded half up."""
    fraction = Fraction(memory_size_mb, total_memory_mib)
    fraction = Fraction(math.ceil(fraction * 8), 8)
    total_gib = -(-total_memory_mib // 1024)
    return math.floor(fraction * total_gib + Fraction(1, 2))   # Go's math.Round, not banker's round()


def test_go_nvlib_formula_rounds_half_up():
    # 1/8 of 180 GiB is 22.5: Go rounds to 23 where Python's round() would give 22.
    assert go_nvlib_memory_gb(22528, 183359) == 23
    assert round(22.5) == 22


@pytest.mark.parametrize("key", sorted(DOCUMENTED_NAMES))
def test_memory_sizes_reproduce_documented_profile_names(key):
    model = models.MODELS[key]
    names = []
    for profile in model.gi_profiles.values():
        computed = "%dg.%dgb" % (profile.sm_slices, go_nvlib_memory_gb(profile.memory_mib, model.memory_mib))
        assert computed + SUFFIX.get(profile.constant, "") == profile.name, (key, profile)
        names.append(profile.name)
    assert sorted(names) == sorted(DOCUMENTED_NAMES[key])


@pytest.mark.parametrize("key", sorted(DOCUMENTED_NAMES))
def test_profile_geometry_is_consistent(key):
    model = models.MODELS[key]
    assert models.is_mig_capable(model)
    assert {c: p.id for c, p in model.gi_profiles.items()} == documented_ids(key)
    for profile in model.gi_profiles.values():
        assert profile.memory_mib <= model.memory_mib
        assert profile.sm_slices <= model.sm_slices
        assert all(start % profile.memory_slices == 0 for start in profile.starts)
        assert profile.starts == tuple(range(0, model.memory_slices - profile.memory_slices + 1,
                                             profile.memory_slices))[:len(profile.starts)]
        assert all(start + profile.memory_slices <= model.memory_slices for start in profile.starts)
        assert 1 <= profile.max_count <= len(profile.starts)


def test_documented_placements_on_a100():
    profiles = models.MODELS["A100-SXM4-40GB"].gi_profiles
    assert profiles[models.GI_1_SLICE].starts == (0, 1, 2, 3, 4, 5, 6)
    assert profiles[models.GI_1_SLICE_REV2].starts == (0, 2, 4, 6)
    assert profiles[models.GI_2_SLICE].starts == (0, 2, 4)
    assert (profiles[models.GI_3_SLICE].starts, profiles[models.GI_3_SLICE].memory_slices) == ((0, 4), 4)
    assert (profiles[models.GI_7_SLICE].starts, profiles[models.GI_7_SLICE].memory_slices) == ((0,), 8)


@pytest.mark.parametrize("key, name, pci, mib, arch", [
    ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 0x20B010DE, 40960, 7),
    ("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 0x20B210DE, 81920, 7),
    ("A30-24GB", "NVIDIA A30", 0x20B710DE, 24576, 7),
    ("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 0x233010DE, 81559, 9),
    ("H100-NVL", "NVIDIA H100 NVL", 0x232110DE, 95830, 9),
    ("H200", "NVIDIA H200", 0x233510DE, 143771, 9),
    ("B200", "NVIDIA B200", 0x290110DE, 183359, 10),
    ("H100-96GB", "NVIDIA H100 96GB", 0x233D10DE, 97871, 9),
    ("GH200-96GB", "NVIDIA GH200 480GB", 0x234210DE, 97871, 9),
    ("GH200-144GB", "NVIDIA GH200 144G HBM3e", 0x234810DE, 146944, 9),
    ("H20", "NVIDIA H20", 0x232910DE, 97871, 9),
    ("GB200", "NVIDIA GB200", 0x294110DE, 189471, 10),
    ("B300", "NVIDIA B300 SXM6 AC", 0x318210DE, 275040, 10),
    ("GB300", "NVIDIA GB300", 0x31C210DE, 284208, 10),
    ("RTX-PRO-6000-BSE", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB510DE, 97887, 10),
    ("H200-NVL", "NVIDIA H200 NVL", 0x233B10DE, 143771, 9),
    ("A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", 0x20F310DE, 81920, 7),
    ("A800-PCIE-80GB", "NVIDIA A800 80GB PCIe", 0x20F510DE, 81920, 7),
    ("A800-PCIE-40GB", "NVIDIA A800 40GB PCIe", 0x20F610DE, 40960, 7),
    ("H800-SXM5-80GB", "NVIDIA H800", 0x232410DE, 81559, 9),
    ("H800-PCIE-80GB", "NVIDIA H800 PCIe", 0x232210DE, 81559, 9),
    ("H800-NVL", "NVIDIA H800 NVL", 0x233A10DE, 95830, 9),
    ("A10", "NVIDIA A10", 0x223610DE, 23028, 7),
    ("L40S", "NVIDIA L40S", 0x26B910DE, 46068, 8),
])
def test_model_identity(key, name, pci, mib, arch):
    model = models.get_model(key)
    assert (model.name, model.pci_device_id, model.memory_mib, model.architecture) == (name, pci, mib, arch)


def test_non_mig_models_have_no_profiles():
    assert not models.is_mig_capable(models.MODELS["A10"])
    assert not models.is_mig_capable(models.MODELS["L40S"])


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU model 'V100'.*A100-SXM4-40GB"):
        models.get_model("V100")


@pytest.mark.parametrize("g, expected", [
    (1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (4, [1, 2, 4]), (7, [1, 2, 3, 4, 7]),
])
def test_compute_instance_rule(g, expected):
    assert [c for c in sorted(set(models.CI_PROFILE_SLICES.values())) if models.ci_profile_valid(c, g)] == expected


def test_compute_instance_placements():
    assert models.ci_placement_starts(1, 4) == (0, 1, 2, 3)
    assert models.ci_placement_starts(2, 4) == (0, 2)
    assert models.ci_placement_starts(4, 4) == (0,)
    assert models.ci_placement_starts(3, 7) == (0, 3)


def test_documented_placements_on_rtx_pro_6000():
    # A 12-unit grid: 1g is 3 units at 0,3,6,9, 2g is 6 units at 0,6, 4g the whole GPU (-lgipp capture).
    model = models.MODELS["RTX-PRO-6000-BSE"]
    assert (model.memory_slices, model.sm_slices) == (12, 4)
    for profile in model.gi_profiles.values():
        expected = {1: ((0, 3, 6, 9), 3), 2: ((0, 6), 6), 4: ((0,), 12)}[profile.sm_slices]
        assert (profile.starts, profile.memory_slices) == expected, profile.name


@pytest.mark.parametrize("key, counts", [
    # name -> max count, as the all-<profile> configs of config-default.yaml ask for them.
    ("RTX-PRO-6000-BSE", {"1g.24gb": 4, "1g.24gb+me": 1, "1g.24gb+gfx": 4, "1g.24gb-me": 4, "1g.24gb+me.all": 1,
                          "2g.48gb": 2, "2g.48gb+gfx": 2, "2g.48gb-me": 2, "2g.48gb+me.all": 1,
                          "4g.96gb": 1, "4g.96gb+gfx": 1}),
    ("GB300", {"1g.35gb": 7, "1g.35gb+me": 1, "1g.70gb": 4, "2g.70gb": 3, "3g.139gb": 2, "4g.139gb": 1,
               "7g.278gb": 1}),
    ("B300", {"1g.34gb": 7, "1g.34gb+me": 1, "1g.67gb": 4, "2g.67gb": 3, "3g.135gb": 2, "4g.135gb": 1,
              "7g.269gb": 1}),
])
def test_max_counts_match_the_all_profile_configs(key, counts):
    assert {p.name: p.max_count for p in models.MODELS[key].gi_profiles.values()} == counts


@pytest.mark.parametrize("key", NEWER_MODELS)
def test_newer_model_is_complete_and_says_what_is_assumed(key):
    model = models.MODELS[key]
    assert models.is_mig_capable(model)
    assert model.architecture in (models.ARCH_AMPERE, models.ARCH_HOPPER, models.ARCH_BLACKWELL)
    # None of these was captured on hardware: each says so (docs/simulator.md lists the notes).
    assert model.assumed and all(isinstance(note, str) and note for note in model.assumed)
    for profile in model.gi_profiles.values():
        assert profile.sm_count > 0 and profile.copy_engines > 0
        assert max(profile.starts) + profile.memory_slices <= model.memory_slices
    # Every CI profile the go-nvlib rule allows exists for every GI profile.
    for profile in model.gi_profiles.values():
        assert [c for c in sorted(set(models.CI_PROFILE_SLICES.values()))
                if models.ci_profile_valid(c, profile.sm_slices)]


@pytest.mark.parametrize("key, pci_ids", [
    # device-filter IDs of config-default.yaml (v0.15.0) that name each model.
    ("GB200", ["0x294110DE"]), ("GB300", ["0x31C210DE"]), ("B300", ["0x318210DE"]),
    ("RTX-PRO-6000-BSE", ["0x2BB510DE"]), ("GH200-144GB", ["0x234810DE"]), ("H200-NVL", ["0x233B10DE"]),
    ("H800-NVL", ["0x233A10DE"]), ("GH200-96GB", ["0x234210DE"]), ("H100-96GB", ["0x233D10DE"]),
    ("H20", ["0x232910DE"]), ("H800-SXM5-80GB", ["0x232410DE"]), ("H800-PCIE-80GB", ["0x232210DE"]),
    ("A800-SXM4-80GB", ["0x20F310DE"]), ("A800-PCIE-80GB", ["0x20F510DE"]), ("A800-PCIE-40GB", ["0x20F610DE"]),
])
def test_newer_model_pci_ids(key, pci_ids):
    assert "0x%08X" % models.MODELS[key].pci_device_id in pci_ids
