# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated driver, driven through pynvml's public functions after install()."""

import ctypes
import json
import multiprocessing
import os
import tempfile

import pynvml
import pytest
from hypothesis import given, settings, strategies as st

import gpuops_mig_sim as sim
from gpuops_mig_sim import library
from gpuops_mig_sim import models

# Profile ids on the 7-slice GPUs (mig-facts.md section 0).
P_1G, P_1G_ME, P_1G_2X, P_2G, P_3G, P_4G, P_7G = 19, 20, 15, 14, 9, 5, 0
# Compute-instance profile ids (= NVML constants).
C_1C, C_2C, C_3C, C_4C, C_7C = 0, 1, 2, 3, 4


@pytest.fixture
def host(tmp_path):
    """host("2xA100-SXM4-40GB", **create_state kwargs) -> state path, with pynvml initialised on it."""
    previous = pynvml.nvmlLib
    started = []

    def make(gpus, **kwargs):
        path = str(tmp_path / "state.json")
        sim.create_state(path, gpus, **kwargs)
        sim.install(path)
        pynvml.nvmlInit()
        started.append(path)
        return path

    yield make
    if started:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError_Uninitialized:
            pass   # the test shut down itself
    pynvml.nvmlLib = previous
    pynvml._nvmlGetFunctionPointer_cache.clear()


def handle(index):
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def possible_placements(device, profile_id):
    count = ctypes.c_uint()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(device, profile_id, array, ctypes.byref(count))
    return [(p.start, p.size) for p in array[:count.value]]


def placement(start, size):
    return pynvml.c_nvmlGpuInstancePlacement_t(start, size)


def create_gi(device, profile_id, start=None):
    if start is None:
        return pynvml.nvmlDeviceCreateGpuInstance(device, profile_id)
    size = possible_placements(device, profile_id)[0][1]
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, profile_id, ctypes.byref(placement(start, size)))


def gpu_instances(device, profile_id):
    count = ctypes.c_uint()
    array = (pynvml.c_nvmlGpuInstance_t * 8)()
    pynvml.nvmlDeviceGetGpuInstances(device, profile_id, array, ctypes.byref(count))
    return list(array[:count.value])


def layout(device):
    """Sorted (profile id, start) of every GI on the device, read through NVML."""
    found = []
    for constant in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, constant)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        for gi in gpu_instances(device, info.id):
            gi_info = pynvml.nvmlGpuInstanceGetInfo(gi)
            found.append((gi_info.profileId, gi_info.placement.start))
    return sorted(found)


def gi_info(gi):
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    return info.id, info.profileId, info.placement.start, info.placement.size


# ---------------------------------------------------------------------------
# Library plumbing
# ---------------------------------------------------------------------------

def test_calls_before_init_are_uninitialized(tmp_path):
    path = str(tmp_path / "s.json")
    sim.create_state(path, "1xA100-SXM4-40GB")
    previous = pynvml.nvmlLib
    try:
        sim.install(path)
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        pynvml.nvmlInit()   # NVML counts init/shutdown pairs
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlSystemGetDriverVersion()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()
    finally:
        pynvml.nvmlLib = previous
        pynvml._nvmlGetFunctionPointer_cache.clear()


def test_unknown_symbols_are_function_not_found(host):
    host("1xA100-SXM4-40GB")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBoardId(handle(0))
    with pytest.raises(AttributeError):
        getattr(pynvml.nvmlLib, "nvmlNoSuchFunction")


def test_error_strings_come_from_the_library(host):
    host("1xA100-SXM4-40GB")
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)) == "Insufficient Resources"
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)) == "In use by another client"


def test_install_refuses_a_missing_state_file(tmp_path):
    with pytest.raises(sim.SimulatorError, match="does not exist"):
        sim.install(str(tmp_path / "nope.json"))


def test_package_does_not_import_pynvml_or_ansible(tmp_path, capfd):
    import os
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gpuops_mig_sim as m;"
            "assert 'pynvml' not in sys.modules and not any(n.startswith('ansible') for n in sys.modules);"
            "print(len(m.symbol_names()))")
    simulator_dir = os.path.dirname(os.path.dirname(sim.__file__))
    out = subprocess.run([sys.executable, "-I", "-c", code, simulator_dir], check=True, capture_output=True, text=True)
    assert int(out.stdout) >= 50


def test_system_information(host):
    host("1xH100-SXM5-80GB", driver_version="550.90.07", cuda_driver_version=12040)
    assert pynvml.nvmlSystemGetDriverVersion() == "550.90.07"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12040
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.90.07"


# ---------------------------------------------------------------------------
# Enumeration and device attributes
# ---------------------------------------------------------------------------

