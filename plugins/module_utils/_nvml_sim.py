# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

# A simulated libnvidia-ml that sits *beneath* pynvml, plus the host operations
# (GPU reset, reboot, processes, faults) that tests, tools/mig-sim and the
# tools/sim-bin/nvidia-smi shim perform on a simulated host.
# PRIVATE to the gpuops.mig collection; may change at any time.
#
# install(path) replaces pynvml.nvmlLib with SimulatedNvml(path). pynvml then
# looks up C symbols by name on that object and calls them with its own ctypes
# arguments, so every pynvml wrapper runs unchanged. One JSON file holds the
# whole host; several processes share it (see _StateStore). docs/simulator.md
# describes the behaviour, the file format and what is assumed.
# stdlib + ctypes only: this file must import on a target host without pynvml.

import contextlib
import ctypes
import fcntl
import functools
import importlib.util
import json
import os
import re
import tempfile
import uuid

if __name__.startswith("ansible_collections."):
    from ansible_collections.gpuops.mig.plugins.module_utils import _nvml_sim_models as models
else:
    # Loaded by file path (tools/mig-sim, the nvidia-smi shim): take the sibling file.
    _MODELS_SPEC = importlib.util.spec_from_file_location(
        "gpuops_mig_nvml_sim_models",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "_nvml_sim_models.py"))
    models = importlib.util.module_from_spec(_MODELS_SPEC)
    _MODELS_SPEC.loader.exec_module(models)

STATE_ENV = "GPUOPS_MIG_SIMULATE"
FORMAT_VERSION = 1
DEFAULT_DRIVER_VERSION = "570.124.06"
DEFAULT_CUDA_DRIVER_VERSION = 12080
DEFAULT_SEED = "gpuops"
MAX_GPUS = 32
AUTO_PLACEMENTS = ("highest", "lowest")

# NVML return codes (nvml.h; the same values as pynvml's NVML_ERROR_*).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_RESET_REQUIRED = 16
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25

# code -> (name without NVML_ERROR_, nvmlErrorString text)
ERRORS = {
    0: ("SUCCESS", "Success"),
    1: ("UNINITIALIZED", "Uninitialized"),
    2: ("INVALID_ARGUMENT", "Invalid Argument"),
    3: ("NOT_SUPPORTED", "Not Supported"),
    4: ("NO_PERMISSION", "Insufficient Permissions"),
    5: ("ALREADY_INITIALIZED", "Already Initialized"),
    6: ("NOT_FOUND", "Not Found"),
    7: ("INSUFFICIENT_SIZE", "Insufficient Size"),
    8: ("INSUFFICIENT_POWER", "Insufficient External Power"),
    9: ("DRIVER_NOT_LOADED", "Driver Not Loaded"),
    10: ("TIMEOUT", "Timeout"),
    11: ("IRQ_ISSUE", "Interrupt Request Issue"),
    12: ("LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"),
    13: ("FUNCTION_NOT_FOUND", "Function Not Found"),
    14: ("CORRUPTED_INFOROM", "Corrupted infoROM"),
    15: ("GPU_IS_LOST", "GPU is lost"),
    16: ("RESET_REQUIRED", "GPU requires restart"),
    17: ("OPERATING_SYSTEM", "The operating system has blocked the request."),
    18: ("LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."),
    19: ("IN_USE", "In use by another client"),
    20: ("MEMORY", "Insufficient Memory"),
    21: ("NO_DATA", "No data"),
    22: ("VGPU_ECC_NOT_SUPPORTED", "The requested vgpu operation is not available on target device, because ECC is enabled"),
    23: ("INSUFFICIENT_RESOURCES", "Insufficient Resources"),
    24: ("FREQ_NOT_SUPPORTED", "Frequency not supported"),
    25: ("ARGUMENT_VERSION_MISMATCH", "Argument version mismatch"),
    26: ("DEPRECATED", "Deprecated"),
    27: ("NOT_READY", "Not Ready"),
    28: ("GPU_NOT_FOUND", "GPU not found"),
    29: ("INVALID_STATE", "Invalid state"),
    30: ("RESET_TYPE_NOT_SUPPORTED", "Reset type not supported"),
    999: ("UNKNOWN", "Unknown Error"),
}

MIG_DISABLE = 0
MIG_ENABLE = 1
NOT_AVAILABLE = 0xFFFFFFFF   # gpuInstanceId/computeInstanceId of a process outside MIG
MIB = 1024 * 1024

# Struct versions pynvml sets before calling the versioned ("V"/_v2) symbols.
_GI_PROFILE_INFO_V2 = 0x02000098
_CI_PROFILE_INFO_V2 = 0x02000088
_MEMORY_V2 = 0x02000028
_PCI_INFO_EXT_V1 = 0x1000040

