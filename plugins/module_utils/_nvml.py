# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The one place that talks to NVML (through pynvml from nvidia-ml-py).

Private to the collection. Everything here is plain Python without Ansible
imports, so the boot-time restore can run it without Ansible. NVML failures
leave this file as NvmlError whose text a person understands.

The driver is found where the host has it: libnvidia-ml.so.1 on the host's
library path, or under a driver root such as the GPU Operator's driver
container mounts at /run/nvidia/driver (see find_driver).

When the environment variable GPUOPS_MIG_SIMULATE names a state file, the GPU
simulator (package gpuops_mig_sim, docs/simulator.md) stands in for the
library file beneath pynvml; pynvml's own code still runs. Without the variable
nothing of the simulator is imported, and no module payload carries it.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import signal
import subprocess
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - depends on the target host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import mig_device_name
from ansible_collections.gpuops.mig.plugins.module_utils._errors import (
    DriverNotFound,
    MissingLibrary,
    NvmlError,
    RefusedError,
)

SIMULATE_ENV = "GPUOPS_MIG_SIMULATE"
SIMULATOR_PACKAGE = "gpuops_mig_sim"

ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing",
    7: "ampere", 8: "ada", 9: "hopper", 10: "blackwell", 13: "rubin",
}
# MIG mode survives a reboot only on Ampere (stored in the InfoROM); from
# Hopper on it lives only as long as the kernel modules stay loaded.
MODE_PERSISTENT_ARCHITECTURES = ("ampere",)

# Attribute suffix per GPU-instance profile constant (go-nvlib naming rules).
_GI_SUFFIX = {7: "+me", 8: "+me", 10: "+gfx", 11: "+gfx", 12: "+gfx", 17: "+gfx",
              13: "-me", 14: "-me", 15: "+me.all", 16: "+me.all"}
_GI_PROFILE_COUNT = 0x12
_CI_PROFILE_COUNT = 0x9
_ENGINE_SHARED = 0

# NVML return codes by their pynvml names, phrased for a person.
_REASONS = {
    "NVML_ERROR_UNINITIALIZED": "NVML is not initialised",
    "NVML_ERROR_INVALID_ARGUMENT": "invalid argument",
    "NVML_ERROR_NOT_SUPPORTED": "not supported",
    "NVML_ERROR_NO_PERMISSION": ("permission denied: managing MIG needs root, or read access to the mig/config "
                                 "capability (/proc/driver/nvidia/capabilities/mig/config)"),
    "NVML_ERROR_NOT_FOUND": "not found",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "the NVML library (libnvidia-ml.so.1) was not found: is the NVIDIA driver installed?",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "the installed driver does not provide this NVML function (driver too old?)",
    "NVML_ERROR_GPU_IS_LOST": "the GPU has fallen off the bus or is otherwise inaccessible",
    "NVML_ERROR_RESET_REQUIRED": "a GPU reset or a reboot is required",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": ("the NVML library and the kernel driver versions do not match "
                                           "(reload the driver or reboot)"),
    "NVML_ERROR_IN_USE": "in use by another client (processes, or services such as nvidia-persistenced, DCGM or nvsm)",
    "NVML_ERROR_INSUFFICIENT_RESOURCES": "insufficient resources (the placement is occupied or the profile's capacity "
                                         "is used up)",
    "NVML_ERROR_INVALID_STATE": "invalid state",
    "NVML_ERROR_UNKNOWN": "unknown error reported by the driver",
}
# Failures of nvmlInit that mean "no usable driver here".
_NO_DRIVER = ("NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_LIB_RM_VERSION_MISMATCH")

# Where the GPU Operator's driver container mounts its root on the host (chart value
# hostPaths.driverInstallDir), and the file its validator writes once the driver works.
OPERATOR_DRIVER_ROOT = "/run/nvidia/driver"
OPERATOR_DRIVER_READY = "/run/nvidia/validations/driver-ready"
SONAME = "libnvidia-ml.so.1"
# Where, inside a driver root, the operator and mig-manager look for NVML and nvidia-smi, in order.
LIBRARY_DIRS = ("", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
                "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")
NVIDIA_SMI_DIRS = ("", "usr/bin", "usr/sbin", "bin", "sbin")
# driver_root values that mean "find it" and "the host's own driver".
DRIVER_ROOT_AUTO = "auto"
DRIVER_ROOT_HOST = "/"


_ERROR_NAMES = {}


def error_name(code: int | None) -> str | None:
    """pynvml's name for an NVML return code (NVML_ERROR_IN_USE), or None when it has none."""
    if code is None or not HAS_PYNVML:
        return None
    if not _ERROR_NAMES:   # read pynvml's constants once, not on every call
        for name in dir(pynvml):
            value = getattr(pynvml, name)
            if name.startswith("NVML_ERROR_") and isinstance(value, int):
                _ERROR_NAMES.setdefault(value, name)
    return _ERROR_NAMES.get(code)


def nvml_reason(code: int | None) -> str:
    name = error_name(code)
    return _REASONS.get(name, "NVML error %s" % (name or code))


def nvml_failure(what: str, exc: BaseException) -> NvmlError:
    """NvmlError for a pynvml.NVMLError raised while doing `what`."""
    code = getattr(exc, "value", None)
    return NvmlError("%s: %s" % (what, nvml_reason(code)), code, error_name(code))