def test_devices_enumerate_like_a_driver(host):
    path = host("2xA100-SXM4-40GB,1xL40S")
    state = sim.load_state(path)
    assert pynvml.nvmlDeviceGetCount() == 3
    for gpu in state["gpus"]:
        device = handle(gpu["index"])
        assert pynvml.nvmlDeviceGetIndex(device) == gpu["index"]
        assert pynvml.nvmlDeviceGetUUID(device) == gpu["uuid"]
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(gpu["uuid"])
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId(gpu["bus_id"])
        by_short_bus = pynvml.nvmlDeviceGetHandleByPciBusId(gpu["bus_id"][4:].lower())
        assert {pynvml.nvmlDeviceGetIndex(h) for h in (by_uuid, by_bus, by_short_bus)} == {gpu["index"]}
    assert [g["bus_id"] for g in state["gpus"]] == ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0"]
    assert state["gpus"][0]["uuid"] != state["gpus"][1]["uuid"]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("00000000:99:00.0")


def test_uuids_are_deterministic_from_the_seed(tmp_path):
    a = sim.create_state(str(tmp_path / "a.json"), "2xH200", seed="x")
    b = sim.create_state(str(tmp_path / "b.json"), "2xH200", seed="x")
    c = sim.create_state(str(tmp_path / "c.json"), "2xH200", seed="y")
    assert [g["uuid"] for g in a["gpus"]] == [g["uuid"] for g in b["gpus"]]
    assert [g["uuid"] for g in a["gpus"]] != [g["uuid"] for g in c["gpus"]]
    assert all(g["uuid"].startswith("GPU-") for g in a["gpus"])


@pytest.mark.parametrize("key", list(models.MODELS))
def test_device_attributes_follow_the_model(host, key):
    host("1x" + key)
    model = models.MODELS[key]
    device = handle(0)
    assert pynvml.nvmlDeviceGetName(device) == model.name
    assert pynvml.nvmlDeviceGetPciInfo(device).pciDeviceId == model.pci_device_id
    assert pynvml.nvmlDeviceGetPciInfo(device).busId == "00000000:07:00.0"
    assert pynvml.nvmlDeviceGetMemoryInfo(device).total == model.memory_mib * 1024 * 1024
    memory = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
    assert (memory.total, memory.free) == (model.memory_mib * 1024 * 1024,) * 2
    assert pynvml.nvmlDeviceGetArchitecture(device) == model.architecture
    assert pynvml.nvmlDeviceGetCudaComputeCapability(device) == model.compute_capability
    assert pynvml.nvmlDeviceGetPersistenceMode(device) == 1


def test_pci_info_ext(host):
    host("1xA100-SXM4-40GB")
    info = pynvml.nvmlPciInfoExt_v1_t()
    info.version = pynvml.nvmlPciInfoExt_v1
    pynvml.nvmlDeviceGetPciInfoExt(handle(0), ctypes.byref(info))
    assert (info.pciDeviceId, info.bus, info.busId) == (0x20B010DE, 7, "00000000:07:00.0")


@pytest.mark.parametrize("call, args", [
    (pynvml.nvmlDeviceGetMigMode, ()),
    (pynvml.nvmlDeviceSetMigMode, (1,)),
    (pynvml.nvmlDeviceGetGpuInstanceProfileInfo, (0,)),
    (pynvml.nvmlDeviceGetGpuInstanceProfileInfoById, (19,)),
    (possible_placements, (19,)),
    (pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity, (19,)),
    (pynvml.nvmlDeviceCreateGpuInstance, (19,)),
    (pynvml.nvmlDeviceGetMaxMigDeviceCount, ()),
])
def test_non_mig_gpus_do_not_support_mig_calls(host, call, args):
    host("1xA10")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        call(handle(0), *args)


# ---------------------------------------------------------------------------
# MIG mode
# ---------------------------------------------------------------------------

def test_ampere_mode_change_stays_pending_until_reset(host):
    path = host("2xA100-SXM4-40GB")
    device = handle(0)
    assert pynvml.nvmlDeviceSetMigMode(device, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(device) == [0, 1]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 0]
    assert sim.reset_gpus(path, ["00000000:07:00.0"]) == [
        ("00000000:07:00.0", True, "GPU 00000000:07:00.0 was successfully reset.")]
    assert pynvml.nvmlDeviceGetMigMode(device) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 0]


@pytest.mark.parametrize("quirk, expected", [
    ({"passthrough": True}, pynvml.NVML_ERROR_RESET_REQUIRED),
    ({"add_clients": ["nvidia-dcgm"]}, pynvml.NVML_ERROR_IN_USE),
    ({}, pynvml.NVML_SUCCESS),
])
def test_ampere_activation_status(host, quirk, expected):
    path = host("1xA30-24GB")
    sim.set_host(path, **quirk)
    assert pynvml.nvmlDeviceSetMigMode(handle(0), 1) == expected
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]