# The first eight bus ids of a DGX A100/H100; later GPUs get made-up ones.
_DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_UUID_NAMESPACE = uuid.UUID("6d1b7c3e-2f0a-4c55-9e57-5a1d0c6e2b90")

PROCESS_TYPES = ("compute", "graphics", "mps")

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


class SimulatorError(ValueError):
    """Bad input to a simulator operation, or an unusable state file."""


class UnknownGpuError(SimulatorError):
    """No GPU on the simulated host matches a given bus id, UUID or index."""


class _NvmlFailure(Exception):
    """Ends a simulated NVML call with an NVML return code."""

    def __init__(self, code):
        super(_NvmlFailure, self).__init__(code)
        self.code = code


# ---------------------------------------------------------------------------
# State file: JSON, replaced atomically; read-modify-write under flock.
# ---------------------------------------------------------------------------

def _read_file(path):
    try:
        with open(path) as handle:
            stat = os.fstat(handle.fileno())
            text = handle.read()
    except (IOError, OSError) as exc:
        raise SimulatorError("cannot read the simulated host state %s: %s" % (path, exc.strerror or exc))
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise SimulatorError("the simulated host state %s is not valid JSON: %s" % (path, exc))
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise SimulatorError("the simulated host state %s is not format %d" % (path, FORMAT_VERSION))
    return _stat_key(stat), text, state


def _stat_key(stat):
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _dump(state):
    # Compact on purpose: json's C encoder only runs without indent, and every change rewrites the file.
    return json.dumps(state, sort_keys=True, separators=(",", ":")) + "\n"


def _write_file(path, text):
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path):
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise SimulatorError("cannot lock the simulated host state %s: %s" % (path, exc.strerror))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # also releases the lock


class _StateStore(object):
    """One state file. read() is cached until the file changes; transaction() is the only writer."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self._key = None
        self._state = None

    def read(self):
        """The current state; callers must not modify it."""
        try:
            key = _stat_key(os.stat(self.path))
        except OSError as exc:
            raise SimulatorError("cannot read the simulated host state %s: %s" % (self.path, exc.strerror))
        if key != self._key:
            self._key, _text, self._state = _read_file(self.path)
        return self._state

    @contextlib.contextmanager
    def transaction(self):
        """Yields a fresh, private copy of the state; writes it back only if the block succeeds and changed it."""
        with _locked(self.path):
            key, text, state = _read_file(self.path)
            yield state
            new_text = _dump(state)
            if new_text != text:
                _write_file(self.path, new_text)
                key = _stat_key(os.stat(self.path))   # we hold the lock: nobody replaced it since
            self._key, self._state = key, state


def load_state(path):
    """The state of a simulated host as a dict (a private copy)."""
    return _read_file(os.path.abspath(path))[2]


# ---------------------------------------------------------------------------
# Host, GPU and geometry helpers (plain functions over the state dict)
# ---------------------------------------------------------------------------

def _model(gpu):
    try:
        return models.MODELS[gpu["model"]]
    except KeyError:
        raise SimulatorError("GPU %d has unknown model %r" % (gpu["index"], gpu["model"]))


def _driver_major(state):
    return int(state["driver_version"].split(".")[0])


def _is_hopper_or_newer(model):
    return model.architecture >= models.ARCH_HOPPER


def _host_pid_alive(pid):
    """A live process is a real one: it exists and is not a zombie.

    The same test as _nvml.pid_alive; kept here because the simulator must load
    without pynvml (tools/mig-sim runs on a bare python3), and _nvml imports it.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (IOError, OSError, IndexError):
        return True


def _gpu_processes(state, gpu, gi_id=None, ci_id=None):
    found = []
    for proc in state["processes"]:
        if proc["gpu"] != gpu["index"]:
            continue
        # A "live" entry mirrors a real host process: when that process ends
        # (for example killed by mig_mode/mig_config force), the GPU forgets it.
        if proc.get("live") and not _host_pid_alive(proc["pid"]):
            continue
        if gi_id is not None and proc["gi"] != gi_id:
            continue
        if ci_id is not None and proc["ci"] != ci_id:
            continue
        found.append(proc)
    return found


def _gi_profile(model, gi):
    return models.gi_profile_by_id(model, gi["profile_id"])


def _free_gi_starts(gpu, model, profile):
    """Starts where `profile` could be created now (free memory slices, count and SM slices left)."""
    used_slices = set()
    used_sm = 0
    same_profile = 0
    for gi in gpu["gpu_instances"]:
        other = _gi_profile(model, gi)
        used_slices.update(range(gi["start"], gi["start"] + other.memory_slices))
        used_sm += other.sm_slices
        same_profile += other.id == profile.id
    if same_profile >= profile.max_count or used_sm + profile.sm_slices > model.sm_slices:
        return []
    return [start for start in profile.starts
            if not used_slices.intersection(range(start, start + profile.memory_slices))]