def is_error(exc: BaseException, *names: str) -> bool:
    """Whether a pynvml.NVMLError (or NvmlError) carries one of the given pynvml error names."""
    code = getattr(exc, "value", getattr(exc, "code", None))
    return error_name(code) in names


def mode_name(value: int | None) -> str:
    return "enabled" if value == 1 else "disabled"


def mig_profile_memory_gb(profile_memory_mib: int, total_memory_bytes: int) -> int:
    """Memory part of a MIG profile name, computed the way NVIDIA's tools do.

    The fraction of memory is rounded up to the next eighth, multiplied by the
    total memory in GiB (rounded up) and rounded half up, so names match what
    mig-parted, the device plugin and GFD show (e.g. H200 1g = 18gb).
    """
    gib = 1024 ** 3
    fraction = (profile_memory_mib * 1024.0 * 1024.0) / float(total_memory_bytes)
    fraction = math.ceil(fraction * 8) / 8.0
    total_gb = (total_memory_bytes + gib - 1) // gib
    return int(math.floor(fraction * total_gb + 0.5))


def gi_profile_name(constant: int, sm_slices: int, memory_mib: int, total_memory_bytes: int) -> str:
    memory_gb = mig_profile_memory_gb(memory_mib, total_memory_bytes)
    return "%dg.%dgb%s" % (sm_slices, memory_gb, _GI_SUFFIX.get(constant, ""))