def test_ampere_enable_with_processes_is_pending_and_in_use(host):
    path = host("1xA100-SXM4-80GB")
    sim.add_process(path, 0, 4242, name="train.py", used_memory_mib=2048)
    assert pynvml.nvmlDeviceSetMigMode(handle(0), 1) == pynvml.NVML_ERROR_IN_USE
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]
    results = sim.reset_gpus(path)
    assert results == [("00000000:07:00.0", False, "Unable to reset GPU 00000000:07:00.0: In use by another client")]
    assert sim.reset_exit_code(results) == 255
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]


@pytest.mark.parametrize("key", ["H100-SXM5-80GB", "H200", "B200", "H100-NVL"])
def test_hopper_and_newer_change_mode_at_once(host, key):
    host("1x" + key)
    assert pynvml.nvmlDeviceSetMigMode(handle(0), 1) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [1, 1]
    assert pynvml.nvmlDeviceSetMigMode(handle(0), 0) == pynvml.NVML_SUCCESS
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]


def test_hopper_mode_change_with_processes_fails_and_changes_nothing(host):
    path = host("1xH100-SXM5-80GB")
    sim.add_process(path, 0, 77)
    before = file_bytes(path)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlDeviceSetMigMode(handle(0), 1)
    assert file_bytes(path) == before
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]


@pytest.mark.parametrize("key", ["A100-SXM4-40GB", "H100-SXM5-80GB"])
def test_disabling_mig_with_instances_is_in_use(host, key):
    path = host("1x" + key, mig="enabled")
    create_gi(handle(0), P_3G)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlDeviceSetMigMode(handle(0), 0)
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [1, 1]
    assert len(sim.load_state(path)["gpus"][0]["gpu_instances"]) == 1


def test_set_mig_mode_rejects_bad_modes(host):
    host("1xA100-SXM4-40GB")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceSetMigMode(handle(0), 2)


# ---------------------------------------------------------------------------
# GPU instance profiles, placements and capacity
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("driver, listable", [("535.183.01", False), ("550.54.15", True), ("570.124.06", True)])
def test_profiles_while_mig_disabled_depend_on_the_driver(host, driver, listable):
    host("1xA100-SXM4-40GB", driver_version=driver)
    if listable:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
        assert (info.id, info.name) == (P_3G, "MIG 3g.20gb")
    else:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle(0), pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    # Placements are there whether or not MIG is enabled, on any driver.
    assert possible_placements(handle(0), P_3G) == [(0, 4), (4, 4)]


@pytest.mark.parametrize("key", [k for k, m in models.MODELS.items() if models.is_mig_capable(m)])
def test_profile_info_matches_the_catalog(host, key):
    host("1x" + key, mig="enabled")
    model = models.MODELS[key]
    device = handle(0)
    for constant in range(models.GI_PROFILE_COUNT):
        expected = model.gi_profiles.get(constant)
        if expected is None:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, constant)
            continue
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, constant)
        v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, constant, version=1)
        by_id = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(device, expected.id)
        for item in (info, v1, by_id):
            assert (item.id, item.sliceCount, item.instanceCount, item.memorySizeMB, item.multiprocessorCount) == (
                expected.id, expected.sm_slices, expected.max_count, expected.memory_mib, expected.sm_count)
        assert info.name == by_id.name == "MIG " + expected.name
        assert possible_placements(device, expected.id) == [(s, expected.memory_slices) for s in expected.starts]
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, expected.id) == expected.max_count
    # Driver 580 knows fewer constants than pynvml 13 lists (tests/data/nvml-captures).
    for constant in range(models.GI_PROFILE_COUNT, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(device, constant)


def test_profile_ids_of_another_gpu_type_are_not_supported(host):
    host("1xA30-24GB", mig="enabled")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceCreateGpuInstance(handle(0), P_1G)   # 19 is an A100 id; the A30 1g is 14


def test_placement_list_sizes(host):
    host("1xA100-SXM4-40GB")
    count = ctypes.c_uint()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle(0), P_1G, None, ctypes.byref(count))
    assert count.value == 7
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 3)()
    count = ctypes.c_uint()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle(0), P_1G, small, ctypes.byref(count))
    assert count.value == 7


def test_versioned_structs_are_checked(host):
    host("1xA100-SXM4-40GB", mig="enabled")
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 1
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    assert fn(handle(0), 0, ctypes.byref(info)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


# ---------------------------------------------------------------------------
# GPU instances
# ---------------------------------------------------------------------------

def test_creating_needs_mig_enabled(host):
    host("1xA100-SXM4-40GB")
    for call in (lambda: pynvml.nvmlDeviceCreateGpuInstance(handle(0), P_1G),
                 lambda: gpu_instances(handle(0), P_1G)):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    # Capacity is answered while MIG is disabled, as driver 580 does: the whole (empty) GPU.
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle(0), P_1G) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(0)) == 0


