# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

# Catalog of the GPU models the simulated driver (_nvml_sim) can present.
# PRIVATE to the gpuops.mig test tooling; may change at any time.
#
# Numbers come from read-only NVML captures of real GPUs (tests/data/nvml-captures,
# made with tools/mig-probe) and the project's reference notes (mig-facts.md
# section 1): `nvidia-smi mig -lgip/-lgipp` captures, the MIG User Guide and the
# go-nvml mocks. Where no capture exists the value is an expectation and the entry says
# so in its `assumed` notes (docs/simulator.md lists them all). Memory sizes are
# chosen so that go-nvlib's naming formula turns them into the documented
# profile names (1g.5gb, 3g.71gb, ...).

import collections

# NVML architecture constants (nvmlDeviceArchitecture_t).
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10

# NVML GPU-instance profile constants (NVML_GPU_INSTANCE_PROFILE_*).
GI_1_SLICE = 0
GI_2_SLICE = 1
GI_3_SLICE = 2
GI_4_SLICE = 3
GI_7_SLICE = 4
GI_1_SLICE_REV1 = 7
GI_2_SLICE_REV1 = 8
GI_1_SLICE_REV2 = 9
# Constants at or above this are INVALID_ARGUMENT (driver 580 knows 0..16; pynvml 13 lists 18).
GI_PROFILE_COUNT = 17

# NVML compute-instance profile constants (NVML_COMPUTE_INSTANCE_PROFILE_*):
# constant -> SM slices. The CI profile id equals the constant.
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 6: 6}
CI_PROFILE_COUNT = 9

GpuInstanceProfile = collections.namedtuple("GpuInstanceProfile", [
    "constant",        # NVML_GPU_INSTANCE_PROFILE_* value
    "id",              # device-specific profile id (info.id, the `-lgip` ID column)
    "name",            # e.g. "1g.5gb+me" (NVML reports "MIG " + name)
    "memory_slices",   # placement size
    "sm_slices",       # the "g" of the name
    "max_count",       # info.instanceCount
    "memory_mib",      # info.memorySizeMB
    "sm_count",        # info.multiprocessorCount
    "copy_engines",
    "decoders",
    "encoders",
    "jpegs",
    "ofas",
    "starts",          # legal placement starts, in memory slices
])

GpuModel = collections.namedtuple("GpuModel", [
    "key",                 # catalog key used in state files and --gpus specs
    "name",                # nvmlDeviceGetName
    "pci_device_id",       # nvmlPciInfo_t.pciDeviceId, 0xDDDDVVVV
    "memory_mib",          # nvmlDeviceGetMemoryInfo total, in MiB
    "architecture",        # ARCH_*
    "compute_capability",  # (major, minor)
    "memory_slices",       # 0 when not MIG-capable
    "sm_slices",           # 0 when not MIG-capable; also the max MIG device count
    "gi_profiles",         # {constant: GpuInstanceProfile}; empty when not MIG-capable
    "assumed",             # notes on values no capture confirmed
])

# Shared layout of the 7-SM-slice, 8-memory-slice GPUs (A100, H100, H200, B200):
# (constant, profile id, memory slices, SM slices, max count, placement starts, suffix).
_SEVEN_SLICE_LAYOUT = (
    (GI_1_SLICE, 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), ""),
    (GI_1_SLICE_REV1, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), "+me"),
    (GI_1_SLICE_REV2, 15, 2, 1, 4, (0, 2, 4, 6), ""),
    (GI_2_SLICE, 14, 2, 2, 3, (0, 2, 4), ""),
    (GI_3_SLICE, 9, 4, 3, 2, (0, 4), ""),
    (GI_4_SLICE, 5, 4, 4, 1, (0,), ""),
    (GI_7_SLICE, 0, 8, 7, 1, (0,), ""),
)

# A30: 4 SM slices, 4 memory slices. The 2g+me id (6) was never seen in a capture.
_FOUR_SLICE_LAYOUT = (
    (GI_1_SLICE, 14, 1, 1, 4, (0, 1, 2, 3), ""),
    (GI_1_SLICE_REV1, 21, 1, 1, 1, (0, 1, 2, 3), "+me"),
    (GI_2_SLICE, 5, 2, 2, 2, (0, 2), ""),
    (GI_2_SLICE_REV1, 6, 2, 2, 1, (0, 2), "+me"),
    (GI_4_SLICE, 0, 4, 4, 1, (0,), ""),
)


