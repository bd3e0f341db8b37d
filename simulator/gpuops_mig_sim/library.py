# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The simulated libnvidia-ml: the C symbols pynvml calls, over a state file.

open_library() stands in for ctypes.CDLL of libnvidia-ml.so.1: pynvml looks up C
symbols by name on the returned object and calls them with its own ctypes
arguments, so every pynvml wrapper runs unchanged.
"""

import ctypes
import functools
import os
import re
import uuid

from . import models
from .state import (
    ERROR_ARGUMENT_VERSION_MISMATCH, ERROR_IN_USE, ERROR_INSUFFICIENT_RESOURCES, ERROR_INSUFFICIENT_SIZE,
    ERROR_INVALID_ARGUMENT, ERROR_NO_PERMISSION, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED, ERROR_RESET_REQUIRED,
    ERROR_UNINITIALIZED, ERRORS, MIB, MIG_DISABLE, MIG_ENABLE, NOT_AVAILABLE, STATE_ENV, SUCCESS,
    UUID_NAMESPACE, slices_of_ci_profile, gpu_processes, is_hopper_or_newer, mig_device_name, mig_devices, mig_enabled,
    model_of, parse_bus_id, profile_of_gi, SimulatorError, StateStore,
)

# Struct versions pynvml sets before calling the versioned ("V"/_v2) symbols.
_GI_PROFILE_INFO_V2 = 0x02000098
_CI_PROFILE_INFO_V2 = 0x02000088
_MEMORY_V2 = 0x02000028
_PCI_INFO_EXT_V1 = 0x1000040

# pynvml wrapper name -> the C symbols it may request (when the names differ).
_WRAPPER_SYMBOLS = {
    "nvmlInit": ("nvmlInitWithFlags",),
    "nvmlDeviceGetCount": ("nvmlDeviceGetCount_v2",),
    "nvmlDeviceGetHandleByIndex": ("nvmlDeviceGetHandleByIndex_v2",),
    "nvmlDeviceGetHandleByPciBusId": ("nvmlDeviceGetHandleByPciBusId_v2",),
    "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo_v3",),
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"),
    "nvmlDeviceGetGpuInstanceProfileInfo": ("nvmlDeviceGetGpuInstanceProfileInfoV",),
    "nvmlDeviceGetGpuInstanceProfileInfoById": ("nvmlDeviceGetGpuInstanceProfileInfoByIdV",),
    "nvmlDeviceGetGpuInstancePossiblePlacements": ("nvmlDeviceGetGpuInstancePossiblePlacements_v2",),
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": ("nvmlGpuInstanceGetComputeInstanceProfileInfoV",),
    "nvmlComputeInstanceGetInfo": ("nvmlComputeInstanceGetInfo_v2",),
    "nvmlDeviceGetComputeRunningProcesses": ("nvmlDeviceGetComputeRunningProcesses_v3",),
    "nvmlDeviceGetGraphicsRunningProcesses": ("nvmlDeviceGetGraphicsRunningProcesses_v3",),
    "nvmlDeviceGetMPSComputeRunningProcesses": ("nvmlDeviceGetMPSComputeRunningProcesses_v3",),
}


class _NvmlFailure(Exception):
    """Ends a simulated NVML call with an NVML return code."""

    def __init__(self, code):
        super(_NvmlFailure, self).__init__(code)
        self.code = code


# ---------------------------------------------------------------------------
# Geometry over the state: what can be created where
# ---------------------------------------------------------------------------

def _driver_major(state):
    return int(state["driver_version"].split(".")[0])


def _free_gi_starts(gpu, model, profile):
    """Starts where `profile` could be created now (free memory slices, count and SM slices left)."""
    used_slices = set()
    used_sm = 0
    same_profile = 0
    for gi in gpu["gpu_instances"]:
        other = profile_of_gi(model, gi)
        used_slices.update(range(gi["start"], gi["start"] + other.memory_slices))
        used_sm += other.sm_slices
        same_profile += other.id == profile.id
    if same_profile >= profile.max_count or used_sm + profile.sm_slices > model.sm_slices:
        return []
    return [start for start in profile.starts
            if not used_slices.intersection(range(start, start + profile.memory_slices))]


def _gi_remaining(gpu, model, profile):
    used_sm = sum(profile_of_gi(model, gi).sm_slices for gi in gpu["gpu_instances"])
    same_profile = sum(1 for gi in gpu["gpu_instances"] if gi["profile_id"] == profile.id)
    taken = []
    for start in _free_gi_starts(gpu, model, profile):
        # Placements of one profile are aligned and equal-sized: taking the first free ones is optimal.
        if all(start >= other + profile.memory_slices for other in taken):
            taken.append(start)
    return max(0, min(len(taken), profile.max_count - same_profile,
                      (model.sm_slices - used_sm) // profile.sm_slices))


def _free_ci_starts(gi, gi_profile, ci_slices):
    used = set()
    same_profile = 0
    for ci in gi["compute_instances"]:
        size = slices_of_ci_profile(ci["profile_id"])
        used.update(range(ci["start"], ci["start"] + size))
        same_profile += size == ci_slices
    if same_profile >= gi_profile.sm_slices // ci_slices:
        return []
    return [start for start in models.ci_placement_starts(ci_slices, gi_profile.sm_slices)
            if not used.intersection(range(start, start + ci_slices))]


def _ci_remaining(gi, gi_profile, ci_slices):
    taken = []
    for start in _free_ci_starts(gi, gi_profile, ci_slices):
        if all(start >= other + ci_slices for other in taken):
            taken.append(start)
    same_profile = sum(1 for ci in gi["compute_instances"] if slices_of_ci_profile(ci["profile_id"]) == ci_slices)
    return max(0, min(len(taken), gi_profile.sm_slices // ci_slices - same_profile))


def _choose_start(state, free_starts):
    return max(free_starts) if state["host"]["auto_placement"] == "highest" else min(free_starts)


def _lowest_free_id(used, first):
    candidate = first
    while candidate in used:
        candidate += 1
    return candidate


def _next_serial(state):
    state["next_serial"] += 1
    return state["next_serial"] - 1


def _mig_uuid(gpu, serial):
    return "MIG-%s" % uuid.uuid5(UUID_NAMESPACE, "%s/mig/%d" % (gpu["uuid"], serial))


# ---------------------------------------------------------------------------
# Opaque handles: tagged integers that name a GPU (by index) or a GI, CI or
# MIG device (by its serial, which is never reused, so stale handles fail).
# ---------------------------------------------------------------------------

_HANDLE_TAG = 0x6D69
_KIND_GPU, _KIND_GI, _KIND_CI, _KIND_MIG = 1, 2, 3, 4


def _handle(kind, payload):
    return (_HANDLE_TAG << 44) | (kind << 32) | payload


def _handle_parts(handle):
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        value = None
    if not value or value >> 44 != _HANDLE_TAG:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return (value >> 32) & 0xFFF, value & 0xFFFFFFFF


def _resolve(state, handle):
    """(kind, gpu, gi, ci) named by a handle; INVALID_ARGUMENT when it names nothing (any more)."""
    kind, payload = _handle_parts(handle)
    if kind == _KIND_GPU:
        if payload < len(state["gpus"]):
            return kind, state["gpus"][payload], None, None
    elif kind in (_KIND_GI, _KIND_CI, _KIND_MIG):
        for gpu in state["gpus"]:
            for gi in gpu["gpu_instances"]:
                if kind == _KIND_GI and gi["serial"] == payload:
                    return kind, gpu, gi, None
                for ci in gi["compute_instances"]:
                    if kind != _KIND_GI and ci["serial"] == payload:
                        return kind, gpu, gi, ci
    raise _NvmlFailure(ERROR_INVALID_ARGUMENT)


def _physical_gpu(state, handle):
    kind, gpu, _gi, _ci = _resolve(state, handle)
    if kind != _KIND_GPU:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return gpu


def _device(state, handle):
    """(gpu, gi, ci) for a GPU handle (gi = ci = None) or a MIG device handle."""
    kind, gpu, gi, ci = _resolve(state, handle)
    if kind not in (_KIND_GPU, _KIND_MIG):
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return gpu, gi, ci


def _mig_capable_gpu(state, handle):
    gpu = _physical_gpu(state, handle)
    model = model_of(gpu)
    if not models.is_mig_capable(model):
        raise _NvmlFailure(ERROR_NOT_SUPPORTED)
    return gpu, model


def _gpu_instance(state, handle):
    kind, gpu, gi, _ci = _resolve(state, handle)
    if kind != _KIND_GI:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return gpu, gi


def _compute_instance(state, handle):
    kind, gpu, gi, ci = _resolve(state, handle)
    if kind != _KIND_CI:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return gpu, gi, ci


def _refuse_if_denied(state):
    if state["host"]["deny_changes"]:
        raise _NvmlFailure(ERROR_NO_PERMISSION)


# ---------------------------------------------------------------------------
# ctypes plumbing: pynvml passes byref(...) objects, arrays, string buffers.
# ---------------------------------------------------------------------------

def _target(ref):
    """The ctypes object behind an argument: byref(x) -> x, pointer(x) -> x, x -> x."""
    if ref is None:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    obj = getattr(ref, "_obj", None)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    return ref


def _int(value):
    return int(getattr(value, "value", value))


def _text_arg(value):
    value = getattr(value, "value", value)
    if value is None:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
    return value.decode() if isinstance(value, bytes) else str(value)


def _set_value(ref, value):
    _target(ref).value = value


def _set_handle(ref, address):
    ctypes.c_void_p.from_buffer(_target(ref)).value = address


def _set_handle_field(struct, field, address):
    pointer_type = dict(struct._fields_)[field]
    setattr(struct, field, ctypes.cast(ctypes.c_void_p(address), pointer_type))


def _set_text(buffer, length, text):
    data = text.encode()
    if buffer is None or len(data) + 1 > _int(length):
        raise _NvmlFailure(ERROR_INSUFFICIENT_SIZE if buffer is not None else ERROR_INVALID_ARGUMENT)
    _target(buffer).value = data


def _fill_array(array, count_ref, items, store):
    """C-style list output: array None -> count only; too small -> INSUFFICIENT_SIZE with the count set."""
    count = _target(count_ref)
    if array is None:
        count.value = len(items)
        return
    array = _target(array)
    capacity = len(array) if isinstance(array, ctypes.Array) else count.value
    count.value = len(items)
    if capacity < len(items):
        raise _NvmlFailure(ERROR_INSUFFICIENT_SIZE)
    for position, item in enumerate(items):
        store(array, position, item)


def _store_placement(array, position, placement):
    array[position].start, array[position].size = placement


def _store_handle(array, position, address):
    element_type = array._type_
    array[position] = ctypes.cast(ctypes.c_void_p(address), element_type)


def _placement_arg(placement):
    placement = _target(placement)
    try:
        return int(placement.start), int(placement.size)
    except AttributeError:
        raise _NvmlFailure(ERROR_INVALID_ARGUMENT)


# ---------------------------------------------------------------------------
# The simulated library
# ---------------------------------------------------------------------------

_SYMBOLS = {}   # C symbol -> (implementation, needs nvmlInit first)


def _symbol(*names, **options):
    def register(func):
        for name in names:
            _SYMBOLS[name] = (func, options.get("needs_init", True))
        return func
    return register


def symbol_names():
    """The C symbols the simulated library implements."""
    return sorted(_SYMBOLS)


def normalise_function(function):
    """The C symbols a fault on `function` (C symbol or pynvml wrapper name) applies to."""
    symbols = set(_WRAPPER_SYMBOLS.get(function, ()))
    if function in _SYMBOLS:
        symbols.add(function)
    symbols.discard("nvmlErrorString")
    return sorted(symbols)


class SimulatedNvml(object):
    """Stands in for the CDLL of libnvidia-ml.so.1; unknown symbols raise AttributeError."""

    def __init__(self, state_path):
        self._store = StateStore(state_path)
        self._init_count = 0

    def __getattr__(self, name):
        if name.startswith("_") or name not in _SYMBOLS:
            raise AttributeError(name)
        # A partial, not a bound method: pynvml sets .restype on nvmlErrorString.
        return functools.partial(self._call, name)

    def _call(self, name, *args):
        implementation, needs_init = _SYMBOLS[name]
        try:
            if needs_init and self._init_count == 0:
                return ERROR_UNINITIALIZED
            if name != "nvmlErrorString":
                self._apply_faults(name)
            result = implementation(self, *args)
        except _NvmlFailure as failure:
            return failure.code
        return SUCCESS if result is None else result

    def _apply_faults(self, name):
        if not any(_fault_armed(fault, name) for fault in self._store.read()["faults"]):
            return
        error = None
        with self._store.transaction() as state:
            for fault in state["faults"]:
                if _fault_armed(fault, name):
                    fault["calls"] += 1
                    if fault["calls"] == fault["nth"] or (fault["sticky"] and fault["calls"] > fault["nth"]):
                        error = error or fault["error"]
        if error:
            raise _NvmlFailure(error)

    # -- library and system -------------------------------------------------

    @_symbol("nvmlInitWithFlags", needs_init=False)
    def _init_with_flags(self, flags):
        self._store.read()   # a missing or broken state file fails here, clearly
        self._init_count += 1

    @_symbol("nvmlInit_v2", needs_init=False)
    def _init_v2(self):
        return self._init_with_flags(0)

    @_symbol("nvmlShutdown")
    def _shutdown(self):
        self._init_count -= 1

    @_symbol("nvmlErrorString", needs_init=False)
    def _error_string(self, result):
        return ERRORS.get(_int(result), ("", "Unknown Error"))[1].encode()

    @_symbol("nvmlSystemGetDriverVersion")
    def _driver_version(self, buffer, length):
        _set_text(buffer, length, self._store.read()["driver_version"])

    @_symbol("nvmlSystemGetNVMLVersion")
    def _nvml_version(self, buffer, length):
        _set_text(buffer, length, self._store.read()["nvml_version"])

    @_symbol("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
    def _cuda_version(self, version_ref):
        _set_value(version_ref, self._store.read()["cuda_driver_version"])

    @_symbol("nvmlSystemGetProcessName")
    def _process_name(self, pid, buffer, length):
        for proc in self._store.read()["processes"]:
            if proc["pid"] == _int(pid):
                return _set_text(buffer, length, proc["name"])
        raise _NvmlFailure(ERROR_NOT_FOUND)

    # -- devices ------------------------------------------------------------

    @_symbol("nvmlDeviceGetCount_v2")
    def _device_count(self, count_ref):
        _set_value(count_ref, len(self._store.read()["gpus"]))

    @_symbol("nvmlDeviceGetHandleByIndex_v2")
    def _handle_by_index(self, index, device_ref):
        if not 0 <= _int(index) < len(self._store.read()["gpus"]):
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        _set_handle(device_ref, _handle(_KIND_GPU, _int(index)))

    @_symbol("nvmlDeviceGetHandleByUUID")
    def _handle_by_uuid(self, uuid_arg, device_ref):
        wanted = _text_arg(uuid_arg).strip()
        legacy = re.match(r"^MIG-(GPU-[^/]+)/(\d+)/(\d+)$", wanted)
        for gpu in self._store.read()["gpus"]:
            if gpu["uuid"] == wanted:
                return _set_handle(device_ref, _handle(_KIND_GPU, gpu["index"]))
            for gi, ci in mig_devices(gpu):
                if ci["uuid"] == wanted or (legacy and legacy.groups() == (gpu["uuid"], str(gi["id"]), str(ci["id"]))):
                    return _set_handle(device_ref, _handle(_KIND_MIG, ci["serial"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlDeviceGetHandleByPciBusId_v2")
    def _handle_by_bus_id(self, bus_id_arg, device_ref):
        wanted = parse_bus_id(_text_arg(bus_id_arg))
        if wanted is None:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        for gpu in self._store.read()["gpus"]:
            if parse_bus_id(gpu["bus_id"]) == wanted:
                return _set_handle(device_ref, _handle(_KIND_GPU, gpu["index"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlDeviceGetIndex")
    def _device_index(self, device, index_ref):
        _set_value(index_ref, _physical_gpu(self._store.read(), device)["index"])

    @_symbol("nvmlDeviceGetName")
    def _device_name(self, device, buffer, length):
        gpu, gi, ci = _device(self._store.read(), device)
        model = model_of(gpu)
        name = model.name if ci is None else "%s MIG %s" % (model.name, mig_device_name(model, gi, ci))
        _set_text(buffer, length, name)

    @_symbol("nvmlDeviceGetUUID")
    def _device_uuid(self, device, buffer, length):
        gpu, _gi, ci = _device(self._store.read(), device)
        _set_text(buffer, length, gpu["uuid"] if ci is None else ci["uuid"])

    @_symbol("nvmlDeviceGetPciInfo_v3")
    def _pci_info(self, device, info_ref):
        gpu = _device(self._store.read(), device)[0]
        domain, bus, dev, function = parse_bus_id(gpu["bus_id"])
        info = _target(info_ref)
        info.busIdLegacy = ("%04x:%02x:%02x.%x" % (domain, bus, dev, function)).upper().encode()
        info.busId = gpu["bus_id"].encode()
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = model_of(gpu).pci_device_id
        info.pciSubSystemId = 0

    @_symbol("nvmlDeviceGetPciInfoExt")
    def _pci_info_ext(self, device, info_ref):
        gpu = _device(self._store.read(), device)[0]
        info = _target(info_ref)
        if info.version != _PCI_INFO_EXT_V1:
            raise _NvmlFailure(ERROR_ARGUMENT_VERSION_MISMATCH)
        domain, bus, dev, _function = parse_bus_id(gpu["bus_id"])
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = model_of(gpu).pci_device_id
        info.pciSubSystemId = 0
        info.baseClass, info.subClass = 0x3, 0x2   # 3D controller
        info.busId = gpu["bus_id"].encode()

    def _memory(self, device):
        state = self._store.read()
        gpu, gi, ci = _device(state, device)
        model = model_of(gpu)
        if ci is None:
            total, procs = model.memory_mib, gpu_processes(state, gpu)
        else:
            total, procs = profile_of_gi(model, gi).memory_mib, gpu_processes(state, gpu, gi["id"])
        used = sum(proc["used_memory_mib"] for proc in procs)
        return total * MIB, min(used, total) * MIB

    @_symbol("nvmlDeviceGetMemoryInfo")
    def _memory_info(self, device, memory_ref):
        total, used = self._memory(device)
        memory = _target(memory_ref)
        memory.total, memory.used, memory.free = total, used, total - used

    @_symbol("nvmlDeviceGetMemoryInfo_v2")
    def _memory_info_v2(self, device, memory_ref):
        memory = _target(memory_ref)
        if memory.version != _MEMORY_V2:
            raise _NvmlFailure(ERROR_ARGUMENT_VERSION_MISMATCH)
        total, used = self._memory(device)
        memory.total, memory.reserved, memory.used, memory.free = total, 0, used, total - used

    @_symbol("nvmlDeviceGetArchitecture")
    def _architecture(self, device, arch_ref):
        _set_value(arch_ref, model_of(_device(self._store.read(), device)[0]).architecture)

    @_symbol("nvmlDeviceGetCudaComputeCapability")
    def _compute_capability(self, device, major_ref, minor_ref):
        major, minor = model_of(_device(self._store.read(), device)[0]).compute_capability
        _set_value(major_ref, major)
        _set_value(minor_ref, minor)

    @_symbol("nvmlDeviceGetPersistenceMode")
    def _persistence_mode(self, device, mode_ref):
        _set_value(mode_ref, _physical_gpu(self._store.read(), device)["persistence_mode"])

    @_symbol("nvmlDeviceGetVirtualizationMode")
    def _virtualization_mode(self, device, mode_ref):
        state = self._store.read()
        _physical_gpu(state, device)
        _set_value(mode_ref, 1 if state["host"]["passthrough"] else 0)   # NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH

    def _processes(self, device, count_ref, array, kind):
        state = self._store.read()
        gpu, gi, ci = _device(state, device)
        procs = [proc for proc in gpu_processes(state, gpu, gi and gi["id"], ci and ci["id"])
                 if proc["type"] == kind]

        def store(target, position, proc):
            entry = target[position]
            entry.pid = proc["pid"]
            entry.usedGpuMemory = proc["used_memory_mib"] * MIB
            entry.gpuInstanceId = NOT_AVAILABLE if proc["gi"] is None else proc["gi"]
            entry.computeInstanceId = NOT_AVAILABLE if proc["ci"] is None else proc["ci"]

        if array is None and procs:
            _target(count_ref).value = len(procs)
            raise _NvmlFailure(ERROR_INSUFFICIENT_SIZE)
        _fill_array(array, count_ref, procs, store)

    @_symbol("nvmlDeviceGetComputeRunningProcesses_v3")
    def _compute_processes(self, device, count_ref, array):
        self._processes(device, count_ref, array, "compute")

    @_symbol("nvmlDeviceGetGraphicsRunningProcesses_v3")
    def _graphics_processes(self, device, count_ref, array):
        self._processes(device, count_ref, array, "graphics")

    @_symbol("nvmlDeviceGetMPSComputeRunningProcesses_v3")
    def _mps_processes(self, device, count_ref, array):
        self._processes(device, count_ref, array, "mps")

    # -- MIG mode -----------------------------------------------------------

    @_symbol("nvmlDeviceGetMigMode")
    def _get_mig_mode(self, device, current_ref, pending_ref):
        gpu, _model_ = _mig_capable_gpu(self._store.read(), device)
        _set_value(current_ref, gpu["mig"]["current"])
        _set_value(pending_ref, gpu["mig"]["pending"])

    @_symbol("nvmlDeviceSetMigMode")
    def _set_mig_mode(self, device, mode, status_ref):
        mode = _int(mode)
        with self._store.transaction() as state:
            gpu, model = _mig_capable_gpu(state, device)
            if mode not in (MIG_DISABLE, MIG_ENABLE):
                raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
            _refuse_if_denied(state)
            if mode == MIG_DISABLE and gpu["gpu_instances"]:
                raise _NvmlFailure(ERROR_IN_USE)
            busy = bool(gpu_processes(state, gpu))
            current = gpu["mig"]["current"]
            if is_hopper_or_newer(model):
                # No reset needed, so it applies at once, or not at all while work runs.
                if mode != current and busy:
                    raise _NvmlFailure(ERROR_IN_USE)
                gpu["mig"] = {"current": mode, "pending": mode}
                status = SUCCESS
            else:
                # Ampere: the InfoROM bit changes now; a GPU reset or reboot activates it.
                gpu["mig"]["pending"] = mode
                if mode == current:
                    status = SUCCESS
                elif state["host"]["passthrough"]:
                    status = ERROR_RESET_REQUIRED
                elif busy or state["host"]["clients"]:
                    status = ERROR_IN_USE
                else:
                    status = SUCCESS
        _set_value(status_ref, status)

    # -- GPU instance profiles, placements, capacity --------------------------

    def _gi_profile_by_constant(self, device, constant):
        state = self._store.read()
        gpu, model = _mig_capable_gpu(state, device)
        constant = _int(constant)
        if not 0 <= constant < models.GI_PROFILE_COUNT:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        profile = model.gi_profiles.get(constant)
        if profile is None:
            raise _NvmlFailure(ERROR_NOT_SUPPORTED)
        self._check_profiles_listable(state, gpu)
        return profile

    @staticmethod
    def _check_profiles_listable(state, gpu):
        # Drivers before R550 cannot list profiles while MIG is disabled.
        if not mig_enabled(gpu) and _driver_major(state) < 550:
            raise _NvmlFailure(ERROR_NOT_SUPPORTED)

    @staticmethod
    def _fill_gi_profile_info(info, profile, versioned):
        if versioned and info.version != _GI_PROFILE_INFO_V2:
            raise _NvmlFailure(ERROR_ARGUMENT_VERSION_MISMATCH)
        info.id = profile.id
        info.isP2pSupported = 0
        info.sliceCount = profile.sm_slices
        info.instanceCount = profile.max_count
        info.multiprocessorCount = profile.sm_count
        info.copyEngineCount = profile.copy_engines
        info.decoderCount = profile.decoders
        info.encoderCount = profile.encoders
        info.jpegCount = profile.jpegs
        info.ofaCount = profile.ofas
        info.memorySizeMB = profile.memory_mib
        if versioned:
            info.name = ("MIG " + profile.name).encode()

    @_symbol("nvmlDeviceGetGpuInstanceProfileInfo")
    def _gi_profile_info_v1(self, device, constant, info_ref):
        self._fill_gi_profile_info(_target(info_ref), self._gi_profile_by_constant(device, constant), False)

    @_symbol("nvmlDeviceGetGpuInstanceProfileInfoV")
    def _gi_profile_info_v2(self, device, constant, info_ref):
        self._fill_gi_profile_info(_target(info_ref), self._gi_profile_by_constant(device, constant), True)

    @_symbol("nvmlDeviceGetGpuInstanceProfileInfoByIdV")
    def _gi_profile_info_by_id(self, device, profile_id, info_ref):
        state = self._store.read()
        gpu, model = _mig_capable_gpu(state, device)
        profile = _known_gi_profile(model, profile_id)
        self._check_profiles_listable(state, gpu)
        self._fill_gi_profile_info(_target(info_ref), profile, True)

    @_symbol("nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    def _gi_possible_placements(self, device, profile_id, array, count_ref):
        _gpu, model = _mig_capable_gpu(self._store.read(), device)
        profile = _known_gi_profile(model, profile_id)
        placements = [(start, profile.memory_slices) for start in profile.starts]
        _fill_array(array, count_ref, placements, _store_placement)

    @_symbol("nvmlDeviceGetGpuInstanceRemainingCapacity")
    def _gi_remaining_capacity(self, device, profile_id, count_ref):
        # Answered with MIG disabled too (driver 580): the GPU is then empty.
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        profile = _known_gi_profile(model, profile_id)
        _set_value(count_ref, _gi_remaining(gpu, model, profile))

    # -- GPU instances --------------------------------------------------------

    def _create_gi(self, device, profile_id, placement, instance_ref):
        with self._store.transaction() as state:
            gpu, model = _mig_capable_gpu(state, device)
            _refuse_if_denied(state)
            _require_mig_enabled(gpu)
            profile = _known_gi_profile(model, profile_id)
            free = _free_gi_starts(gpu, model, profile)
            if placement is None:
                if not free:
                    raise _NvmlFailure(ERROR_INSUFFICIENT_RESOURCES)
                start = _choose_start(state, free)
            else:
                start, size = placement
                if start not in profile.starts or size != profile.memory_slices:
                    raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
                if start not in free:
                    raise _NvmlFailure(ERROR_INSUFFICIENT_RESOURCES)
            gi = {
                "id": _lowest_free_id({item["id"] for item in gpu["gpu_instances"]}, 1),
                "profile_id": profile.id,
                "start": start,
                "size": profile.memory_slices,
                "serial": _next_serial(state),
                "compute_instances": [],
            }
            gpu["gpu_instances"].append(gi)
        _set_handle(instance_ref, _handle(_KIND_GI, gi["serial"]))

    @_symbol("nvmlDeviceCreateGpuInstance")
    def _create_gpu_instance(self, device, profile_id, instance_ref):
        self._create_gi(device, _int(profile_id), None, instance_ref)

    @_symbol("nvmlDeviceCreateGpuInstanceWithPlacement")
    def _create_gpu_instance_with_placement(self, device, profile_id, placement, instance_ref):
        self._create_gi(device, _int(profile_id), _placement_arg(placement), instance_ref)

    @_symbol("nvmlDeviceGetGpuInstances")
    def _gpu_instances(self, device, profile_id, array, count_ref):
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        _require_mig_enabled(gpu)
        profile = _known_gi_profile(model, profile_id)
        found = sorted((gi for gi in gpu["gpu_instances"] if gi["profile_id"] == profile.id),
                       key=lambda gi: gi["id"])
        _fill_array(array, count_ref, [_handle(_KIND_GI, gi["serial"]) for gi in found], _store_handle)

    @_symbol("nvmlDeviceGetGpuInstanceById")
    def _gpu_instance_by_id(self, device, gi_id, instance_ref):
        gpu, _model_ = _mig_capable_gpu(self._store.read(), device)
        _require_mig_enabled(gpu)
        for gi in gpu["gpu_instances"]:
            if gi["id"] == _int(gi_id):
                return _set_handle(instance_ref, _handle(_KIND_GI, gi["serial"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlGpuInstanceGetInfo")
    def _gpu_instance_info(self, instance, info_ref):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        info = _target(info_ref)
        _set_handle_field(info, "device", _handle(_KIND_GPU, gpu["index"]))
        info.id = gi["id"]
        info.profileId = gi["profile_id"]
        info.placement.start = gi["start"]
        info.placement.size = gi["size"]

    @_symbol("nvmlGpuInstanceDestroy")
    def _destroy_gpu_instance(self, instance):
        with self._store.transaction() as state:
            gpu, gi = _gpu_instance(state, instance)
            _refuse_if_denied(state)
            if gi["compute_instances"] or gpu_processes(state, gpu, gi["id"]):
                raise _NvmlFailure(ERROR_IN_USE)
            gpu["gpu_instances"].remove(gi)

    # -- compute instances ----------------------------------------------------

    @staticmethod
    def _ci_profile(model, gi, profile_id):
        """(GI profile, CI SM slices) for a CI profile id inside this GI; NOT_SUPPORTED if invalid there."""
        gi_profile = profile_of_gi(model, gi)
        slices = slices_of_ci_profile(_int(profile_id))
        if slices is None or not models.ci_profile_valid(slices, gi_profile.sm_slices):
            raise _NvmlFailure(ERROR_NOT_SUPPORTED)
        return gi_profile, slices

    def _ci_profile_info(self, instance, constant, engine_profile, info_ref, versioned):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        if not 0 <= _int(constant) < models.CI_PROFILE_COUNT or _int(engine_profile) != 0:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        gi_profile, slices = self._ci_profile(model_of(gpu), gi, constant)
        info = _target(info_ref)
        if versioned and info.version != _CI_PROFILE_INFO_V2:
            raise _NvmlFailure(ERROR_ARGUMENT_VERSION_MISMATCH)
        info.id = _int(constant)
        info.sliceCount = slices
        info.instanceCount = gi_profile.sm_slices // slices
        info.multiprocessorCount = gi_profile.sm_count * slices // gi_profile.sm_slices
        info.sharedCopyEngineCount = gi_profile.copy_engines
        info.sharedDecoderCount = gi_profile.decoders
        info.sharedEncoderCount = gi_profile.encoders
        info.sharedJpegCount = gi_profile.jpegs
        info.sharedOfaCount = gi_profile.ofas
        if versioned:
            name = gi_profile.name if slices == gi_profile.sm_slices else "%dc.%s" % (slices, gi_profile.name)
            info.name = ("MIG " + name).encode()

    @_symbol("nvmlGpuInstanceGetComputeInstanceProfileInfo")
    def _ci_profile_info_v1(self, instance, constant, engine_profile, info_ref):
        self._ci_profile_info(instance, constant, engine_profile, info_ref, False)

    @_symbol("nvmlGpuInstanceGetComputeInstanceProfileInfoV")
    def _ci_profile_info_v2(self, instance, constant, engine_profile, info_ref):
        self._ci_profile_info(instance, constant, engine_profile, info_ref, True)

    @_symbol("nvmlGpuInstanceGetComputeInstanceRemainingCapacity")
    def _ci_remaining_capacity(self, instance, profile_id, count_ref):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        gi_profile, slices = self._ci_profile(model_of(gpu), gi, profile_id)
        _set_value(count_ref, _ci_remaining(gi, gi_profile, slices))

    @_symbol("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
    def _ci_possible_placements(self, instance, profile_id, array, count_ref):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        gi_profile, slices = self._ci_profile(model_of(gpu), gi, profile_id)
        placements = [(start, slices) for start in models.ci_placement_starts(slices, gi_profile.sm_slices)]
        _fill_array(array, count_ref, placements, _store_placement)

    def _create_ci(self, instance, profile_id, placement, instance_ref):
        with self._store.transaction() as state:
            gpu, gi = _gpu_instance(state, instance)
            _refuse_if_denied(state)
            gi_profile, slices = self._ci_profile(model_of(gpu), gi, profile_id)
            free = _free_ci_starts(gi, gi_profile, slices)
            if placement is None:
                if not free:
                    raise _NvmlFailure(ERROR_INSUFFICIENT_RESOURCES)
                start = _choose_start(state, free)
            else:
                start, size = placement
                if start not in models.ci_placement_starts(slices, gi_profile.sm_slices) or size != slices:
                    raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
                if start not in free:
                    raise _NvmlFailure(ERROR_INSUFFICIENT_RESOURCES)
            serial = _next_serial(state)
            ci = {
                "id": _lowest_free_id({item["id"] for item in gi["compute_instances"]}, 0),
                "profile_id": _int(profile_id),
                "start": start,
                "size": slices,
                "serial": serial,
                "uuid": _mig_uuid(gpu, serial),
            }
            gi["compute_instances"].append(ci)
        _set_handle(instance_ref, _handle(_KIND_CI, ci["serial"]))

    @_symbol("nvmlGpuInstanceCreateComputeInstance")
    def _create_compute_instance(self, instance, profile_id, instance_ref):
        self._create_ci(instance, profile_id, None, instance_ref)

    @_symbol("nvmlGpuInstanceCreateComputeInstanceWithPlacement")
    def _create_compute_instance_with_placement(self, instance, profile_id, placement, instance_ref):
        self._create_ci(instance, profile_id, _placement_arg(placement), instance_ref)

    @_symbol("nvmlGpuInstanceGetComputeInstances")
    def _compute_instances(self, instance, profile_id, array, count_ref):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        self._ci_profile(model_of(gpu), gi, profile_id)
        found = sorted((ci for ci in gi["compute_instances"] if ci["profile_id"] == _int(profile_id)),
                       key=lambda ci: ci["id"])
        _fill_array(array, count_ref, [_handle(_KIND_CI, ci["serial"]) for ci in found], _store_handle)

    @_symbol("nvmlGpuInstanceGetComputeInstanceById")
    def _compute_instance_by_id(self, instance, ci_id, instance_ref):
        _gpu, gi = _gpu_instance(self._store.read(), instance)
        for ci in gi["compute_instances"]:
            if ci["id"] == _int(ci_id):
                return _set_handle(instance_ref, _handle(_KIND_CI, ci["serial"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlComputeInstanceGetInfo_v2")
    def _compute_instance_info(self, instance, info_ref):
        gpu, gi, ci = _compute_instance(self._store.read(), instance)
        info = _target(info_ref)
        _set_handle_field(info, "device", _handle(_KIND_MIG, ci["serial"]))
        _set_handle_field(info, "gpuInstance", _handle(_KIND_GI, gi["serial"]))
        info.id = ci["id"]
        info.profileId = ci["profile_id"]
        info.placement.start = ci["start"]
        info.placement.size = ci["size"]

    @_symbol("nvmlComputeInstanceDestroy")
    def _destroy_compute_instance(self, instance):
        with self._store.transaction() as state:
            gpu, gi, ci = _compute_instance(state, instance)
            _refuse_if_denied(state)
            if gpu_processes(state, gpu, gi["id"], ci["id"]):
                raise _NvmlFailure(ERROR_IN_USE)
            gi["compute_instances"].remove(ci)

    # -- MIG device handles ---------------------------------------------------

    @_symbol("nvmlDeviceGetMaxMigDeviceCount")
    def _max_mig_devices(self, device, count_ref):
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        # Zero while MIG is disabled, as driver 580 reports (tests/data/nvml-captures).
        _set_value(count_ref, model.sm_slices if mig_enabled(gpu) else 0)

    @_symbol("nvmlDeviceGetMigDeviceHandleByIndex")
    def _mig_device_by_index(self, device, index, device_ref):
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        index = _int(index)
        if not 0 <= index < model.sm_slices:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        devices = mig_devices(gpu)
        if index >= len(devices):
            raise _NvmlFailure(ERROR_NOT_FOUND)
        _set_handle(device_ref, _handle(_KIND_MIG, devices[index][1]["serial"]))

    @_symbol("nvmlDeviceIsMigDeviceHandle")
    def _is_mig_device_handle(self, device, result_ref):
        _gpu, _gi, ci = _device(self._store.read(), device)
        _set_value(result_ref, 0 if ci is None else 1)

    @_symbol("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
    def _parent_of_mig_device(self, device, parent_ref):
        gpu, _gi, ci = _device(self._store.read(), device)
        if ci is None:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        _set_handle(parent_ref, _handle(_KIND_GPU, gpu["index"]))

    @_symbol("nvmlDeviceGetGpuInstanceId")
    def _mig_device_gi_id(self, device, id_ref):
        _gpu, gi, ci = _device(self._store.read(), device)
        if ci is None:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        _set_value(id_ref, gi["id"])

    @_symbol("nvmlDeviceGetComputeInstanceId")
    def _mig_device_ci_id(self, device, id_ref):
        _gpu, _gi, ci = _device(self._store.read(), device)
        if ci is None:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        _set_value(id_ref, ci["id"])


def _known_gi_profile(model, profile_id):
    # A profile id this GPU does not have: NOT_SUPPORTED, as real drivers answer
    # when a profile id from another GPU type is used (mig-parted issue #157).
    profile = models.gi_profile_by_id(model, _int(profile_id))
    if profile is None:
        raise _NvmlFailure(ERROR_NOT_SUPPORTED)
    return profile


def _require_mig_enabled(gpu):
    if not mig_enabled(gpu):
        raise _NvmlFailure(ERROR_NOT_SUPPORTED)


def _fault_armed(fault, symbol):
    return symbol in fault["symbols"] and (fault["sticky"] or fault["calls"] < fault["nth"])


# The soname pynvml asks the dynamic loader for.
SONAME = "libnvidia-ml.so.1"


def open_library(state_path, path=SONAME):
    """What ``ctypes.CDLL(path)`` gives on the simulated host: the simulated library, or OSError.

    A host driver (the default) answers to the soname, as the dynamic loader
    finds it on the host's library path. A containerized driver (host quirk
    ``driver_root``, as the GPU Operator's driver container mounts it) answers
    only to a libnvidia-ml.so.1 file that exists under that root; the soname
    alone then fails, as it does on such a host.
    """
    state_path = os.path.abspath(state_path)
    if not os.path.isfile(state_path):
        raise SimulatorError("the simulated host state %s does not exist (set by %s)" % (state_path, STATE_ENV))
    root = StateStore(state_path).read()["host"].get("driver_root")
    if root is None:
        found = path == SONAME
    else:
        real = os.path.realpath(path) if os.path.isabs(path) else None
        found = bool(real) and os.path.isfile(real) and \
            real.startswith(os.path.realpath(root).rstrip(os.sep) + os.sep)
    if not found:
        raise OSError("%s: cannot open shared object file: No such file or directory" % path)
    return SimulatedNvml(state_path)


def install(state_path):
    """Make pynvml use the simulated library of a host-driver host (tests, tools); returns it."""
    # Imported here only: the CLI and the nvidia-smi shim run without pynvml.
    import pynvml   # pylint: disable=import-outside-toplevel

    library = open_library(state_path)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()   # pylint: disable=protected-access
    return library