def test_documented_a100_creation_orders(host):
    # MIG User Guide: `-cgi 19,19,14,9` fails, `-cgi 9,19,14,19` works, `-cgi 19,14,5` places 4g at 0, 2g at 4, 1g at 6.
    path = host("3xA100-SXM4-40GB", mig="enabled")
    for profile_id in (P_1G, P_1G, P_2G):
        create_gi(handle(0), profile_id)
    before = file_bytes(path)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(handle(0), P_3G)
    assert file_bytes(path) == before
    for profile_id in (P_3G, P_1G, P_2G, P_1G):
        create_gi(handle(1), profile_id)
    assert len(layout(handle(1))) == 4
    for profile_id in (P_1G, P_2G, P_4G):
        create_gi(handle(2), profile_id)
    assert layout(handle(2)) == sorted([(P_1G, 6), (P_2G, 4), (P_4G, 0)])


def test_lowest_auto_placement_policy(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    sim.set_host(path, auto_placement="lowest")
    create_gi(handle(0), P_1G)
    create_gi(handle(0), P_2G)
    assert layout(handle(0)) == sorted([(P_1G, 0), (P_2G, 2)])
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(handle(0), P_4G)


def test_explicit_placements(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    device = handle(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        create_gi(device, P_3G, start=2)        # 3g starts at 0 or 4
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(device, P_3G, ctypes.byref(placement(0, 3)))
    gi = create_gi(device, P_3G, start=0)
    assert gi_info(gi)[1:] == (P_3G, 0, 4)
    before = file_bytes(path)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(device, P_2G, start=2)        # overlaps 0..3
    assert file_bytes(path) == before
    create_gi(device, P_2G, start=4)
    assert layout(device) == sorted([(P_3G, 0), (P_2G, 4)])


def test_max_count_is_enforced(host):
    host("1xA100-SXM4-40GB", mig="enabled")
    create_gi(handle(0), P_1G_ME, start=0)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle(0), P_1G_ME) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(handle(0), P_1G_ME, start=3)


def test_sm_slices_are_enforced():
    # None of the catalog's layouts can run out of SM slices before memory slices, so check the
    # rule on a GPU with fewer SM slices than memory slices: 2 SM slices, 8 memory slices.
    model = models.MODELS["A100-SXM4-40GB"]._replace(sm_slices=2)
    profile = model.gi_profiles[models.GI_1_SLICE]
    gpu = {"gpu_instances": [{"profile_id": P_1G, "start": 0}]}
    assert library._gi_remaining(gpu, model, profile) == 1
    gpu["gpu_instances"].append({"profile_id": P_1G, "start": 1})
    assert library._gi_remaining(gpu, model, profile) == 0
    assert library._free_gi_starts(gpu, model, profile) == []


def test_gi_ids_reuse_the_lowest_free_id(host):
    host("1xA100-SXM4-40GB", mig="enabled")
    device = handle(0)
    created = [create_gi(device, P_1G) for _count in range(3)]
    assert [gi_info(gi)[0] for gi in created] == [1, 2, 3]
    pynvml.nvmlGpuInstanceDestroy(created[1])
    assert gi_info(create_gi(device, P_1G))[0] == 2
    assert gi_info(pynvml.nvmlDeviceGetGpuInstanceById(device, 3))[0] == 3
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetGpuInstanceById(device, 9)


def test_gi_info_names_its_device(host):
    host("2xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(1), P_7G)
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    assert pynvml.nvmlDeviceGetIndex(info.device) == 1
    assert (info.placement.start, info.placement.size) == (0, 8)


def test_destroyed_gi_handles_become_invalid(host):
    host("1xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(0), P_3G)
    pynvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceDestroy(gi)
    replacement = create_gi(handle(0), P_3G)   # same GI id, new handle
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(gi)
    assert gi_info(replacement)[0] == 1


CREATE_OR_DESTROY = st.lists(
    st.one_of(st.tuples(st.just("create"), st.sampled_from([P_1G, P_1G_ME, P_1G_2X, P_2G, P_3G, P_4G, P_7G])),
              st.tuples(st.just("destroy"), st.integers(0, 6))),
    max_size=8)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(operations=CREATE_OR_DESTROY)
def test_remaining_capacity_predicts_creation(operations):
    """After any history, exactly `remaining capacity` more GIs of a profile can be created."""
    previous = pynvml.nvmlLib
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.json")
        sim.create_state(path, "1xA100-SXM4-40GB", mig="enabled")
        sim.install(path)
        pynvml.nvmlInit()
        try:
            device = handle(0)
            created = []
            for action, value in operations:
                if action == "create":
                    try:
                        created.append(create_gi(device, value))
                    except pynvml.NVMLError_InsufficientResources:
                        pass
                elif created:
                    pynvml.nvmlGpuInstanceDestroy(created.pop(value % len(created)))
            occupied = layout(device)
            for profile_id in (P_1G, P_1G_ME, P_1G_2X, P_2G, P_3G, P_4G, P_7G):
                remaining = pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(device, profile_id)
                extra = [create_gi(device, profile_id) for _count in range(remaining)]
                with pytest.raises(pynvml.NVMLError_InsufficientResources):
                    create_gi(device, profile_id)
                for gi in extra:
                    pynvml.nvmlGpuInstanceDestroy(gi)
                assert layout(device) == occupied
        finally:
            pynvml.nvmlShutdown()
            pynvml.nvmlLib = previous
            pynvml._nvmlGetFunctionPointer_cache.clear()


# ---------------------------------------------------------------------------
# Compute instances
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("gi_profile, g, valid", [
    (P_1G, 1, {C_1C: 1}),
    (P_2G, 2, {C_1C: 2, C_2C: 1}),
    (P_3G, 3, {C_1C: 3, C_2C: 1, C_3C: 1}),
    (P_4G, 4, {C_1C: 4, C_2C: 2, C_4C: 1}),
    (P_7G, 7, {C_1C: 7, C_2C: 3, C_3C: 2, C_4C: 1, C_7C: 1}),
])
def test_ci_profiles_per_gi_size(host, gi_profile, g, valid):
    host("1xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(0), gi_profile)
    gi_sms = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(handle(0), gi_profile).multiprocessorCount
    for constant in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        if constant not in valid:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, constant, 0)
            continue
        info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, constant, 0)
        assert (info.id, info.instanceCount) == (constant, valid[constant])
        assert info.sliceCount == models.CI_PROFILE_SLICES[constant]
        assert info.multiprocessorCount == gi_sms * info.sliceCount // g
        assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, constant) == valid[constant]


def test_ci_names_and_placements(host):
    host("1xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(0), P_3G)
    assert pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, C_1C, 0).name == "MIG 1c.3g.20gb"
    assert pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, C_3C, 0).name == "MIG 3g.20gb"
    count = ctypes.c_uint()
    array = (pynvml.c_nvmlComputeInstancePlacement_t * 3)()
    pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, C_1C, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array[:count.value]] == [(0, 1), (1, 1), (2, 1)]
    pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(gi, C_2C, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array[:count.value]] == [(0, 2)]