def _profiles(layout, rows):
    """Join a layout with per-model rows of (memory GB in the name, MiB, SMs, engines).

    engines = (copy, decoder, encoder, jpeg, ofa); approximate, see docs/simulator.md.
    """
    if len(layout) != len(rows):
        raise ValueError("layout and rows differ in length")
    profiles = {}
    for (constant, pid, mem_slices, g, max_count, starts, suffix), (gb, mib, sms, engines) in zip(layout, rows):
        copy, dec, enc, jpeg, ofa = engines
        profiles[constant] = GpuInstanceProfile(
            constant=constant, id=pid, name="%dg.%dgb%s" % (g, gb, suffix),
            memory_slices=mem_slices, sm_slices=g, max_count=max_count, memory_mib=mib,
            sm_count=sms, copy_engines=copy, decoders=dec, encoders=enc, jpegs=jpeg, ofas=ofa,
            starts=starts)
    return profiles


# Engine counts (copy, decoder, encoder, jpeg, ofa) per 7-slice profile, in layout order.
_AMPERE_ENGINES = ((1, 0, 0, 0, 0), (1, 1, 0, 1, 1), (1, 1, 0, 0, 0), (2, 1, 0, 0, 0),
                   (3, 2, 0, 0, 0), (4, 2, 0, 0, 0), (7, 5, 0, 1, 1))
_HOPPER_ENGINES = ((1, 1, 0, 1, 0), (1, 1, 0, 1, 1), (1, 1, 0, 1, 0), (2, 2, 0, 2, 0),
                   (3, 3, 0, 3, 0), (4, 4, 0, 4, 0), (8, 7, 0, 7, 1))
_BLACKWELL_ENGINES = ((2, 1, 0, 1, 0), (2, 1, 0, 1, 1), (2, 1, 0, 1, 0), (3, 1, 0, 1, 0),
                      (6, 1, 0, 1, 0), (8, 1, 0, 1, 0), (16, 1, 0, 1, 1))
_A30_ENGINES = ((1, 0, 0, 0, 0), (1, 1, 0, 1, 1), (2, 2, 0, 0, 0), (2, 2, 0, 1, 1), (4, 4, 0, 1, 1))

_ENGINES_NOTE = "copy/decoder/encoder/jpeg/ofa engine counts are approximate"


def _rows(gbs, mibs, sms, engines):
    return list(zip(gbs, mibs, sms, engines))


