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
}

DOCUMENTED_IDS = {
    7: {0: 19, 7: 20, 9: 15, 1: 14, 2: 9, 3: 5, 4: 0},   # constant -> profile id on 7-slice GPUs
    4: {0: 14, 7: 21, 1: 5, 8: 6, 3: 0},                  # A30 (2g+me id 6 is assumed)
}


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
        suffix = "+me" if profile.name.endswith("+me") else ""
        assert computed + suffix == profile.name, (key, profile)
        names.append(profile.name)
    assert sorted(names) == sorted(DOCUMENTED_NAMES[key])


@pytest.mark.parametrize("key", sorted(DOCUMENTED_NAMES))
def test_profile_geometry_is_consistent(key):
    model = models.MODELS[key]
    assert models.is_mig_capable(model)
    assert {c: p.id for c, p in model.gi_profiles.items()} == DOCUMENTED_IDS[model.sm_slices]
    for profile in model.gi_profiles.values():
        assert profile.memory_mib <= model.memory_mib
        assert profile.sm_slices <= model.sm_slices
        assert all(start % profile.memory_slices == 0 for start in profile.starts)
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