def test_ci_creation_capacity_and_ids(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(0), P_3G)
    ci_a = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        gi, C_1C, ctypes.byref(pynvml.c_nvmlComputeInstancePlacement_t(0, 1)))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
            gi, C_2C, ctypes.byref(pynvml.c_nvmlComputeInstancePlacement_t(1, 2)))
    before = file_bytes(path)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_2C)   # its only placement 0:2 overlaps 0:1
    assert file_bytes(path) == before
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, C_1C) == 2
    ci_b = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C)
    infos = [pynvml.nvmlComputeInstanceGetInfo(ci) for ci in (ci_a, ci_b)]
    assert [(i.id, i.profileId, i.placement.start) for i in infos] == [(0, C_1C, 0), (1, C_1C, 2)]
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(infos[0].device)) == 0
    assert gi_info(infos[1].gpuInstance) == gi_info(gi)
    count = ctypes.c_uint()
    array = (pynvml.c_nvmlComputeInstance_t * 3)()
    pynvml.nvmlGpuInstanceGetComputeInstances(gi, C_1C, array, ctypes.byref(count))
    assert [pynvml.nvmlComputeInstanceGetInfo(c).id for c in array[:count.value]] == [0, 1]
    assert pynvml.nvmlComputeInstanceGetInfo(pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 1)).placement.start == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 5)
    pynvml.nvmlComputeInstanceDestroy(ci_a)
    ci_c = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C)
    assert pynvml.nvmlComputeInstanceGetInfo(ci_c).id == 0


def test_destroy_order_and_processes(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    gi = create_gi(handle(0), P_2G)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_2C)
    gi_id, ci_id = gi_info(gi)[0], pynvml.nvmlComputeInstanceGetInfo(ci).id
    mig_device = pynvml.nvmlComputeInstanceGetInfo(ci).device
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlGpuInstanceDestroy(gi)           # a CI remains
    sim.add_process(path, 0, 999, gi=gi_id, ci=ci_id)
    with pytest.raises(pynvml.NVMLError_InUse):
        pynvml.nvmlComputeInstanceDestroy(ci)       # a process runs on it
    sim.clear_processes(path, 0)
    pynvml.nvmlComputeInstanceDestroy(ci)
    for stale in (lambda: pynvml.nvmlComputeInstanceGetInfo(ci), lambda: pynvml.nvmlDeviceGetUUID(mig_device)):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            stale()
    pynvml.nvmlGpuInstanceDestroy(gi)
    assert layout(handle(0)) == []


# ---------------------------------------------------------------------------
# MIG devices and processes
# ---------------------------------------------------------------------------

