# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The one place that talks to NVML (through pynvml from nvidia-ml-py).

Private to the collection. Everything here is plain Python without Ansible
imports, so the boot-time restore can run it without Ansible. NVML failures
leave this file as :class:`NvmlError` whose text a person understands.

When the environment variable GPUOPS_MIG_SIMULATE names a state file, a
simulated libnvidia-ml is installed beneath pynvml; pynvml's own code still
runs. Without the variable nothing of the simulator is imported.
"""

from __future__ import annotations

import math
import os
import traceback

try:
    import pynvml
    HAS_PYNVML = True
    PYNVML_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - depends on the target host
    pynvml = None
    HAS_PYNVML = False
    PYNVML_IMPORT_ERROR = traceback.format_exc()

SIMULATE_ENV = "GPUOPS_MIG_SIMULATE"

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

_REASONS = {
    1: "NVML is not initialised",
    2: "invalid argument",
    3: "not supported",
    4: ("permission denied: managing MIG needs root, or read access to the mig/config "
        "capability (/proc/driver/nvidia/capabilities/mig/config)"),
    6: "not found",
    9: "the NVIDIA kernel driver is not loaded",
    12: "the NVML library (libnvidia-ml.so.1) was not found: is the NVIDIA driver installed?",
    13: "the installed driver does not provide this NVML function (driver too old?)",
    15: "the GPU has fallen off the bus or is otherwise inaccessible",
    16: "a GPU reset or a reboot is required",
    18: "the NVML library and the kernel driver versions do not match (reload the driver or reboot)",
    19: "in use by another client (processes, or services such as nvidia-persistenced, DCGM or nvsm)",
    23: "insufficient resources (the placement is occupied or the profile's capacity is used up)",
    29: "invalid state",
    999: "unknown error reported by the driver",
}

RESET_REQUIRED = 16
IN_USE = 19


class NvmlError(Exception):
    """An NVML failure, phrased for a person. ``code`` is the NVML return code, if any."""

    def __init__(self, message, code=None):
        super(NvmlError, self).__init__(message)
        self.code = code


class MissingLibrary(NvmlError):
    """nvidia-ml-py (import pynvml) is not installed on the host."""


class DriverNotFound(NvmlError):
    """No usable NVIDIA driver on the host (library missing or driver not loaded)."""


def nvml_reason(code):
    return _REASONS.get(code, "NVML error %s" % code)


def mode_name(value):
    return "enabled" if value == 1 else "disabled"


def mig_profile_memory_gb(profile_memory_mib, total_memory_bytes):
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


def gi_profile_name(constant, sm_slices, memory_mib, total_memory_bytes):
    memory_gb = mig_profile_memory_gb(memory_mib, total_memory_bytes)
    return "%dg.%dgb%s" % (sm_slices, memory_gb, _GI_SUFFIX.get(constant, ""))


def mig_device_name(ci_sm_slices, gi_sm_slices, gi_name):
    """MIG device name: the GI name when the CI uses the whole GI, else '<c>c.<gi name>'."""
    if ci_sm_slices == gi_sm_slices:
        return gi_name
    return "%dc.%s" % (ci_sm_slices, gi_name)


def mig_device_counts(gpu_instances):
    """The mig-parted view of a layout: MIG device name -> count."""
    counts = {}
    for gi in gpu_instances:
        for ci in gi["compute_instances"]:
            counts[ci["profile"]] = counts.get(ci["profile"], 0) + 1
    return counts


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class Nvml(object):
    """A session with NVML: ``with Nvml() as nvml: ...``.

    GPUs are addressed by index; handles are looked up again after a MIG
    mode change because the driver may hand out new ones.
    """

    def __init__(self, simulate=None):
        self.simulate = simulate if simulate is not None else os.environ.get(SIMULATE_ENV) or None
        self._handles = {}
        self._described = {}

    # -- session -------------------------------------------------------------
    def __enter__(self):
        if not HAS_PYNVML:
            raise MissingLibrary("nvidia-ml-py (import pynvml) is not installed")
        if self.simulate:
            from ansible_collections.gpuops.mig.plugins.module_utils import _nvml_sim
            _nvml_sim.install(self.simulate)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in (9, 12, 18):
                raise DriverNotFound(nvml_reason(code), code)
            raise NvmlError("NVML could not be initialised: %s" % nvml_reason(code), code)
        return self

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
            code = getattr(e, "value", None)
            raise NvmlError("%s: %s" % (what, nvml_reason(code)), code)

    # -- system --------------------------------------------------------------
    def driver_version(self):
        return _text(self._call("reading the driver version", pynvml.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self):
        v = self._call("reading the CUDA driver version", pynvml.nvmlSystemGetCudaDriverVersion)
        return "%d.%d" % (v // 1000, (v % 1000) // 10)

    def nvml_version(self):
        return _text(self._call("reading the NVML version", pynvml.nvmlSystemGetNVMLVersion))

    def gpu_count(self):
        return self._call("counting GPUs", pynvml.nvmlDeviceGetCount)

    # -- GPUs ----------------------------------------------------------------
    def handle(self, index):
        if index not in self._handles:
            self._handles[index] = self._call("opening GPU %d" % index,
                                              pynvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def gpu(self, index):
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

    def mig_mode(self, index):
        """(current, pending) as 0/1, or None when the GPU is not MIG-capable."""
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(self.handle(index))
        except pynvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code == 3:
                return None
            raise NvmlError("%s: reading the MIG mode: %s" % (self.gpu(index)["label"], nvml_reason(code)), code)
        return current, pending

    def set_mig_mode(self, index, enabled):
        """Ask the driver for a MIG mode; returns the NVML activation status code."""
        label = self.gpu(index)["label"]
        status = self._call("%s: setting MIG mode %s" % (label, mode_name(1 if enabled else 0)),
                            pynvml.nvmlDeviceSetMigMode, self.handle(index), 1 if enabled else 0)
        self.forget_handles()
        return status

    def forget_handles(self):
        self._handles.clear()

    # -- profiles ------------------------------------------------------------
    def gi_profiles(self, index):
        """GPU-instance profiles this GPU supports, read from NVML (IDs differ per model)."""
        h = self.handle(index)
        gpu = self.gpu(index)
        profiles = []
        for constant in range(_GI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, constant)
            except pynvml.NVMLError as e:
                if getattr(e, "value", None) in (2, 3, 6):
                    continue  # this profile does not exist on this GPU
                raise NvmlError("%s: reading MIG profiles: %s" % (gpu["label"], nvml_reason(e.value)), e.value)
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

    def ci_profiles(self, gi_handle):
        """Compute-instance profiles of one existing GPU instance: [(constant, info)]."""
        found = []
        for constant in range(_CI_PROFILE_COUNT):
            try:
                info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi_handle, constant, _ENGINE_SHARED)
            except pynvml.NVMLError:
                continue
            found.append((constant, info))
        return found

    def ci_placements(self, gi_handle, ci_profile_id):
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
    def gpu_instance_handles(self, index, profiles=None):
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

    def compute_instance_handles(self, gi_handle, label):
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

    def mig_devices(self, index):
        """{(gi_id, ci_id): {"uuid": ..., "processes": [...]}} for the GPU's MIG devices."""
        h = self.handle(index)
        label = self.gpu(index)["label"]
        devices = {}
        total = self._call("%s: counting MIG devices" % label, pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
        for i in range(total):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except pynvml.NVMLError as e:
                if getattr(e, "value", None) in (2, 6):
                    continue  # no MIG device at this index
                raise NvmlError("%s: reading MIG device %d: %s" % (label, i, nvml_reason(e.value)), e.value)
            key = (self._call(label, pynvml.nvmlDeviceGetGpuInstanceId, mig),
                   self._call(label, pynvml.nvmlDeviceGetComputeInstanceId, mig))
            devices[key] = {
                "uuid": _text(self._call("%s: reading a MIG device UUID" % label, pynvml.nvmlDeviceGetUUID, mig)),
                "processes": self._processes(mig, label),
            }
        return devices

    def gpu_processes(self, index):
        """Processes on the whole GPU (in MIG mode: all of them, with their GI/CI ids)."""
        return self._processes(self.handle(index), self.gpu(index)["label"])

    def _processes(self, handle, label):
        seen = {}
        for reader in (pynvml.nvmlDeviceGetComputeRunningProcesses,
                       pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                procs = reader(handle)
            except pynvml.NVMLError as e:
                if getattr(e, "value", None) in (3, 13):
                    continue
                raise NvmlError("%s: listing processes: %s" % (label, nvml_reason(e.value)), e.value)
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                seen[p.pid] = {
                    "pid": p.pid,
                    "used_memory_mib": used // (1024 * 1024) if used else None,
                }
        return [seen[pid] for pid in sorted(seen)]

    def layout(self, index, profiles=None):
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

    def create_gpu_instance(self, index, profile_id, start, size):
        """Create a GPU instance at an explicit placement; returns its id."""
        label = self.gpu(index)["label"]
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = size
        gi = self._call("%s: creating GPU instance (profile %d at %d:%d)" % (label, profile_id, start, size),
                        pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                        self.handle(index), profile_id, pynvml.byref(placement))
        return self._call(label, pynvml.nvmlGpuInstanceGetInfo, gi).id

    def create_compute_instance(self, index, gi_id, ci_profile_constant, start=None):
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

    def destroy_compute_instance(self, index, gi_id, ci_id):
        label = "%s GPU instance %d" % (self.gpu(index)["label"], gi_id)
        gi = self._gi_handle(index, gi_id)
        ci = self._call("%s: opening compute instance %d" % (label, ci_id),
                        pynvml.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
        self._call("%s: destroying compute instance %d" % (label, ci_id), pynvml.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index, gi_id):
        """Destroy a GPU instance together with its compute instances (CIs first, as the driver needs)."""
        label = self.gpu(index)["label"]
        gi = self._gi_handle(index, gi_id)
        for ci, info, _profile in self.compute_instance_handles(gi, label):
            self._call("%s: destroying compute instance %d of GPU instance %d" % (label, info.id, gi_id),
                       pynvml.nvmlComputeInstanceDestroy, ci)
        self._call("%s: destroying GPU instance %d" % (label, gi_id), pynvml.nvmlGpuInstanceDestroy, gi)

    # -- whole picture -------------------------------------------------------
    def describe(self, index, with_layout=True):
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
            if e.code == 3:
                return []  # older drivers list profiles only while MIG is enabled
            raise


# -- GPU reset ---------------------------------------------------------------

def classify_reset_failure(text):
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
    "other": "retry, or reboot the node",
}


def reset_gpus(bus_ids, run_command, nvidia_smi="nvidia-smi"):
    """Reset the given GPUs with ``nvidia-smi -r -i``; the mechanism that exists in the field.

    ``run_command(argv) -> (rc, stdout, stderr)``. Returns {bus_id: (ok, reason, message)}
    where reason is None on success, else one of classify_reset_failure()'s values.
    """
    results = {}
    for bus_id in bus_ids:
        rc, out, err = run_command([nvidia_smi, "-r", "-i", bus_id])
        text = ("%s\n%s" % (out or "", err or "")).strip()
        if rc == 0 and "successfully reset" in text.lower():
            results[bus_id] = (True, None, text)
        else:
            results[bus_id] = (False, classify_reset_failure(text), text or "nvidia-smi exited with %s" % rc)
    return results


# -- processes that stand in the way ----------------------------------------

def busy_devices(gpu_instances):
    """[(gi, ci)] of the given layout whose MIG devices have processes."""
    return [(gi, ci) for gi in gpu_instances for ci in gi["compute_instances"] if ci["processes"]]


def describe_busy(label, busy):
    """'GPU 0 (...): GPU instance 1 (3g.20gb @0:4) compute instance 0, MIG-..., PIDs 41, 42'."""
    parts = []
    for gi, ci in busy:
        parts.append("GPU instance %d (%s @%d:%d) compute instance %d (%s), PIDs %s" % (
            gi["id"], gi["profile"], gi["placement"]["start"], gi["placement"]["size"], ci["id"],
            ci["mig_device_uuid"] or "no UUID", ", ".join(str(p["pid"]) for p in ci["processes"])))
    return "%s: %s" % (label, "; ".join(parts))


def pid_alive(pid):
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


def terminate_processes(pids, timeout=10.0, poll=0.1):
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