_CATALOG = (
    GpuModel(
        key="A100-SXM4-40GB", name="NVIDIA A100-SXM4-40GB", pci_device_id=0x20B010DE, memory_mib=40960,
        architecture=ARCH_AMPERE, compute_capability=(8, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (5, 5, 10, 10, 20, 20, 40),
            (4864, 4864, 9856, 9856, 19968, 19968, 40192),
            (14, 14, 14, 28, 42, 56, 98),
            _AMPERE_ENGINES)),
        assumed=(_ENGINES_NOTE,)),
    GpuModel(
        key="A100-SXM4-80GB", name="NVIDIA A100-SXM4-80GB", pci_device_id=0x20B210DE, memory_mib=81920,
        architecture=ARCH_AMPERE, compute_capability=(8, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (10, 10, 20, 20, 40, 40, 80),
            (9728, 9728, 19968, 19968, 40192, 40192, 80384),
            (14, 14, 14, 28, 42, 56, 98),
            _AMPERE_ENGINES)),
        assumed=(_ENGINES_NOTE,
                 "memory of 1g.20gb and 7g.80gb from the go-nvml mock (no -lgip capture)")),
    GpuModel(
        key="A30-24GB", name="NVIDIA A30", pci_device_id=0x20B710DE, memory_mib=24576,
        architecture=ARCH_AMPERE, compute_capability=(8, 0), memory_slices=4, sm_slices=4,
        gi_profiles=_profiles(_FOUR_SLICE_LAYOUT, _rows(
            (6, 6, 12, 12, 24),
            (5952, 5952, 11968, 11968, 24064),
            (14, 14, 28, 28, 56),
            _A30_ENGINES)),
        assumed=(_ENGINES_NOTE, "2g.12gb+me profile id 6 (never captured)")),
    GpuModel(
        key="H100-SXM5-80GB", name="NVIDIA H100 80GB HBM3", pci_device_id=0x233010DE, memory_mib=81559,
        architecture=ARCH_HOPPER, compute_capability=(9, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (10, 10, 20, 20, 40, 40, 80),
            (9984, 9984, 20096, 20096, 40448, 40448, 81152),
            (16, 16, 26, 32, 60, 64, 132),
            _HOPPER_ENGINES)),
        assumed=()),  # every GI profile value checked against driver 580.159.04 (tests/data/nvml-captures)
    GpuModel(
        key="H100-NVL", name="NVIDIA H100 NVL", pci_device_id=0x232110DE, memory_mib=95830,
        architecture=ARCH_HOPPER, compute_capability=(9, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (12, 12, 24, 24, 47, 47, 94),
            (11008, 11008, 22144, 22144, 47488, 47488, 95360),
            (16, 16, 26, 32, 60, 64, 132),
            _HOPPER_ENGINES)),
        assumed=(_ENGINES_NOTE,)),
    GpuModel(
        key="H200", name="NVIDIA H200", pci_device_id=0x233510DE, memory_mib=143771,
        architecture=ARCH_HOPPER, compute_capability=(9, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (18, 18, 35, 35, 71, 71, 141),
            (16384, 16384, 33280, 33280, 71424, 71424, 143360),
            (16, 16, 26, 32, 60, 64, 132),
            _HOPPER_ENGINES)),
        assumed=()),  # every GI profile value checked against driver 580.159.04 (tests/data/nvml-captures)
    GpuModel(
        key="B200", name="NVIDIA B200", pci_device_id=0x290110DE, memory_mib=183359,
        architecture=ARCH_BLACKWELL, compute_capability=(10, 0), memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(
            (23, 23, 45, 45, 90, 90, 180),
            (22528, 22528, 45312, 45312, 90880, 90880, 182528),
            (18, 18, 30, 36, 60, 72, 144),
            _BLACKWELL_ENGINES)),
        assumed=(_ENGINES_NOTE,
                 "placements: the 8-slot A100/H100 layout (no -lgipp capture)",
                 "3g.90gb/4g.90gb/7g.180gb memory and SM counts (not in any capture)")),
    GpuModel(
        key="A10", name="NVIDIA A10", pci_device_id=0x223610DE, memory_mib=23028,
        architecture=ARCH_AMPERE, compute_capability=(8, 6), memory_slices=0, sm_slices=0,
        gi_profiles={}, assumed=()),
    GpuModel(
        key="L40S", name="NVIDIA L40S", pci_device_id=0x26B910DE, memory_mib=46068,
        architecture=ARCH_ADA, compute_capability=(8, 9), memory_slices=0, sm_slices=0,
        gi_profiles={}, assumed=()),
)

MODELS = collections.OrderedDict((model.key, model) for model in _CATALOG)

# Assumptions that hold for every model (per-model ones are in GpuModel.assumed).
CATALOG_ASSUMED = (
    "compute-instance placements: the go-nvml mock pattern (multiples of c that fit in the GI)",
    "isP2pSupported and pciSubSystemId are 0",
)


def get_model(key):
    """The model for a catalog key; ValueError naming the known keys otherwise."""
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError("unknown GPU model %r; known models: %s" % (key, ", ".join(MODELS)))


def is_mig_capable(model):
    return bool(model.gi_profiles)


def gi_profile_by_id(model, profile_id):
    """The GPU-instance profile with this device-specific id, or None."""
    for profile in model.gi_profiles.values():
        if profile.id == profile_id:
            return profile
    return None


def ci_profile_valid(ci_slices, gi_slices):
    """go-nvlib's rule: c <= g and, when c < g, 2c <= g + 1 (so a 4g has no 3c)."""
    if ci_slices > gi_slices:
        return False
    return ci_slices == gi_slices or 2 * ci_slices <= gi_slices + 1


def ci_placement_starts(ci_slices, gi_slices):
    """Starts (SM slices inside the GI) at multiples of c that fit: 1c 0..g-1, 2c 0,2,.., c == g at 0."""
    return tuple(range(0, gi_slices - ci_slices + 1, ci_slices))