def test_mig_device_handles(host):
    path = host("1xA100-SXM4-40GB,1xA30-24GB", mig="enabled")
    device = handle(0)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(device) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle(1)) == 4
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    gi = create_gi(device, P_3G)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C)
    gi_id = gi_info(gi)[0]
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 7)
    uuid = pynvml.nvmlDeviceGetUUID(mig)
    assert uuid.startswith("MIG-") and uuid == sim.load_state(path)["gpus"][0]["gpu_instances"][0][
        "compute_instances"][0]["uuid"]
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(device).value == 0
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == gi_id
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == pynvml.nvmlComputeInstanceGetInfo(ci).id
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb"
    assert pynvml.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 1024 * 1024
    for lookup in (uuid, "MIG-%s/%d/0" % (pynvml.nvmlDeviceGetUUID(device), gi_id)):
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(lookup)) == uuid
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(device)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceId(device)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigMode(mig)


def test_mig_uuids_are_deterministic(tmp_path):
    uuids = []
    for name in ("a", "b"):
        path = str(tmp_path / name)
        sim.create_state(path, "1xH100-SXM5-80GB", mig="enabled")
        previous = pynvml.nvmlLib
        sim.install(path)
        pynvml.nvmlInit()
        try:
            gi = create_gi(handle(0), P_1G)
            ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C)
            uuids.append(pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device))
        finally:
            pynvml.nvmlShutdown()
            pynvml.nvmlLib = previous
            pynvml._nvmlGetFunctionPointer_cache.clear()
    assert uuids[0] == uuids[1]


def test_processes_per_mig_device_and_on_the_parent(host):
    path = host("1xH100-SXM5-80GB,1xA10", mig="enabled")
    device = handle(0)
    for profile_id in (P_3G, P_3G):
        pynvml.nvmlGpuInstanceCreateComputeInstance(create_gi(device, profile_id), C_3C)
    (gi_a, ci_a), (gi_b, ci_b) = [(pynvml.nvmlDeviceGetGpuInstanceId(m), pynvml.nvmlDeviceGetComputeInstanceId(m))
                                  for m in (pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, i) for i in (0, 1))]
    sim.add_process(path, 0, 100, gi=gi_a, ci=ci_a, used_memory_mib=512)
    sim.add_process(path, 0, 200, gi=gi_b, ci=ci_b, used_memory_mib=256, kind="graphics")
    sim.add_process(path, 0, 300, gi=gi_b, ci=ci_b, kind="mps")
    sim.add_process(path, 1, 400, name="xorg")
    mig_a = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 0)
    mig_b = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(device, 1)
    compute = pynvml.nvmlDeviceGetComputeRunningProcesses(mig_a)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in compute] == [
        (100, 512 * 1024 * 1024, gi_a, ci_a)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(mig_b) == []
    assert [p.pid for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(mig_b)] == [200]
    assert [p.pid for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(device)] == [300]
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)] == [100]
    plain = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(1))
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in plain] == [(400, 0xFFFFFFFF, 0xFFFFFFFF)]
    assert pynvml.nvmlSystemGetProcessName(400) == "xorg"
    assert pynvml.nvmlDeviceGetMemoryInfo(mig_a).used == 512 * 1024 * 1024


def test_add_process_validates_its_target(host):
    path = host("1xA100-SXM4-40GB,1xA10", mig="enabled")
    with pytest.raises(sim.SimulatorError, match="MIG enabled: a process must run on a MIG device"):
        sim.add_process(path, 0, 1)
    with pytest.raises(sim.SimulatorError, match="no MIG device with GPU instance 1"):
        sim.add_process(path, 0, 1, gi=1, ci=0)
    with pytest.raises(sim.SimulatorError, match="does not have MIG enabled"):
        sim.add_process(path, 1, 1, gi=1, ci=0)
    with pytest.raises(sim.SimulatorError, match="no GPU 5"):
        sim.add_process(path, 5, 1)


# ---------------------------------------------------------------------------
# GPU reset and reboot
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("quirk, reason, code", [
    ({"passthrough": True}, "Not Supported", 3),
    ({"add_clients": ["nvidia-dcgm"]}, "In use by another client", 255),
    ({"deny_changes": True}, "Insufficient Permissions", 4),
])
def test_reset_refusals(host, quirk, reason, code):
    path = host("1xA100-SXM4-40GB,1xA100-SXM4-40GB")
    pynvml.nvmlDeviceSetMigMode(handle(0), 1)
    sim.set_host(path, **quirk)
    before = file_bytes(path)
    results = sim.reset_gpus(path, ["0000:07:00.0", "00000000:0F:00.0"])
    assert results[0] == ("00000000:07:00.0", False, "Unable to reset GPU 00000000:07:00.0: " + reason)
    assert sim.reset_exit_code(results) == code
    assert file_bytes(path) == before
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]


def test_reset_only_refuses_the_busy_gpu(host):
    path = host("2xA100-SXM4-40GB", mig="enabled")
    create_gi(handle(0), P_7G)
    gi = create_gi(handle(1), P_7G)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_7C)
    sim.add_process(path, 1, 5, gi=gi_info(gi)[0], ci=pynvml.nvmlComputeInstanceGetInfo(ci).id)
    results = sim.reset_gpus(path)
    assert [ok for _bus, ok, _message in results] == [True, False]
    assert layout(handle(0)) == [] and layout(handle(1)) == [(P_7G, 0)]