def _gi_remaining(gpu, model, profile):
    used_sm = sum(_gi_profile(model, gi).sm_slices for gi in gpu["gpu_instances"])
    same_profile = sum(1 for gi in gpu["gpu_instances"] if gi["profile_id"] == profile.id)
    taken = []
    for start in _free_gi_starts(gpu, model, profile):
        # Placements of one profile are aligned and equal-sized: taking the first free ones is optimal.
        if all(start >= other + profile.memory_slices for other in taken):
            taken.append(start)
    return max(0, min(len(taken), profile.max_count - same_profile,
                      (model.sm_slices - used_sm) // profile.sm_slices))


def _ci_slices(profile_id):
    return models.CI_PROFILE_SLICES.get(profile_id)


def _free_ci_starts(gi, gi_profile, ci_slices):
    used = set()
    same_profile = 0
    for ci in gi["compute_instances"]:
        size = _ci_slices(ci["profile_id"])
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
    same_profile = sum(1 for ci in gi["compute_instances"] if _ci_slices(ci["profile_id"]) == ci_slices)
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
    return "MIG-%s" % uuid.uuid5(_UUID_NAMESPACE, "%s/mig/%d" % (gpu["uuid"], serial))


def _mig_devices(gpu):
    """(gi, ci) pairs in MIG device index order."""
    pairs = []
    for gi in sorted(gpu["gpu_instances"], key=lambda item: item["id"]):
        for ci in sorted(gi["compute_instances"], key=lambda item: item["id"]):
            pairs.append((gi, ci))
    return pairs


def _mig_device_name(model, gi, ci):
    """"3g.20gb" when the CI spans the GI, "1c.3g.20gb" otherwise."""
    gi_name = _gi_profile(model, gi).name
    ci_size = _ci_slices(ci["profile_id"])
    if ci_size == _gi_profile(model, gi).sm_slices:
        return gi_name
    return "%dc.%s" % (ci_size, gi_name)


def _mig_enabled(gpu):
    return gpu["mig"] is not None and gpu["mig"]["current"] == MIG_ENABLE


def _parse_bus_id(text):
    """(domain, bus, device, function) of "00000000:07:00.0", "0000:07:00.0" or "07:00.0"; None if malformed."""
    match = re.match(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$", text.strip())
    if not match:
        return None
    return tuple(int(part or "0", 16) for part in match.groups())


def _find_gpu(state, target):
    """A GPU by bus id (any common spelling), UUID or index; None if there is none."""
    target = str(target).strip()
    wanted_bus = _parse_bus_id(target)
    for gpu in state["gpus"]:
        if wanted_bus is not None and _parse_bus_id(gpu["bus_id"]) == wanted_bus:
            return gpu
        if target.lower() == gpu["uuid"].lower() or target == str(gpu["index"]):
            return gpu
    return None


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
    model = _model(gpu)
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


def _normalise_function(function):
    """The C symbols a fault on `function` (C symbol or pynvml wrapper name) applies to."""
    symbols = set(_WRAPPER_SYMBOLS.get(function, ()))
    if function in _SYMBOLS:
        symbols.add(function)
    symbols.discard("nvmlErrorString")
    return sorted(symbols)


class SimulatedNvml(object):
    """Stands in for the CDLL of libnvidia-ml.so.1; unknown symbols raise AttributeError."""

    def __init__(self, state_path):
        self._store = _StateStore(state_path)
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
            for gi, ci in _mig_devices(gpu):
                if ci["uuid"] == wanted or (legacy and legacy.groups() == (gpu["uuid"], str(gi["id"]), str(ci["id"]))):
                    return _set_handle(device_ref, _handle(_KIND_MIG, ci["serial"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlDeviceGetHandleByPciBusId_v2")
    def _handle_by_bus_id(self, bus_id_arg, device_ref):
        wanted = _parse_bus_id(_text_arg(bus_id_arg))
        if wanted is None:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        for gpu in self._store.read()["gpus"]:
            if _parse_bus_id(gpu["bus_id"]) == wanted:
                return _set_handle(device_ref, _handle(_KIND_GPU, gpu["index"]))
        raise _NvmlFailure(ERROR_NOT_FOUND)

    @_symbol("nvmlDeviceGetIndex")
    def _device_index(self, device, index_ref):
        _set_value(index_ref, _physical_gpu(self._store.read(), device)["index"])

    @_symbol("nvmlDeviceGetName")
    def _device_name(self, device, buffer, length):
        gpu, gi, ci = _device(self._store.read(), device)
        model = _model(gpu)
        name = model.name if ci is None else "%s MIG %s" % (model.name, _mig_device_name(model, gi, ci))
        _set_text(buffer, length, name)

    @_symbol("nvmlDeviceGetUUID")
    def _device_uuid(self, device, buffer, length):
        gpu, _gi, ci = _device(self._store.read(), device)
        _set_text(buffer, length, gpu["uuid"] if ci is None else ci["uuid"])

    @_symbol("nvmlDeviceGetPciInfo_v3")
    def _pci_info(self, device, info_ref):
        gpu = _device(self._store.read(), device)[0]
        domain, bus, dev, function = _parse_bus_id(gpu["bus_id"])
        info = _target(info_ref)
        info.busIdLegacy = ("%04x:%02x:%02x.%x" % (domain, bus, dev, function)).upper().encode()
        info.busId = gpu["bus_id"].encode()
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = _model(gpu).pci_device_id
        info.pciSubSystemId = 0

    @_symbol("nvmlDeviceGetPciInfoExt")
    def _pci_info_ext(self, device, info_ref):
        gpu = _device(self._store.read(), device)[0]
        info = _target(info_ref)
        if info.version != _PCI_INFO_EXT_V1:
            raise _NvmlFailure(ERROR_ARGUMENT_VERSION_MISMATCH)
        domain, bus, dev, _function = _parse_bus_id(gpu["bus_id"])
        info.domain, info.bus, info.device = domain, bus, dev
        info.pciDeviceId = _model(gpu).pci_device_id
        info.pciSubSystemId = 0
        info.baseClass, info.subClass = 0x3, 0x2   # 3D controller
        info.busId = gpu["bus_id"].encode()

    def _memory(self, device):
        state = self._store.read()
        gpu, gi, ci = _device(state, device)
        model = _model(gpu)
        if ci is None:
            total, procs = model.memory_mib, _gpu_processes(state, gpu)
        else:
            total, procs = _gi_profile(model, gi).memory_mib, _gpu_processes(state, gpu, gi["id"])
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
        _set_value(arch_ref, _model(_device(self._store.read(), device)[0]).architecture)

    @_symbol("nvmlDeviceGetCudaComputeCapability")
    def _compute_capability(self, device, major_ref, minor_ref):
        major, minor = _model(_device(self._store.read(), device)[0]).compute_capability
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
        procs = [proc for proc in _gpu_processes(state, gpu, gi and gi["id"], ci and ci["id"])
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
            busy = bool(_gpu_processes(state, gpu))
            current = gpu["mig"]["current"]
            if _is_hopper_or_newer(model):
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
        if not _mig_enabled(gpu) and _driver_major(state) < 550:
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
            if gi["compute_instances"] or _gpu_processes(state, gpu, gi["id"]):
                raise _NvmlFailure(ERROR_IN_USE)
            gpu["gpu_instances"].remove(gi)

    # -- compute instances ----------------------------------------------------

    @staticmethod
    def _ci_profile(model, gi, profile_id):
        """(GI profile, CI SM slices) for a CI profile id inside this GI; NOT_SUPPORTED if invalid there."""
        gi_profile = _gi_profile(model, gi)
        slices = _ci_slices(_int(profile_id))
        if slices is None or not models.ci_profile_valid(slices, gi_profile.sm_slices):
            raise _NvmlFailure(ERROR_NOT_SUPPORTED)
        return gi_profile, slices

    def _ci_profile_info(self, instance, constant, engine_profile, info_ref, versioned):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        if not 0 <= _int(constant) < models.CI_PROFILE_COUNT or _int(engine_profile) != 0:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        gi_profile, slices = self._ci_profile(_model(gpu), gi, constant)
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
        gi_profile, slices = self._ci_profile(_model(gpu), gi, profile_id)
        _set_value(count_ref, _ci_remaining(gi, gi_profile, slices))

    @_symbol("nvmlGpuInstanceGetComputeInstancePossiblePlacements")
    def _ci_possible_placements(self, instance, profile_id, array, count_ref):
        gpu, gi = _gpu_instance(self._store.read(), instance)
        gi_profile, slices = self._ci_profile(_model(gpu), gi, profile_id)
        placements = [(start, slices) for start in models.ci_placement_starts(slices, gi_profile.sm_slices)]
        _fill_array(array, count_ref, placements, _store_placement)

    def _create_ci(self, instance, profile_id, placement, instance_ref):
        with self._store.transaction() as state:
            gpu, gi = _gpu_instance(state, instance)
            _refuse_if_denied(state)
            gi_profile, slices = self._ci_profile(_model(gpu), gi, profile_id)
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
        self._ci_profile(_model(gpu), gi, profile_id)
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
            if _gpu_processes(state, gpu, gi["id"], ci["id"]):
                raise _NvmlFailure(ERROR_IN_USE)
            gi["compute_instances"].remove(ci)

    # -- MIG device handles ---------------------------------------------------

    @_symbol("nvmlDeviceGetMaxMigDeviceCount")
    def _max_mig_devices(self, device, count_ref):
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        # Zero while MIG is disabled, as driver 580 reports (tests/data/nvml-captures).
        _set_value(count_ref, model.sm_slices if _mig_enabled(gpu) else 0)

    @_symbol("nvmlDeviceGetMigDeviceHandleByIndex")
    def _mig_device_by_index(self, device, index, device_ref):
        gpu, model = _mig_capable_gpu(self._store.read(), device)
        index = _int(index)
        if not 0 <= index < model.sm_slices:
            raise _NvmlFailure(ERROR_INVALID_ARGUMENT)
        devices = _mig_devices(gpu)
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
    if not _mig_enabled(gpu):
        raise _NvmlFailure(ERROR_NOT_SUPPORTED)


def _fault_armed(fault, symbol):
    return symbol in fault["symbols"] and (fault["sticky"] or fault["calls"] < fault["nth"])


def install(state_path):
    """Make pynvml use the simulated library for the host in `state_path`; returns the library object."""
    # Imported here only: the CLI and the nvidia-smi shim run without pynvml.
    import pynvml   # pylint: disable=import-outside-toplevel

    state_path = os.path.abspath(state_path)
    if not os.path.isfile(state_path):
        raise SimulatorError("the simulated host state %s does not exist (set by %s)" % (state_path, STATE_ENV))
    library = SimulatedNvml(state_path)
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()   # pylint: disable=protected-access
    return library


# ---------------------------------------------------------------------------
# Host operations (Python API; tools/mig-sim and the nvidia-smi shim use these)
# ---------------------------------------------------------------------------

def parse_gpus_spec(specs):
    """["2xA100-SXM4-40GB,1xA30-24GB", "H200"] -> ["A100-SXM4-40GB", "A100-SXM4-40GB", "A30-24GB", "H200"]."""
    if isinstance(specs, str):
        specs = [specs]
    keys = []
    for spec in specs:
        for item in str(spec).split(","):
            item = item.strip()
            match = re.match(r"^(?:(\d+)\s*[xX]\s*)?(\S+)$", item)
            if not match:
                raise SimulatorError("bad GPU spec %r: expected COUNTxMODEL, e.g. 8xH100-SXM5-80GB" % item)
            count = int(match.group(1) or 1)
            if count < 1:
                raise SimulatorError("bad GPU spec %r: the count must be at least 1" % item)
            try:
                models.get_model(match.group(2))
            except ValueError as exc:
                raise SimulatorError("bad GPU spec %r: %s" % (item, exc))
            keys.extend([match.group(2)] * count)
    if not keys:
        raise SimulatorError("no GPUs given")
    if len(keys) > MAX_GPUS:
        raise SimulatorError("%d GPUs requested; the simulator supports at most %d" % (len(keys), MAX_GPUS))
    return keys


def _bus_id(index):
    bus = _DGX_BUSES[index] if index < len(_DGX_BUSES) else 0xC0 + index
    return "00000000:%02X:00.0" % bus


def _boot_id(seed, boot_count):
    return str(uuid.uuid5(_UUID_NAMESPACE, "%s/boot/%d" % (seed, boot_count)))


def create_state(path, gpus, driver_version=DEFAULT_DRIVER_VERSION, cuda_driver_version=DEFAULT_CUDA_DRIVER_VERSION,
                 nvml_version=None, seed=DEFAULT_SEED, mig="disabled", force=False):
    """Write a new simulated host to `path` and return its state.

    gpus: a spec string or a list of them, e.g. "8xH100-SXM5-80GB" or ["2xA100-SXM4-40GB", "1xA30-24GB"].
    mig: "enabled"/"disabled" (or a bool) for every MIG-capable GPU, current and pending alike.
    """
    path = os.path.abspath(path)
    keys = parse_gpus_spec(gpus)
    if not re.match(r"^\d+\.\d+(\.\d+)?$", str(driver_version)):
        raise SimulatorError("bad driver version %r: expected e.g. 570.124.06" % (driver_version,))
    try:
        cuda_driver_version = int(cuda_driver_version)
    except (TypeError, ValueError):
        raise SimulatorError("bad CUDA driver version %r: expected an integer such as 12080" % (cuda_driver_version,))
    if mig not in (True, False, "enabled", "disabled"):
        raise SimulatorError("bad MIG mode %r: expected enabled or disabled" % (mig,))
    mode = MIG_ENABLE if mig in (True, "enabled") else MIG_DISABLE
    if os.path.exists(path) and not force:
        raise SimulatorError("%s already exists; use force to overwrite it" % path)
    if not os.path.isdir(os.path.dirname(path)):
        raise SimulatorError("the directory of %s does not exist" % path)
    state = {
        "format": FORMAT_VERSION,
        "seed": str(seed),
        "driver_version": str(driver_version),
        "cuda_driver_version": cuda_driver_version,
        "nvml_version": nvml_version or "%d.%s" % (cuda_driver_version // 1000, driver_version),
        "boot_count": 0,
        "boot_id": _boot_id(seed, 0),
        "host": {
            "passthrough": False,
            "mode_change_survives_reboot": True,
            "deny_changes": False,
            "clients": [],
            "auto_placement": "highest",
        },
        "next_serial": 1,
        "gpus": [],
        "processes": [],
        "faults": [],
    }
    for index, key in enumerate(keys):
        capable = models.is_mig_capable(models.MODELS[key])
        state["gpus"].append({
            "index": index,
            "model": key,
            "uuid": "GPU-%s" % uuid.uuid5(_UUID_NAMESPACE, "%s/gpu/%d" % (seed, index)),
            "bus_id": _bus_id(index),
            "persistence_mode": 1,
            "mig": {"current": mode, "pending": mode} if capable else None,
            "gpu_instances": [],
        })
    with _locked(path):
        _write_file(path, _dump(state))
    return state


def _edit(path):
    """A transaction on an existing state file."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SimulatorError("the simulated host state %s does not exist" % path)
    return _StateStore(path).transaction()


def _gpu_by_index(state, gpu):
    try:
        index = int(gpu)
    except (TypeError, ValueError):
        raise SimulatorError("bad GPU index %r" % (gpu,))
    if not 0 <= index < len(state["gpus"]):
        raise SimulatorError("no GPU %d: this host has GPUs 0..%d" % (index, len(state["gpus"]) - 1))
    return state["gpus"][index]


def add_process(path, gpu, pid, name="python", used_memory_mib=0, gi=None, ci=None, kind="compute", live=False):
    """Start a simulated process on GPU `gpu`, or on its MIG device (gi, ci) when MIG is enabled.

    With live=True, `pid` must be a real process of this host, and the GPU lists it only while
    that process runs (so killing it frees the device, as on a real host).
    """
    with _edit(path) as state:
        target = _gpu_by_index(state, gpu)
        try:
            pid, used_memory_mib = int(pid), int(used_memory_mib)
        except (TypeError, ValueError):
            raise SimulatorError("pid and memory must be integers")
        if pid < 1 or used_memory_mib < 0:
            raise SimulatorError("bad process: pid must be positive and memory not negative")
        if kind not in PROCESS_TYPES:
            raise SimulatorError("bad process type %r: expected one of %s" % (kind, ", ".join(PROCESS_TYPES)))
        if live and not _host_pid_alive(pid):
            raise SimulatorError("--live needs a running process, and PID %d is not running" % pid)
        if (gi is None) != (ci is None):
            raise SimulatorError("give both the GPU instance and the compute instance, or neither")
        if _mig_enabled(target):
            if gi is None:
                raise SimulatorError("GPU %d has MIG enabled: a process must run on a MIG device (gi and ci)"
                                     % target["index"])
            gi, ci = int(gi), int(ci)
            if not any(g["id"] == gi and any(c["id"] == ci for c in g["compute_instances"])
                       for g in target["gpu_instances"]):
                raise SimulatorError("GPU %d has no MIG device with GPU instance %d and compute instance %d"
                                     % (target["index"], gi, ci))
        elif gi is not None:
            raise SimulatorError("GPU %d does not have MIG enabled: a process cannot use gi/ci" % target["index"])
        if any(p["pid"] == pid and p["gpu"] == target["index"] and p["gi"] == gi and p["ci"] == ci
               for p in state["processes"]):
            raise SimulatorError("process %d already runs there" % pid)
        state["processes"].append({"pid": pid, "name": str(name), "used_memory_mib": used_memory_mib, "live": bool(live),
                                   "type": kind, "gpu": target["index"], "gi": gi, "ci": ci})


def clear_processes(path, gpu=None):
    """End all simulated processes, or only those on GPU `gpu`."""
    with _edit(path) as state:
        if gpu is None:
            state["processes"] = []
        else:
            index = _gpu_by_index(state, gpu)["index"]
            state["processes"] = [p for p in state["processes"] if p["gpu"] != index]


def set_host(path, passthrough=None, mode_change_survives_reboot=None, deny_changes=None,
             add_clients=(), remove_clients=(), auto_placement=None):
    """Change host quirks; arguments left as None stay as they are."""
    with _edit(path) as state:
        host = state["host"]
        for key, value in (("passthrough", passthrough), ("mode_change_survives_reboot", mode_change_survives_reboot),
                           ("deny_changes", deny_changes)):
            if value is not None:
                host[key] = bool(value)
        if auto_placement is not None:
            if auto_placement not in AUTO_PLACEMENTS:
                raise SimulatorError("bad auto placement %r: expected one of %s"
                                     % (auto_placement, ", ".join(AUTO_PLACEMENTS)))
            host["auto_placement"] = auto_placement
        for client in add_clients:
            if client not in host["clients"]:
                host["clients"].append(client)
        for client in remove_clients:
            if client not in host["clients"]:
                raise SimulatorError("no host client %r (clients: %s)" % (client, ", ".join(host["clients"]) or "none"))
            host["clients"].remove(client)


def parse_error(error):
    """An NVML error code from 23, "23", "INSUFFICIENT_RESOURCES" or "NVML_ERROR_INSUFFICIENT_RESOURCES"."""
    text = str(error).strip()
    if text.isdigit() and int(text) in ERRORS and int(text) != SUCCESS:
        return int(text)
    name = text.upper()
    if name.startswith("NVML_ERROR_"):
        name = name[len("NVML_ERROR_"):]
    for code, (known, _message) in ERRORS.items():
        if known == name and code != SUCCESS:
            return code
    raise SimulatorError("unknown NVML error %r; use a name such as INSUFFICIENT_RESOURCES or its number" % (error,))


def add_fault(path, function, error, nth=1, sticky=False):
    """Make the nth call of `function` (C symbol or pynvml wrapper name), counted from now
    across all processes, return `error`; with sticky, every call from the nth on."""
    symbols = _normalise_function(str(function))
    if not symbols:
        raise SimulatorError("unknown NVML function %r; known C symbols: %s"
                             % (function, ", ".join(s for s in symbol_names() if s != "nvmlErrorString")))
    code = parse_error(error)
    try:
        nth = int(nth)
    except (TypeError, ValueError):
        raise SimulatorError("bad --nth %r: expected a positive integer" % (nth,))
    if nth < 1:
        raise SimulatorError("bad --nth %d: calls are counted from 1" % nth)
    with _edit(path) as state:
        state["faults"].append({"function": str(function), "symbols": symbols, "nth": nth,
                                "error": code, "sticky": bool(sticky), "calls": 0})


def clear_faults(path):
    with _edit(path) as state:
        state["faults"] = []


# nvidia-smi wording for a refused reset, and the exit code it goes with.
_RESET_REFUSALS = {
    "Insufficient Permissions": 4,
    "Not Supported": 3,
    "In use by another client": 255,
}


def reset_gpus(path, bus_ids=None):
    """Reset GPUs like `nvidia-smi -r -i ...` (all GPUs when bus_ids is empty).

    Returns [(bus_id, ok, message)], message being nvidia-smi's line for that GPU.
    A GPU resets only when nothing holds it; a reset applies the pending MIG mode
    and removes all GPU and compute instances. Unknown ids: SimulatorError, nothing reset.
    """
    results = []
    with _edit(path) as state:
        if bus_ids:
            targets = []
            for wanted in bus_ids:
                gpu = _find_gpu(state, wanted)
                if gpu is None:
                    raise UnknownGpuError("no GPU matches %r" % (wanted,))
                targets.append(gpu)
        else:
            targets = list(state["gpus"])
        for gpu in targets:
            reason = _reset_refusal(state, gpu)
            if reason:
                results.append((gpu["bus_id"], False, "Unable to reset GPU %s: %s" % (gpu["bus_id"], reason)))
                continue
            if gpu["mig"] is not None:
                gpu["mig"]["current"] = gpu["mig"]["pending"]
            gpu["gpu_instances"] = []
            results.append((gpu["bus_id"], True, "GPU %s was successfully reset." % gpu["bus_id"]))
    return results


def _reset_refusal(state, gpu):
    if state["host"]["deny_changes"]:
        return "Insufficient Permissions"
    if state["host"]["passthrough"]:
        return "Not Supported"
    if _gpu_processes(state, gpu) or state["host"]["clients"]:
        return "In use by another client"
    return None


def reset_exit_code(results):
    """nvidia-smi's exit code for reset_gpus() results: 0, or that of the first refusal."""
    for _bus_id_, ok, message in results:
        if not ok:
            return _RESET_REFUSALS.get(message.rsplit(": ", 1)[-1], 255)
    return 0


def reboot(path):
    """Simulate a host reboot; returns the new boot id.

    Instances and processes are gone. Ampere applies its pending MIG mode (unless the
    host quirk mode_change_survives_reboot is off, then it stays pending); Hopper and
    newer come back with MIG disabled.
    """
    with _edit(path) as state:
        state["boot_count"] += 1
        state["boot_id"] = _boot_id(state["seed"], state["boot_count"])
        for gpu in state["gpus"]:
            gpu["gpu_instances"] = []
            if gpu["mig"] is None:
                continue
            if _is_hopper_or_newer(_model(gpu)):
                gpu["mig"] = {"current": MIG_DISABLE, "pending": MIG_DISABLE}
            elif state["host"]["mode_change_survives_reboot"]:
                gpu["mig"]["current"] = gpu["mig"]["pending"]
        state["processes"] = []
        return state["boot_id"]


def boot_id(path):
    return load_state(path)["boot_id"]


# ---------------------------------------------------------------------------
# Text output for the CLI and the nvidia-smi shim
# ---------------------------------------------------------------------------

def _on_off(value):
    return "on" if value else "off"


def _mode_word(value):
    return "enabled" if value == MIG_ENABLE else "disabled"


def format_state(state):
    """A readable per-GPU summary (mig-sim show)."""
    host = state["host"]
    lines = [
        "driver %s  CUDA %d  NVML %s" % (state["driver_version"], state["cuda_driver_version"], state["nvml_version"]),
        "boot id %s (boot %d)" % (state["boot_id"], state["boot_count"]),
        "host: passthrough=%s mode-change-survives-reboot=%s deny-changes=%s auto-placement=%s clients=%s" % (
            _on_off(host["passthrough"]), _on_off(host["mode_change_survives_reboot"]),
            _on_off(host["deny_changes"]), host["auto_placement"], ",".join(host["clients"]) or "none"),
    ]
    for gpu in state["gpus"]:
        model = _model(gpu)
        lines.append("GPU %d  %s  %s  %s  %s" % (gpu["index"], gpu["bus_id"], gpu["model"], model.name, gpu["uuid"]))
        if gpu["mig"] is None:
            lines.append("  MIG: not supported")
        else:
            lines.append("  MIG: current %s, pending %s" % (_mode_word(gpu["mig"]["current"]),
                                                            _mode_word(gpu["mig"]["pending"])))
        for gi in sorted(gpu["gpu_instances"], key=lambda item: item["start"]):
            profile = _gi_profile(model, gi)
            lines.append("  GI %d  %s (profile id %d)  placement %d:%d" % (
                gi["id"], profile.name, gi["profile_id"], gi["start"], gi["size"]))
            for ci in sorted(gi["compute_instances"], key=lambda item: item["start"]):
                lines.append("    CI %d  %s (profile id %d)  placement %d:%d  %s" % (
                    ci["id"], _mig_device_name(model, gi, ci), ci["profile_id"], ci["start"], ci["size"], ci["uuid"]))
        for proc in _gpu_processes(state, gpu):
            where = "" if proc["gi"] is None else "  on GI %d CI %d" % (proc["gi"], proc["ci"])
            lines.append("  process %d %s  %d MiB  %s%s" % (
                proc["pid"], proc["name"], proc["used_memory_mib"], proc["type"], where))
    for fault in state["faults"]:
        spent = not fault["sticky"] and fault["calls"] >= fault["nth"]
        lines.append("fault: %s call %d%s -> %s (%d); calls so far %d%s" % (
            fault["function"], fault["nth"], " and later" if fault["sticky"] else "",
            ERRORS.get(fault["error"], ("?", ""))[0], fault["error"], fault["calls"], ", spent" if spent else ""))
    return "\n".join(lines)


def format_gpu_list(state):
    """`nvidia-smi -L` output."""
    lines = []
    for gpu in state["gpus"]:
        model = _model(gpu)
        lines.append("GPU %d: %s (UUID: %s)" % (gpu["index"], model.name, gpu["uuid"]))
        if _mig_enabled(gpu):
            for index, (gi, ci) in enumerate(_mig_devices(gpu)):
                lines.append("  MIG %-11s Device %2d: (UUID: %s)" % (_mig_device_name(model, gi, ci), index, ci["uuid"]))
    return "\n".join(lines)


def format_models():
    """The catalog, one model per line (mig-sim models)."""
    lines = ["%-16s %-24s %-10s %10s  %s" % ("KEY", "NAME", "PCI ID", "MEMORY", "MIG")]
    for model in models.MODELS.values():
        mig = "%d slices" % model.sm_slices if models.is_mig_capable(model) else "no"
        lines.append("%-16s %-24s 0x%08X %6d MiB  %s" % (
            model.key, model.name, model.pci_device_id, model.memory_mib, mig))
    return "\n".join(lines)