def mig_device_counts(gpu_instances: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The mig-parted view of a layout: MIG device name -> count."""
    counts = {}
    for gi in gpu_instances:
        for ci in gi["compute_instances"]:
            counts[ci["profile"]] = counts.get(ci["profile"], 0) + 1
    return counts


def facts_without_driver(error: str | None, simulated: str | None) -> dict[str, Any]:
    """The mig_facts view of a host whose driver (or nvidia-ml-py) cannot be used: a fact, not a failure."""
    return {"driver": {"present": False, "version": None, "cuda_version": None, "nvml_version": None,
                       "root": None, "library": None, "error": error},
            "simulated": bool(simulated), "gpu_count": 0, "mig_capable_count": 0, "gpus": []}


def missing_driver_message(error: BaseException) -> str:
    """What facts_without_driver() says for a MissingLibrary or DriverNotFound error."""
    return "nvidia-ml-py (import pynvml) is not installed" if isinstance(error, MissingLibrary) else str(error)


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# -- where the driver is ---------------------------------------------------------

class Driver(object):
    """Where this host's NVIDIA driver is: on the host (``root`` None) or under a driver root."""

    def __init__(self, root: str | None = None, library: str = SONAME, nvidia_smi: str | None = None) -> None:
        self.root = root
        self.library = library
        self.nvidia_smi = nvidia_smi

    def smi_command(self, configured: str = "nvidia-smi") -> tuple[str, dict[str, str]]:
        """(executable, environment) to run nvidia-smi for this driver.

        Under a driver root the root's own nvidia-smi runs with LD_PRELOAD set to the
        root's libnvidia-ml.so.1, as the GPU Operator's validator runs it. An
        explicitly configured executable is used as given.
        """
        if self.root is None:
            return configured, {}
        executable = self.nvidia_smi if configured == "nvidia-smi" and self.nvidia_smi else configured
        return executable, {"LD_PRELOAD": self.library}

    def as_dict(self) -> dict[str, Any]:
        return {"root": self.root, "library": self.library, "nvidia_smi": self.nvidia_smi}


def find_in_root(root: str, name: str, directories: Iterable[str]) -> str | None:
    """The file `name` in the first of `directories` under `root` that has it, or None.

    Links are followed inside the root: an absolute link target names a path of the
    root's own file system, as seen from inside the driver container.
    """
    for directory in directories:
        path = os.path.join(root, directory, name)
        for _hop in range(16):
            if not os.path.islink(path):
                break
            target = os.readlink(path)
            path = os.path.join(root, target.lstrip("/")) if os.path.isabs(target) else \
                os.path.join(os.path.dirname(path), target)
        if os.path.isfile(path):
            return os.path.normpath(path)
    return None


def driver_root_candidates(host_root: str = DRIVER_ROOT_HOST) -> list[str]:
    """Driver roots to try when the host has no library of its own, most specific first.

    The operator validator's driver-ready file names the root it validated
    (IS_HOST_DRIVER=false, NVIDIA_DRIVER_ROOT=...); the operator's default root comes next.
    """
    candidates = []
    ready = _env_file(os.path.join(host_root, OPERATOR_DRIVER_READY.lstrip("/")))
    if ready.get("IS_HOST_DRIVER", "").lower() == "false" and ready.get("NVIDIA_DRIVER_ROOT"):
        candidates.append(ready["NVIDIA_DRIVER_ROOT"])
    candidates.append(OPERATOR_DRIVER_ROOT)
    seen = []
    for root in candidates:
        root = os.path.normpath(os.path.join(host_root, root.lstrip("/")))
        if root not in seen:
            seen.append(root)
    return seen


def _env_file(path):
    values = {}
    try:
        with open(path) as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep and key and not key.startswith("#"):
                    values[key.strip()] = value.strip().strip('"')
    except (IOError, OSError):
        pass
    return values


def check_driver_root(driver_root: str | None) -> str:
    """The driver_root setting (None: auto); RefusedError for an empty one, which names no place."""
    if driver_root is None:
        return DRIVER_ROOT_AUTO
    if not driver_root.strip():
        raise RefusedError("driver_root is empty; use %s, %s or the driver's root directory"
                           % (DRIVER_ROOT_AUTO, DRIVER_ROOT_HOST))
    return driver_root


def find_driver(driver_root: str | None, open_library: Callable[[str], Any],
                host_root: str = DRIVER_ROOT_HOST) -> tuple[Driver, Any]:
    """(Driver, library handle) for the driver_root setting; DriverNotFound naming what was tried.

    ``open_library(path)`` loads a library as ctypes.CDLL does (OSError when it cannot).
    driver_root: "auto" (or None) tries the host's library path, then the driver
    roots of driver_root_candidates(); "/" means the host's own driver; any other
    path is a driver root that must hold libnvidia-ml.so.1; "" is refused.
    """
    setting = check_driver_root(driver_root)
    if setting in (DRIVER_ROOT_AUTO, DRIVER_ROOT_HOST):
        try:
            return Driver(), open_library(SONAME)
        except OSError as exc:
            host_error = exc
        if setting == DRIVER_ROOT_HOST:
            raise DriverNotFound("%s is not on the host's library path (%s): is the NVIDIA driver installed? "
                                 "With the GPU Operator's driver container, set the driver root to where it "
                                 "mounts it (%s)" % (SONAME, host_error, OPERATOR_DRIVER_ROOT), name="NVML_ERROR_LIBRARY_NOT_FOUND")
        roots = driver_root_candidates(host_root)
    else:
        roots = [setting]
    tried = []
    for root in roots:
        library = find_in_root(root, SONAME, LIBRARY_DIRS)
        if library is None:
            tried.append("%s (no %s in %s)" % (root, SONAME, ", ".join("/" + d for d in LIBRARY_DIRS)))
            continue
        try:
            handle = open_library(library)
        except OSError as exc:
            raise DriverNotFound("cannot load %s of the driver root %s: %s" % (library, root, exc),
                                 name="NVML_ERROR_LIBRARY_NOT_FOUND")
        return Driver(root, library, find_in_root(root, "nvidia-smi", NVIDIA_SMI_DIRS)), handle
    if setting == DRIVER_ROOT_AUTO:
        raise DriverNotFound("%s is neither on the host's library path nor under a driver root (tried %s): is the "
                             "NVIDIA driver installed, or the GPU Operator's driver container running? Set the "
                             "driver root if it is mounted elsewhere" % (SONAME, "; ".join(tried)),
                             name="NVML_ERROR_LIBRARY_NOT_FOUND")
    raise DriverNotFound("the driver root %s holds no NVIDIA driver: %s" % (setting, tried[0].split(" (", 1)[1][:-1]),
                         name="NVML_ERROR_LIBRARY_NOT_FOUND")


class Nvml(object):
    """A session with NVML: ``with Nvml(driver_root="auto") as nvml: ...``.

    GPUs are addressed by index; handles are looked up again after a MIG
    mode change because the driver may hand out new ones. ``driver`` says where
    the driver was found once the session is open.
    """

    def __init__(self, simulate: str | None = None, driver_root: str | None = None) -> None:
        self.simulate = simulate if simulate is not None else os.environ.get(SIMULATE_ENV) or None
        self.driver_root = driver_root
        self.driver = None
        self._handles = {}
        self._described = {}

    # -- session -------------------------------------------------------------
    def __enter__(self):
        if not HAS_PYNVML:
            raise MissingLibrary("nvidia-ml-py (import pynvml) is not installed")
        self.driver, library = find_driver(self.driver_root, self._library_opener())
        # What pynvml's own loader does with CDLL(soname), done here so the library may
        # come from a driver root; pynvml then looks its symbols up on this handle.
        pynvml.nvmlLib = library
        getattr(pynvml, "_nvmlGetFunctionPointer_cache", {}).clear()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            where = "" if self.driver.root is None else " (driver root %s)" % self.driver.root
            if error_name(code) in _NO_DRIVER:
                raise DriverNotFound(nvml_reason(code) + where, code, error_name(code))
            raise NvmlError("NVML could not be initialised%s: %s" % (where, nvml_reason(code)), code, error_name(code))
        return self

    def _library_opener(self):
        """ctypes.CDLL, or with GPUOPS_MIG_SIMULATE the simulator's stand-in for it."""
        if not self.simulate:
            return ctypes.CDLL
        try:
            simulator = __import__(SIMULATOR_PACKAGE)
        except ImportError:
            raise NvmlError("%s is set (%s), but the GPU simulator (package %s) is not importable by this Python: "
                            "put the collection's simulator/ directory on the test host's Python path "
                            "(docs/simulator.md), or unset %s" % (SIMULATE_ENV, self.simulate, SIMULATOR_PACKAGE,
                                                                  SIMULATE_ENV))

        def open_simulated(path):
            try:
                return simulator.open_library(self.simulate, path)
            except simulator.SimulatorError as exc:
                raise NvmlError("the simulated GPU host cannot be used: %s" % exc)
        return open_simulated

    def __exit__(self, *exc):
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
        return False

    def _call(self, what, fn, *args):
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            raise nvml_failure(what, e)

    # -- system --------------------------------------------------------------
    def driver_version(self) -> str:
        return _text(self._call("reading the driver version", pynvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        v = self._call("reading the CUDA driver version", pynvml.nvmlSystemGetCudaDriverVersion)
        return "%d.%d" % (v // 1000, (v % 1000) // 10)

    def nvml_version(self) -> str:
        return _text(self._call("reading the NVML version", pynvml.nvmlSystemGetNVMLVersion))

    def gpu_count(self) -> int:
        return self._call("counting GPUs", pynvml.nvmlDeviceGetCount)

    # -- GPUs ----------------------------------------------------------------
    def handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call("opening GPU %d" % index,
                                              pynvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def gpu(self, index: int) -> dict[str, Any]:
        """Identity and MIG mode of one GPU, as a dict (cached per session)."""
        if index in self._described:
            return self._described[index]
        h = self.handle(index)
        what = "reading GPU %d" % index
        pci = self._call(what, pynvml.nvmlDeviceGetPciInfo, h)
        mem = self._call(what, pynvml.nvmlDeviceGetMemoryInfo, h)
        arch = self._call(what, pynvml.nvmlDeviceGetArchitecture, h)
        try:
            cc = "%d.%d" % tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
        except pynvml.NVMLError:
            cc = None
        info = {
            "index": index,
            "uuid": _text(self._call(what, pynvml.nvmlDeviceGetUUID, h)),
            "name": _text(self._call(what, pynvml.nvmlDeviceGetName, h)),
            "pci_bus_id": _text(pci.busId),
            "pci_device_id": "0x%08X" % pci.pciDeviceId,
            "memory_total_mib": mem.total // (1024 * 1024),
            "memory_total_bytes": mem.total,
            "architecture": ARCHITECTURES.get(arch, "unknown"),
            "compute_capability": cc,
        }
        info["label"] = "GPU %d (%s, %s)" % (index, info["name"], info["pci_bus_id"])
        info["mig_mode_persists_across_reboot"] = info["architecture"] in MODE_PERSISTENT_ARCHITECTURES
        self._described[index] = info
        return info

    def mig_mode(self, index: int) -> tuple[int, int] | None:
        """(current, pending) as 0/1, or None when the GPU is not MIG-capable."""
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(self.handle(index))
        except pynvml.NVMLError as e:
            if is_error(e, "NVML_ERROR_NOT_SUPPORTED"):
                return None
            raise nvml_failure("%s: reading the MIG mode" % self.gpu(index)["label"], e)
        return current, pending

    def set_mig_mode(self, index: int, enabled: bool) -> int:
        """Ask the driver for a MIG mode; returns the NVML activation status code."""
        label = self.gpu(index)["label"]
        status = self._call("%s: setting MIG mode %s" % (label, mode_name(1 if enabled else 0)),
                            pynvml.nvmlDeviceSetMigMode, self.handle(index), 1 if enabled else 0)
        self.forget_handles()
        return status

    def forget_handles(self) -> None:
        self._handles.clear()

    # -- profiles ------------------------------------------------------------
    def gi_profiles(self, index: int) -> list[dict[str, Any]]:
        """GPU-instance profiles this GPU supports, read from NVML (IDs differ per model)."""
        h = self.handle(index)
        gpu = self.gpu(index)
        profiles = []
        for constant in range(_GI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, constant)
            except pynvml.NVMLError as e:
                if is_error(e, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND"):
                    continue  # this profile does not exist on this GPU
                raise nvml_failure("%s: reading MIG profiles" % gpu["label"], e)
            placements = self._gi_placements(index, info.id)
            name = gi_profile_name(constant, info.sliceCount, info.memorySizeMB, gpu["memory_total_bytes"])
            nvml_name = _text(info.name).replace("MIG ", "", 1) if info.name else name
            profiles.append({
                "name": name,
                "nvml_name": nvml_name,
                "id": info.id,
                "constant": constant,
                "sm_slices": info.sliceCount,
                "memory_slices": placements[0][1] if placements else 0,
                "max_count": info.instanceCount,
                "memory_mib": info.memorySizeMB,
                "multiprocessors": info.multiprocessorCount,
                "placements": [start for start, _size in placements],
            })
        return profiles

    def _gi_placements(self, index, profile_id):
        h = self.handle(index)
        count = pynvml.c_uint(0)
        what = "%s: reading placements of MIG profile %d" % (self.gpu(index)["label"], profile_id)
        self._call(what, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, None, pynvml.byref(count))
        if not count.value:
            return []
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(what, pynvml.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, array, pynvml.byref(count))
        return [(array[i].start, array[i].size) for i in range(count.value)]

    def ci_profiles(self, gi_handle: Any) -> list[tuple[int, Any]]:
        """Compute-instance profiles of one existing GPU instance: [(constant, info)]."""
        found = []
        for constant in range(_CI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, constant, _ENGINE_SHARED)
            except pynvml.NVMLError:
                continue
            found.append((constant, info))
        return found

    def ci_placements(self, gi_handle: Any, ci_profile_id: int) -> list[tuple[int, int]]:
        count = pynvml.c_uint(0)
        what = "reading compute-instance placements"
        self._call(what, pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements,
                   gi_handle, ci_profile_id, None, pynvml.byref(count))
        if not count.value:
            return []
        array = (pynvml.c_nvmlComputeInstancePlacement_t * count.value)()
        self._call(what, pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements,
                   gi_handle, ci_profile_id, array, pynvml.byref(count))
        return [(array[i].start, array[i].size) for i in range(count.value)]

    # -- instances -----------------------------------------------------------
    def gpu_instance_handles(self, index: int, profiles: Sequence[Mapping[str, Any]] | None = None
                             ) -> list[tuple[Any, Any]]:
        """[(gi_handle, info)] for every GPU instance on the GPU."""
        h = self.handle(index)
        label = self.gpu(index)["label"]
        found = []
        for profile in profiles if profiles is not None else self.gi_profiles(index):
            count = pynvml.c_uint(0)
            array = (pynvml.c_nvmlGpuInstance_t * max(profile["max_count"], 1))()
            self._call("%s: listing GPU instances" % label, pynvml.nvmlDeviceGetGpuInstances,
                       h, profile["id"], array, pynvml.byref(count))
            for i in range(count.value):
                gi = array[i]
                info = self._call("%s: reading a GPU instance" % label, pynvml.nvmlGpuInstanceGetInfo, gi)
                found.append((gi, info))
        found.sort(key=lambda item: (item[1].placement.start, item[1].id))
        return found

    def compute_instance_handles(self, gi_handle: Any, label: str) -> list[tuple[Any, Any, Any]]:
        found = []
        for _constant, ci_profile in self.ci_profiles(gi_handle):
            count = pynvml.c_uint(0)
            array = (pynvml.c_nvmlComputeInstance_t * max(ci_profile.instanceCount, 1))()
            self._call("%s: listing compute instances" % label, pynvml.nvmlGpuInstanceGetComputeInstances,
                       gi_handle, ci_profile.id, array, pynvml.byref(count))
            for i in range(count.value):
                info = self._call("%s: reading a compute instance" % label,
                                  pynvml.nvmlComputeInstanceGetInfo, array[i])
                found.append((array[i], info, ci_profile))
        found.sort(key=lambda item: (item[1].placement.start, item[1].id))
        return found

    def mig_devices(self, index: int) -> dict[tuple[int, int], dict[str, Any]]:
        """{(gi_id, ci_id): {"uuid": ..., "processes": [...]}} for the GPU's MIG devices."""
        h = self.handle(index)
        label = self.gpu(index)["label"]
        devices = {}
        total = self._call("%s: counting MIG devices" % label, pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
        for i in range(total):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError as e:
                if is_error(e, "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_FOUND"):
                    continue  # no MIG device at this index
                raise nvml_failure("%s: reading MIG device %d" % (label, i), e)
            key = (self._call(label, pynvml.nvmlDeviceGetGpuInstanceId, mig),
                   self._call(label, pynvml.nvmlDeviceGetComputeInstanceId, mig))
            devices[key] = {
                "uuid": _text(self._call("%s: reading a MIG device UUID" % label, pynvml.nvmlDeviceGetUUID, mig)),
                "processes": self._processes(mig, label),
            }
        return devices

    def gpu_processes(self, index: int) -> list[dict[str, Any]]:
        """Processes on the whole GPU (in MIG mode: all of them, with their GI/CI ids)."""
        return self._processes(self.handle(index), self.gpu(index)["label"])

    def _processes(self, handle, label):
        seen = {}
        for reader in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                       pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = reader(handle)
            except pynvml.NVMLError as e:
                if is_error(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    continue
                raise nvml_failure("%s: listing processes" % label, e)
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                seen[p.pid] = {
                    "pid": p.pid,
                    "used_memory_mib": used // (1024 * 1024) if used else None,
                }
        return [seen[pid] for pid in sorted(seen)]

    def layout(self, index: int, profiles: Sequence[Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The GPU's GPU instances, each with its compute instances, MIG UUIDs and processes."""
        gpu = self.gpu(index)
        label = gpu["label"]
        profiles = profiles if profiles is not None else self.gi_profiles(index)
        by_id = dict((p["id"], p) for p in profiles)
        devices = self.mig_devices(index)
        result = []
        for gi_handle, gi in self.gpu_instance_handles(index, profiles):
            profile = by_id.get(gi.profileId, {"name": "unknown-%d" % gi.profileId, "sm_slices": 0})
            cis = []
            for _ci_handle, ci, ci_profile in self.compute_instance_handles(gi_handle, label):
                device = devices.get((gi.id, ci.id), {"uuid": None, "processes": []})
                cis.append({
                    "id": ci.id,
                    "profile": mig_device_name(ci_profile.sliceCount, profile["sm_slices"], profile["name"]),
                    "profile_id": ci.profileId,
                    "sm_slices": ci_profile.sliceCount,
                    "placement": {"start": ci.placement.start, "size": ci.placement.size},
                    "mig_device_uuid": device["uuid"],
                    "processes": device["processes"],
                })
            result.append({
                "id": gi.id,
                "profile": profile["name"],
                "profile_id": gi.profileId,
                "placement": {"start": gi.placement.start, "size": gi.placement.size},
                "compute_instances": cis,
            })
        return result

    def _gi_handle(self, index, gi_id):
        label = self.gpu(index)["label"]
        return self._call("%s: opening GPU instance %d" % (label, gi_id),
                          pynvml.nvmlDeviceGetGpuInstanceById, self.handle(index), gi_id)

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        """Create a GPU instance at an explicit placement; returns its id."""
        label = self.gpu(index)["label"]
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = size
        gi = self._call("%s: creating GPU instance (profile %d at %d:%d)" % (label, profile_id, start, size),
                        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                        self.handle(index), profile_id, pynvml.byref(placement))
        return self._call(label, pynvml.nvmlGpuInstanceGetInfo, gi).id

    def create_compute_instance(self, index: int, gi_id: int, ci_profile_constant: int,
                                start: int | None = None) -> int:
        """Create a compute instance in a GPU instance; returns its id."""
        label = "%s GPU instance %d" % (self.gpu(index)["label"], gi_id)
        gi = self._gi_handle(index, gi_id)
        ci_info = self._call("%s: reading compute profile" % label,
                             pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, ci_profile_constant, _ENGINE_SHARED)
        what = "%s: creating compute instance (profile %d)" % (label, ci_info.id)
        if start is None:
            ci = self._call(what, pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
        else:
            placement = pynvml.c_nvmlComputeInstancePlacement_t()
            placement.start = start
            placement.size = ci_info.sliceCount
            ci = self._call(what, pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement,
                            gi, ci_info.id, pynvml.byref(placement))
        return self._call(label, pynvml.nvmlComputeInstanceGetInfo, ci).id

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        label = "%s GPU instance %d" % (self.gpu(index)["label"], gi_id)
        gi = self._gi_handle(index, gi_id)
        ci = self._call("%s: opening compute instance %d" % (label, ci_id),
                        pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
        self._call("%s: destroying compute instance %d" % (label, ci_id), pynvml.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        """Destroy a GPU instance together with its compute instances (CIs first, as the driver needs).

        When a destroy fails after some of its compute instances are gone, they are created
        again at their profiles and placements before the NvmlError is raised, so the GPU
        instance is not left without its MIG devices; the error says how that went.
        """
        label = self.gpu(index)["label"]
        gi = self._gi_handle(index, gi_id)
        destroyed = []    # (profile id, slice count, start) of each compute instance gone
        try:
            for ci, info, profile in self.compute_instance_handles(gi, label):
                self._call("%s: destroying compute instance %d of GPU instance %d" % (label, info.id, gi_id),
                           pynvml.nvmlComputeInstanceDestroy, ci)
                destroyed.append((profile.id, profile.sliceCount, info.placement.start))
            self._call("%s: destroying GPU instance %d" % (label, gi_id), pynvml.nvmlGpuInstanceDestroy, gi)
        except NvmlError as e:
            if not destroyed:
                raise
            text, recreated = self._put_back_compute_instances(index, gi_id, destroyed)
            raise NvmlError("%s; %s" % (e, text), e.code, e.name, recreated=recreated) from e

    def _put_back_compute_instances(self, index, gi_id, destroyed):
        """Create the destroyed compute instances of a GPU instance again: (what happened, for a
        person; the MIG device UUIDs of the compute instances created again, all of them new)."""
        label = self.gpu(index)["label"]
        where = self.describe_gpu_instance(index, gi_id)
        kept = set(self.gpu_instance_uuids(index, gi_id))   # what the failure left alone
        made = []
        try:
            gi = self._gi_handle(index, gi_id)
            for profile_id, size, start in destroyed:
                placement = pynvml.c_nvmlComputeInstancePlacement_t()
                placement.start = start
                placement.size = size
                self._call("creating compute instance (profile %d at %d:%d) again" % (profile_id, start, size),
                           pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, profile_id,
                           pynvml.byref(placement))
                made.append(start)
        except NvmlError as e:
            uuids = [u for u in self.gpu_instance_uuids(index, gi_id) if u not in kept]
            return ("its %d compute instance(s) had been destroyed first, and putting them back failed (%s): "
                    "%s of %s is left with %d of its %d compute instance(s)%s until the "
                    "next run, which destroys it or, where the layout keeps it, creates its compute instances"
                    % (len(destroyed), e, where, label, len(made), len(destroyed),
                       " (new MIG device UUIDs %s)" % ", ".join(uuids) if uuids else ""), uuids)
        uuids = [u for u in self.gpu_instance_uuids(index, gi_id) if u not in kept]
        return ("its %d compute instance(s) had been destroyed first and were created again at the same profiles "
                "and placements (with new MIG device UUIDs%s), so %s is whole"
                % (len(destroyed), " " + ", ".join(uuids) if uuids else "", where), uuids)

    def gpu_instance_uuids(self, index: int, gi_id: int) -> list[str]:
        """The MIG device UUIDs of one GPU instance, by compute instance ID ([] when NVML does
        not tell)."""
        try:
            devices = self.mig_devices(index)
        except NvmlError:
            return []
        return [devices[key]["uuid"] for key in sorted(devices)
                if key[0] == gi_id and devices[key]["uuid"]]

    def describe_gpu_instance(self, index: int, gi_id: int) -> str:
        """'GPU instance 3 (3g.40gb, placement 4:4)' as far as NVML still tells."""
        try:
            info = self._call("reading GPU instance %d" % gi_id, pynvml.nvmlGpuInstanceGetInfo,
                              self._gi_handle(index, gi_id))
            names = dict((p["id"], p["name"]) for p in self.gi_profiles(index))
        except NvmlError:
            return "GPU instance %d" % gi_id
        return "GPU instance %d (%s, placement %d:%d)" % (
            gi_id, names.get(info.profileId, "profile %d" % info.profileId), info.placement.start,
            info.placement.size)

    # -- whole picture -------------------------------------------------------
    def describe(self, index: int, with_layout: bool = True) -> dict[str, Any]:
        """Everything known about one GPU as plain data (what mig_facts reports)."""
        info = dict(self.gpu(index))
        info.pop("memory_total_bytes", None)
        mode = self.mig_mode(index)
        info["mig_capable"] = mode is not None
        info["mig_mode"] = None if mode is None else {"current": mode_name(mode[0]), "pending": mode_name(mode[1])}
        info["mig_enabled"] = bool(mode and mode[0] == 1)
        info["gpu_instances"] = []
        info["supported_profiles"] = []
        if mode is None:
            info["processes"] = self.gpu_processes(index)
            return info
        profiles = self._safe_profiles(index)
        info["supported_profiles"] = profiles
        if with_layout and mode[0] == 1:
            info["gpu_instances"] = self.layout(index, profiles)
        info["processes"] = self.gpu_processes(index)
        return info

    def _safe_profiles(self, index):
        try:
            return self.gi_profiles(index)
        except NvmlError as e:
            if is_error(e, "NVML_ERROR_NOT_SUPPORTED"):
                return []  # older drivers list profiles only while MIG is enabled
            raise


# -- programs the modules run ----------------------------------------------------

# What only a shell gives meaning to; the modules run programs without a shell, so such a
# value is a mistake (or an attempt to run something else) and is refused.
_SHELL_SYNTAX = (";", "|", "&", "$", "`", "<", ">", "\n", "\r")
# Where the host's nvidia-smi may be besides PATH (as AnsibleModule.get_bin_path's opt_dirs).
SBIN_DIRS = ("/usr/sbin", "/sbin")


def check_program(value: str | None, option: str) -> str:
    """``value`` when it names one program (a name to look up in PATH, or an absolute path);
    RefusedError naming ``option`` otherwise: no arguments, no shell syntax, no relative path."""
    usage = ("%s takes a single program path (a name looked up in PATH, or an absolute path), run without a "
             "shell" % option)
    if value is None or not value.strip():
        raise RefusedError("%s is empty; %s" % (option, usage))
    if _shell_syntax(value):
        raise RefusedError("%s: %r has shell syntax (%s); %s" % (option, value, _shell_syntax(value), usage))
    if value != value.strip() or len(value.split()) > 1:
        raise RefusedError("%s: %r has spaces or arguments; %s" % (option, value, usage))
    if "/" in value and not os.path.isabs(value):
        raise RefusedError("%s: %r is a relative path; %s" % (option, value, usage))
    return value


def find_program(value: str, option: str, directories: Sequence[str] = SBIN_DIRS, absolute: bool = False) -> str:
    """The absolute path of the executable ``value`` names (check_program's rules), looked up in
    PATH and then ``directories``; RefusedError when there is none or it cannot be executed
    (or, with ``absolute``, when ``value`` is a bare name)."""
    check_program(value, option)
    if absolute and not os.path.isabs(value):
        raise RefusedError("%s: %r is not an absolute path; %s takes the absolute path of a program"
                           % (option, value, option))
    if os.path.isabs(value):
        if not os.path.isfile(value) or not os.access(value, os.X_OK):
            raise RefusedError("%s: %s is not an executable file" % (option, value))
        return value
    search = os.pathsep.join([os.environ.get("PATH", os.defpath)] + list(directories))
    found = shutil.which(value, path=search)
    if found is None:
        raise RefusedError("%s: no executable %s in PATH or %s" % (option, value, ", ".join(directories)))
    return os.path.abspath(found)


def check_command_line(value: str, option: str) -> str:
    """``value`` when it is a program with arguments that runs without a shell (split as shlex does);
    RefusedError for shell syntax, which would reach the program as literal arguments."""
    if _shell_syntax(value):
        raise RefusedError("%s: %r has shell syntax (%s); it takes a program and its arguments, run without a "
                           "shell" % (option, value, _shell_syntax(value)))
    return value


def _shell_syntax(value):
    """The shell characters in ``value``, as repr()s separated by spaces ('' when none)."""
    return " ".join(repr(c) for c in _SHELL_SYNTAX if c in value)


# How long a program the modules run may take, by default: a GPU reset (nvidia-smi -r,
# mig_mode's reset_timeout), and the other programs (nvidia-ctk, systemctl), which have no option.
RESET_TIMEOUT = 120.0
PROGRAM_TIMEOUT = 120.0
# How long a program killed at its timeout may take to end (one stuck in the driver may never).
_KILL_GRACE = 5.0


class ProgramTimedOut(TimeoutError):
    """A program did not finish within its timeout and was killed (a TimeoutError, so an
    OSError: it did not run to its end).

    ``ended`` says whether it ended when killed; a process stuck in the driver (a GPU that does
    not answer) may not, and is left behind, named by ``pid``."""

    def __init__(self, argv: Sequence[str], timeout: float, pid: int, ended: bool) -> None:
        self.argv, self.timeout, self.pid, self.ended = list(argv), timeout, pid, ended
        what = ("was stopped (SIGKILL)" if ended
                else "did not end when killed (PID %d is left)" % pid)
        super(ProgramTimedOut, self).__init__("%s did not finish within %g s and %s"
                                              % (" ".join(argv), timeout, what))

    def __str__(self) -> str:
        return self.args[0]


def run_program(argv: Sequence[str], env: Mapping[str, str] | None = None,
                timeout: float = PROGRAM_TIMEOUT) -> tuple[int, str, str]:
    """Run ``argv`` (no shell; ``env`` added to this process's environment) for at most
    ``timeout`` seconds: (exit status, stdout, stderr). OSError when it cannot start;
    ProgramTimedOut, after killing it and its process group, when it runs longer. stdin is
    /dev/null, so a program that asks for input waits for nothing."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, **env) if env else None,
                            start_new_session=True, universal_newlines=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=_KILL_GRACE)
        except subprocess.TimeoutExpired:
            raise ProgramTimedOut(argv, timeout, proc.pid, False) from None
        raise ProgramTimedOut(argv, timeout, proc.pid, True) from None
    return proc.returncode, out, err


def timed_run(timeout: float) -> Callable[..., tuple[int, str, str]]:
    """``run(argv, env=None)`` for the engine (reset_gpus, _cdi.refresh): run_program with
    ``timeout``."""
    def run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        return run_program(argv, env, timeout)
    return run


# -- GPU reset ---------------------------------------------------------------

def classify_reset_failure(text: str) -> str:
    """Map nvidia-smi's reset refusal to a reason: 'in_use', 'not_supported', 'primary' or 'other'."""
    lowered = text.lower()
    if "in use" in lowered or "being used" in lowered or "processes" in lowered:
        return "in_use"
    if "not supported" in lowered or "passthrough" in lowered:
        return "not_supported"
    if "primary" in lowered:
        return "primary"
    return "other"


RESET_HINTS = {
    "in_use": ("stop the clients that hold the GPU (processes, nvidia-persistenced, nvidia-dcgm, "
               "dcgm-exporter, nvsm, fabric manager) and unload nvidia_drm, or reboot"),
    "not_supported": "this host cannot reset the GPU (typically a VM with passthrough): a reboot is needed",
    "primary": "the GPU drives the display: a reboot is needed",
    "cannot_run": "nvidia-smi could not run (check nvidia_smi and the driver root); a reboot applies the mode too",
    "timed_out": ("nvidia-smi -r did not finish within reset_timeout and was stopped (a GPU "
                  "that does not answer, or a reset that needs longer): reboot the node; the "
                  "next run with reset=true tries the reset again"),
    "not_tried": ("not tried, because the reset of another GPU timed out first: reboot the "
                  "node, or run again with reset=true"),
    "other": "retry, or reboot the node",
}


def reset_gpus(bus_ids: Iterable[str], run_command: Callable[..., tuple[int, str, str]],
               nvidia_smi: tuple[str, Mapping[str, str] | None] = ("nvidia-smi", None)
               ) -> dict[str, tuple[bool, str | None, str]]:
    """Reset the given GPUs with ``nvidia-smi -r -i``; the mechanism that exists in the field.

    ``run_command(argv, env) -> (rc, stdout, stderr)`` (timed_run), raising OSError when the
    program cannot run and TimeoutError (ProgramTimedOut) when it runs past its timeout;
    ``nvidia_smi`` is (executable, extra environment), see Driver.smi_command. Returns
    {bus_id: (ok, reason, message)} where reason is None on success, else one of
    classify_reset_failure()'s values, "cannot_run" or "timed_out". After a reset that timed
    out the GPUs after it are not tried ("not_tried"): a stuck GPU must not cost each of them
    the whole timeout too.
    """
    executable, env = nvidia_smi
    bus_ids = list(bus_ids)
    results = {}
    for position, bus_id in enumerate(bus_ids):
        try:
            rc, out, err = run_command([executable, "-r", "-i", bus_id], env or None)
        except TimeoutError as exc:
            results[bus_id] = (False, "timed_out", str(exc))
            for later in bus_ids[position + 1:]:
                results[later] = (False, "not_tried",
                                  "not tried: the reset of %s timed out first" % bus_id)
            break
        except OSError as exc:
            results[bus_id] = (False, "cannot_run", "%s could not run: %s" % (executable, exc.strerror or exc))
            continue
        text = ("%s\n%s" % (out or "", err or "")).strip()
        if rc == 0 and "successfully reset" in text.lower():
            results[bus_id] = (True, None, text)
        else:
            results[bus_id] = (False, classify_reset_failure(text), text or "nvidia-smi exited with %s" % rc)
    return results


# -- processes that stand in the way ----------------------------------------

def busy_devices(gpu_instances: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """[(gi, ci)] of the given layout whose MIG devices have processes."""
    return [(gi, ci) for gi in gpu_instances for ci in gi["compute_instances"] if ci["processes"]]


def describe_busy(label: str, busy: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str:
    """'GPU 0 (...): GPU instance 1 (3g.20gb @0:4) compute instance 0, MIG-..., PIDs 41, 42'."""
    parts = []
    for gi, ci in busy:
        parts.append("GPU instance %d (%s @%d:%d) compute instance %d (%s), PIDs %s" % (
            gi["id"], gi["profile"], gi["placement"]["start"], gi["placement"]["size"], ci["id"],
            ci["mig_device_uuid"] or "no UUID", ", ".join(str(p["pid"]) for p in ci["processes"])))
    return "%s: %s" % (label, "; ".join(parts))


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
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


def terminate_processes(pids: Iterable[int], timeout: float = 10.0, poll: float = 0.1) -> list[int]:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the PIDs still alive at the end."""
    import signal
    import time

    alive = pid_alive
    pending = [p for p in pids if alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pending:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        while pending and time.time() < deadline:
            pending = [p for p in pending if alive(p)]
            if pending:
                time.sleep(poll)
        if not pending:
            break
    return pending