def test_reset_of_unknown_gpu_changes_nothing(host):
    path = host("1xA100-SXM4-40GB")
    before = file_bytes(path)
    with pytest.raises(sim.UnknownGpuError):
        sim.reset_gpus(path, ["00000000:07:00.0", "00000000:AA:00.0"])
    assert file_bytes(path) == before


def test_reboot(host):
    path = host("1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA10", mig="enabled")
    pynvml.nvmlDeviceSetMigMode(handle(0), 0)                      # Ampere: disable is pending
    gi = create_gi(handle(1), P_7G)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_7C)
    sim.add_process(path, 1, 11, gi=gi_info(gi)[0], ci=pynvml.nvmlComputeInstanceGetInfo(ci).id)
    sim.add_process(path, 2, 12)
    old_boot = sim.boot_id(path)
    new_boot = sim.reboot(path)
    state = sim.load_state(path)
    assert new_boot != old_boot and new_boot == sim.boot_id(path) == state["boot_id"]
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]       # pending applied at boot
    assert pynvml.nvmlDeviceGetMigMode(handle(1)) == [0, 0]       # Hopper: mode lost
    assert state["processes"] == []
    assert all(gpu["gpu_instances"] == [] for gpu in state["gpus"])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpuInstanceGetInfo(gi)


def test_reboot_without_mode_change(host):
    path = host("1xA100-SXM4-40GB")
    sim.set_host(path, mode_change_survives_reboot=False)
    pynvml.nvmlDeviceSetMigMode(handle(0), 1)
    sim.reboot(path)
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 1]


def test_ampere_mode_persists_across_reboot(host):
    path = host("1xA30-24GB", mig="enabled")
    create_gi(handle(0), 14)
    sim.reboot(path)
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [1, 1]
    assert layout(handle(0)) == []


# ---------------------------------------------------------------------------
# Host quirks, faults, state file
# ---------------------------------------------------------------------------

def test_deny_changes_refuses_every_mutation(host):
    path = host("1xA100-SXM4-40GB,1xH100-SXM5-80GB", mig="enabled")
    gi = create_gi(handle(0), P_3G)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C)
    sim.set_host(path, deny_changes=True)
    before = file_bytes(path)
    calls = [
        lambda: pynvml.nvmlDeviceSetMigMode(handle(1), 0),
        lambda: pynvml.nvmlDeviceCreateGpuInstance(handle(0), P_1G),
        lambda: create_gi(handle(0), P_1G, start=0),
        lambda: pynvml.nvmlGpuInstanceDestroy(gi),
        lambda: pynvml.nvmlGpuInstanceCreateComputeInstance(gi, C_1C),
        lambda: pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
            gi, C_1C, ctypes.byref(pynvml.c_nvmlComputeInstancePlacement_t(1, 1))),
        lambda: pynvml.nvmlComputeInstanceDestroy(ci),
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_NoPermission):
            call()
    assert file_bytes(path) == before
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle(0), P_1G) == 4   # reads still work


def test_fault_on_nth_call(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    sim.add_fault(path, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", nth=2)
    create_gi(handle(0), P_1G, start=0)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(handle(0), P_1G, start=1)
    create_gi(handle(0), P_1G, start=1)   # not sticky: only the 2nd call fails
    assert layout(handle(0)) == [(P_1G, 0), (P_1G, 1)]
    fault = sim.load_state(path)["faults"][0]
    assert (fault["calls"], fault["error"]) == (2, 23)


def test_sticky_fault_by_wrapper_name(host):
    path = host("1xA100-SXM4-40GB")
    sim.add_fault(path, "nvmlDeviceGetCount", 999, nth=2, sticky=True)
    assert sim.load_state(path)["faults"][0]["symbols"] == ["nvmlDeviceGetCount_v2"]
    assert pynvml.nvmlDeviceGetCount() == 1
    for _call in range(3):
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetCount()
    sim.clear_faults(path)
    assert pynvml.nvmlDeviceGetCount() == 1


def test_fault_name_and_error_validation(tmp_path):
    path = str(tmp_path / "s.json")
    sim.create_state(path, "1xA100-SXM4-40GB")
    with pytest.raises(sim.SimulatorError, match="unknown NVML function 'nvmlFrobnicate'"):
        sim.add_fault(path, "nvmlFrobnicate", "IN_USE")
    with pytest.raises(sim.SimulatorError, match="unknown NVML error 'BROKEN'"):
        sim.add_fault(path, "nvmlInit", "BROKEN")
    with pytest.raises(sim.SimulatorError, match="counted from 1"):
        sim.add_fault(path, "nvmlInit", "IN_USE", nth=0)
    sim.add_fault(path, "nvmlDeviceGetGpuInstanceProfileInfo", "NVML_ERROR_IN_USE")
    assert sim.load_state(path)["faults"][0]["symbols"] == [
        "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceProfileInfoV"]
    assert sim.load_state(path)["faults"][0]["error"] == 19


def _count_devices(path, results):
    sim.install(path)
    pynvml.nvmlInit()
    try:
        results.put(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        results.put(exc.value)


def test_fault_calls_are_counted_across_processes(host):
    path = host("2xA100-SXM4-40GB")
    sim.add_fault(path, "nvmlDeviceGetCount_v2", "GPU_IS_LOST", nth=2)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_count_devices, args=(path, results))
    child.start()
    child.join(30)
    assert results.get(timeout=5) == 2          # the child made call 1
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetCount()             # call 2, in this process
    assert pynvml.nvmlDeviceGetCount() == 2


def _fill_and_trim(path, index, start_event):
    sim.install(path)
    pynvml.nvmlInit()
    start_event.wait(10)
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    created = [pynvml.nvmlDeviceCreateGpuInstance(device, P_1G) for _count in range(7)]
    for gi in created[:3]:
        pynvml.nvmlGpuInstanceDestroy(gi)
    pynvml.nvmlShutdown()


def test_concurrent_processes_do_not_lose_updates(host):
    path = host("4xA100-SXM4-40GB", mig="enabled")
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_fill_and_trim, args=(path, index, start)) for index in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0, 0, 0, 0]
    state = sim.load_state(path)
    assert [len(gpu["gpu_instances"]) for gpu in state["gpus"]] == [4, 4, 4, 4]
    assert state["next_serial"] == 4 * 7 + 1
    for index in range(4):
        assert len(layout(handle(index))) == 4   # this process sees the other processes' work


