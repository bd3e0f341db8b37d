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
# Graphics (+gfx), no media engines (-me) and all media engines (+me.all): RTX PRO Blackwell.
GI_1_SLICE_GFX = 10
GI_2_SLICE_GFX = 11
GI_4_SLICE_GFX = 12
GI_1_SLICE_NO_ME = 13
GI_2_SLICE_NO_ME = 14
GI_1_SLICE_ALL_ME = 15
GI_2_SLICE_ALL_ME = 16
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


# RTX PRO 6000 Blackwell: 4 SM slices on a 12-unit placement grid (1g is 3 units, 2g 6, 4g 12).
# IDs and placements from public `nvidia-smi mig -lgip/-lgipp` captures (mig-facts.md 1.10).
_RTX_PRO_LAYOUT = (
    (GI_1_SLICE, 14, 3, 1, 4, (0, 3, 6, 9), ""),
    (GI_1_SLICE_REV1, 21, 3, 1, 1, (0, 3, 6, 9), "+me"),
    (GI_1_SLICE_GFX, 47, 3, 1, 4, (0, 3, 6, 9), "+gfx"),
    (GI_1_SLICE_NO_ME, 67, 3, 1, 4, (0, 3, 6, 9), "-me"),
    (GI_1_SLICE_ALL_ME, 65, 3, 1, 1, (0, 3, 6, 9), "+me.all"),
    (GI_2_SLICE, 5, 6, 2, 2, (0, 6), ""),
    (GI_2_SLICE_GFX, 35, 6, 2, 2, (0, 6), "+gfx"),
    (GI_2_SLICE_NO_ME, 66, 6, 2, 2, (0, 6), "-me"),
    (GI_2_SLICE_ALL_ME, 64, 6, 2, 1, (0, 6), "+me.all"),
    (GI_4_SLICE, 0, 12, 4, 1, (0,), ""),
    (GI_4_SLICE_GFX, 32, 12, 4, 1, (0,), "+gfx"),
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
# The 1g and 2g rows from B200 `-lgip` captures (mig-parted PR #166); the others approximate.
_BLACKWELL_ENGINES = ((2, 1, 0, 1, 0), (2, 1, 0, 1, 1), (2, 1, 0, 1, 0), (4, 2, 0, 2, 0),
                      (6, 1, 0, 1, 0), (8, 1, 0, 1, 0), (16, 1, 0, 1, 1))
_A30_ENGINES = ((1, 0, 0, 0, 0), (1, 1, 0, 1, 1), (2, 2, 0, 0, 0), (2, 2, 0, 1, 1), (4, 4, 0, 1, 1))
# GB200: the 1g and 2g rows from `-lgip` captures (gpu-operator PR #1303, mig-parted issue #227).
_GB200_ENGINES = _BLACKWELL_ENGINES
# RTX PRO 6000, in _RTX_PRO_LAYOUT order. The 2g rows and 1g-me from a capture (bigstack-oss/cubecos
# issue #312); the others by analogy with them.
_RTX_PRO_ENGINES = ((1, 1, 1, 1, 0), (1, 1, 1, 1, 1), (1, 1, 1, 1, 0), (1, 0, 0, 0, 0), (1, 4, 4, 4, 1),
                    (2, 2, 2, 2, 0), (2, 2, 2, 2, 0), (2, 0, 0, 0, 0), (2, 4, 4, 4, 1),
                    (4, 4, 4, 4, 1), (4, 4, 4, 4, 1))

_ENGINES_NOTE = "copy/decoder/encoder/jpeg/ofa engine counts are approximate"


def _rows(gbs, mibs, sms, engines):
    return list(zip(gbs, mibs, sms, engines))


def _variant(model, key, name, pci_device_id, assumed):
    """Another board with the same MIG geometry (A800/H800 export variants, NVL parts)."""
    return model._replace(key=key, name=name, pci_device_id=pci_device_id, assumed=model.assumed + assumed)


# Per-profile numbers shared by several models, in _SEVEN_SLICE_LAYOUT order.
_HOPPER_SMS = (16, 16, 26, 32, 60, 64, 132)
_BLACKWELL_SMS = (18, 18, 30, 36, 60, 72, 144)
_H100_80_MIB = (9984, 9984, 20096, 20096, 40448, 40448, 81152)
_H100_96_MIB = (11008, 11008, 22144, 22144, 47488, 47488, 95360)
_H200_MIB = (16384, 16384, 33280, 33280, 71424, 71424, 143360)
_A100_40_MIB = (4864, 4864, 9856, 9856, 19968, 19968, 40192)
_A100_80_MIB = (9728, 9728, 19968, 19968, 40192, 40192, 80384)

_NAME_NOTE = "nvmlDeviceGetName string (never captured; the board's marketing name)"
_NAMES_ONLY_NOTE = ("memorySizeMB of every profile: chosen so go-nvlib's formula gives the profile names of "
                    "mig-parted's config-default.yaml (no -lgip capture)")
_SM_NOTE = "SM counts per profile (no capture; those of the closest captured GPU)"
_IDS_NOTE = "profile IDs and placements: the 7-slice pattern (19/20/15/14/9/5/0, 8-slot layout; no capture)"


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

_BY_KEY = {model.key: model for model in _CATALOG}


def _seven_slice(key, name, pci_device_id, memory_mib, architecture, compute_capability, gbs, mibs, sms,
                 engines, assumed):
    return GpuModel(
        key=key, name=name, pci_device_id=pci_device_id, memory_mib=memory_mib, architecture=architecture,
        compute_capability=compute_capability, memory_slices=8, sm_slices=7,
        gi_profiles=_profiles(_SEVEN_SLICE_LAYOUT, _rows(gbs, mibs, sms, engines)), assumed=assumed)


# NVIDIA's newer GPUs and the variants mig-parted's config-default.yaml (v0.15.0) names. Profile names
# and counts from that file and the MIG User Guide; PCI IDs from its device-filters. Where a value
# comes from nowhere better, the model says so in `assumed` (docs/simulator.md has the table).
_NEWER = (
    _seven_slice(
        "H100-96GB", "NVIDIA H100 96GB", 0x233D10DE, 97871, ARCH_HOPPER, (9, 0),
        (12, 12, 24, 24, 48, 48, 96), _H100_96_MIB, _HOPPER_SMS, _HOPPER_ENGINES,
        (_NAME_NOTE, "total memory 97871 MiB", _NAMES_ONLY_NOTE, _SM_NOTE, _IDS_NOTE, _ENGINES_NOTE)),
    _seven_slice(
        "GH200-96GB", "NVIDIA GH200 480GB", 0x234210DE, 97871, ARCH_HOPPER, (9, 0),
        (12, 12, 24, 24, 48, 48, 96), _H100_96_MIB, _HOPPER_SMS, _HOPPER_ENGINES,
        (_NAME_NOTE, "total memory 97871 MiB", _NAMES_ONLY_NOTE, _SM_NOTE, _IDS_NOTE, _ENGINES_NOTE)),
    _seven_slice(
        "GH200-144GB", "NVIDIA GH200 144G HBM3e", 0x234810DE, 146944, ARCH_HOPPER, (9, 0),
        (18, 18, 36, 36, 72, 72, 144), (17920, 17920, 36096, 36096, 72192, 72192, 144384),
        _HOPPER_SMS, _HOPPER_ENGINES,
        (_NAME_NOTE, "total memory 146944 MiB",
         "3g.72gb/4g.72gb/7g.144gb memory and SM counts (the 1g and 2g rows are from a -lgip capture)",
         "placements: the 8-slot layout (no -lgipp capture)",
         "3g/4g/7g engine counts (those of H100)")),
    _seven_slice(
        "H20", "NVIDIA H20", 0x232910DE, 97871, ARCH_HOPPER, (9, 0),
        (12, 12, 24, 24, 48, 48, 96), _H100_96_MIB, (8, 8, 14, 16, 30, 32, 60), _HOPPER_ENGINES,
        (_NAME_NOTE, "total memory 97871 MiB", _NAMES_ONLY_NOTE,
         "SM counts per profile (no capture; scaled to the H20's 78 SMs)", _IDS_NOTE, _ENGINES_NOTE)),
    _seven_slice(
        "GB200", "NVIDIA GB200", 0x294110DE, 189471, ARCH_BLACKWELL, (10, 0),
        (23, 23, 47, 47, 93, 93, 186), (22528, 22528, 46592, 46592, 93184, 93184, 186368),
        (18, 18, 32, 38, 60, 72, 144), _GB200_ENGINES,
        (_NAME_NOTE, "total memory 189471 MiB (names as on the driver of mig-parted issue #227; "
                     "other drivers name the same profiles 1g.24gb, 3g.95gb, 7g.189gb)",
         "3g.93gb/4g.93gb/7g.186gb memory and SM counts (the 1g and 2g rows are from -lgip captures)",
         "placements: the 8-slot layout (no -lgipp capture)", _ENGINES_NOTE)),
    _seven_slice(
        "B300", "NVIDIA B300 SXM6 AC", 0x318210DE, 275040, ARCH_BLACKWELL, (10, 3),
        (34, 34, 67, 67, 135, 135, 269), (33024, 33024, 66816, 66816, 134400, 134400, 270336),
        _BLACKWELL_SMS, _BLACKWELL_ENGINES,
        (_NAME_NOTE, "total memory 275040 MiB", _NAMES_ONLY_NOTE, _SM_NOTE, _IDS_NOTE, _ENGINES_NOTE)),
    _seven_slice(
        "GB300", "NVIDIA GB300", 0x31C210DE, 284208, ARCH_BLACKWELL, (10, 3),
        (35, 35, 70, 70, 139, 139, 278), (34560, 34560, 69632, 69632, 139776, 139776, 279552),
        _BLACKWELL_SMS, _BLACKWELL_ENGINES,
        (_NAME_NOTE, "total memory 284208 MiB", _NAMES_ONLY_NOTE, _SM_NOTE, _IDS_NOTE, _ENGINES_NOTE)),
    GpuModel(
        key="RTX-PRO-6000-BSE", name="NVIDIA RTX PRO 6000 Blackwell Server Edition", pci_device_id=0x2BB510DE,
        memory_mib=97887, architecture=ARCH_BLACKWELL, compute_capability=(12, 0), memory_slices=12,
        sm_slices=4,
        gi_profiles=_profiles(_RTX_PRO_LAYOUT, _rows(
            (24,) * 5 + (48,) * 4 + (96,) * 2,
            (23675,) * 5 + (47616,) * 4 + (95232,) * 2,
            (46,) * 5 + (94,) * 4 + (188,) * 2,
            _RTX_PRO_ENGINES)),
        assumed=(_NAME_NOTE, "total memory 97887 MiB",
                 "4g.96gb and 4g.96gb+gfx memory (the 1g and 2g memory are from a -lgip capture)",
                 "1g SM count 46 for every 1g profile and 188 for 4g (captured: 1g.24gb-me 46, 2g 94)",
                 "engine counts of 1g, 1g+me, 1g+gfx, 1g+me.all and 4g (by analogy with the captured "
                 "2g and 1g-me rows)")),
    _variant(_BY_KEY["H200"], "H200-NVL", "NVIDIA H200 NVL", 0x233B10DE,
             (_NAME_NOTE, "every MIG value: those of the H200 SXM (same memory; no capture of the NVL)")),
    _variant(_BY_KEY["A100-SXM4-80GB"], "A800-SXM4-80GB", "NVIDIA A800-SXM4-80GB", 0x20F310DE,
             (_NAME_NOTE, "every MIG value: those of the A100-SXM4-80GB (export variant)")),
    _variant(_BY_KEY["A100-SXM4-80GB"], "A800-PCIE-80GB", "NVIDIA A800 80GB PCIe", 0x20F510DE,
             (_NAME_NOTE, "every MIG value: those of the A100-SXM4-80GB (export variant)")),
    _variant(_BY_KEY["A100-SXM4-40GB"], "A800-PCIE-40GB", "NVIDIA A800 40GB PCIe", 0x20F610DE,
             (_NAME_NOTE, "every MIG value: those of the A100-SXM4-40GB (export variant)")),
    _variant(_BY_KEY["H100-SXM5-80GB"], "H800-SXM5-80GB", "NVIDIA H800", 0x232410DE,
             (_NAME_NOTE, "every MIG value: those of the H100-SXM5-80GB (export variant; not captured)")),
    _variant(_BY_KEY["H100-SXM5-80GB"], "H800-PCIE-80GB", "NVIDIA H800 PCIe", 0x232210DE,
             (_NAME_NOTE, "every MIG value: those of the H100-SXM5-80GB (the PCIe board has fewer SMs; "
                          "not captured)")),
    _variant(_BY_KEY["H100-NVL"], "H800-NVL", "NVIDIA H800 NVL", 0x233A10DE,
             (_NAME_NOTE, "every MIG value: those of the H100 NVL (export variant)")),
)

# MIG-capable models first (older, then newer), then the GPUs without MIG.
MODELS = collections.OrderedDict(
    (model.key, model)
    for model in ([m for m in _CATALOG if m.gi_profiles] + list(_NEWER) + [m for m in _CATALOG if not m.gi_profiles]))

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