def test_state_file_format_and_atomic_writes(host, tmp_path):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    create_gi(handle(0), P_1G)
    state = json.loads(file_bytes(path))
    assert state["format"] == 1
    assert {"driver_version", "cuda_driver_version", "nvml_version", "boot_id", "host", "gpus", "processes",
            "faults", "next_serial"} <= set(state)
    assert sorted(os.listdir(str(tmp_path))) == ["state.json", "state.json.lock"]   # no temp files left


def test_reads_do_not_write(host):
    path = host("1xA100-SXM4-40GB", mig="enabled")
    before = os.stat(path)
    layout(handle(0))
    pynvml.nvmlDeviceGetMigMode(handle(0))
    pynvml.nvmlDeviceSetMigMode(handle(0), 1)   # no change: nothing to write
    after = os.stat(path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_a_broken_state_file_is_reported(host):
    path = host("1xA100-SXM4-40GB")
    good = file_bytes(path)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(sim.SimulatorError, match="not valid JSON"):
        pynvml.nvmlDeviceGetCount()
    with open(path, "w") as f:
        json.dump({"format": 99}, f)
    with pytest.raises(sim.SimulatorError, match="not format 1"):
        sim.load_state(path)
    with open(path, "wb") as f:
        f.write(good)
    assert pynvml.nvmlDeviceGetCount() == 1


def test_the_library_never_writes_to_stdout(host, capfd):
    path = host("1xA100-SXM4-40GB")
    pynvml.nvmlDeviceSetMigMode(handle(0), 1)
    sim.reset_gpus(path)
    create_gi(handle(0), P_7G)
    sim.reboot(path)
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize("gpus, message", [
    ("2xV100", "unknown GPU model 'V100'"),
    ("0xA100-SXM4-40GB", "at least 1"),
    ("x", "unknown GPU model 'x'"),
    ("40xA10", "at most 32"),
    ("", "bad GPU spec"),
])
def test_create_state_rejects_bad_specs(tmp_path, gpus, message):
    path = str(tmp_path / "s.json")
    with pytest.raises(sim.SimulatorError, match=message):
        sim.create_state(path, gpus)
    assert not os.path.exists(path)


def test_create_state_refuses_to_overwrite(tmp_path):
    path = str(tmp_path / "s.json")
    sim.create_state(path, ["1xA100-SXM4-40GB", "1xA30-24GB"])
    with pytest.raises(sim.SimulatorError, match="already exists"):
        sim.create_state(path, "1xH200")
    assert [g["model"] for g in sim.load_state(path)["gpus"]] == ["A100-SXM4-40GB", "A30-24GB"]
    sim.create_state(path, "1xH200", force=True)
    assert [g["model"] for g in sim.load_state(path)["gpus"]] == ["H200"]


def test_live_processes_vanish_when_the_real_process_ends(tmp_path):
    import subprocess
    import sys
    state = str(tmp_path / "live.json")
    sim.create_state(state, "1xH100-SXM5-80GB")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sim.add_process(state, 0, pid=proc.pid, live=True)
        assert "In use" in sim.reset_gpus(state)[0][2]
        proc.kill()
        proc.wait()
        assert sim.reset_gpus(state)[0][1] is True      # the GPU no longer sees it
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(sim.SimulatorError, match="is not running"):
        sim.add_process(state, 0, pid=proc.pid, live=True)
