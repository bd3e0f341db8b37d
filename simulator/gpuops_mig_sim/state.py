# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The state of a simulated host: the JSON file, its store, and read helpers over it.

One JSON file holds a whole host (GPUs, MIG layout, processes, host quirks,
faults); several processes share it. Reads are cached until the file changes;
every change is a read-modify-write under flock, replaced atomically.
"""

import contextlib
import fcntl
import json
import os
import re
import tempfile
import uuid

from . import models, procfs

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

# Namespace of the UUIDs the simulator derives (GPUs, MIG devices, boot ids).
UUID_NAMESPACE = uuid.UUID("6d1b7c3e-2f0a-4c55-9e57-5a1d0c6e2b90")

PROCESS_TYPES = ("compute", "graphics", "mps")


class SimulatorError(ValueError):
    """Bad input to a simulator operation, or an unusable state file."""


class UnknownGpuError(SimulatorError):
    """No GPU on the simulated host matches a given bus id, UUID or index."""


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


def dump(state):
    # Compact on purpose: json's C encoder only runs without indent, and every change rewrites the file.
    return json.dumps(state, sort_keys=True, separators=(",", ":")) + "\n"


def write_file(path, text):
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
def locked(path):
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise SimulatorError("cannot lock the simulated host state %s: %s" % (path, exc.strerror))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # also releases the lock


class StateStore(object):
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
        with locked(self.path):
            key, text, state = _read_file(self.path)
            yield state
            new_text = dump(state)
            if new_text != text:
                write_file(self.path, new_text)
                key = _stat_key(os.stat(self.path))   # we hold the lock: nobody replaced it since
                procfs.write_proc(state)              # the driver's /proc follows its GPUs
            self._key, self._state = key, state


def load_state(path):
    """The state of a simulated host as a dict (a private copy)."""
    return _read_file(os.path.abspath(path))[2]


# ---------------------------------------------------------------------------
# Host, GPU and geometry helpers (plain functions over the state dict)
# ---------------------------------------------------------------------------

def model_of(gpu):
    try:
        return models.MODELS[gpu["model"]]
    except KeyError:
        raise SimulatorError("GPU %d has unknown model %r" % (gpu["index"], gpu["model"]))


def is_hopper_or_newer(model):
    return model.architecture >= models.ARCH_HOPPER


def host_pid_alive(pid):
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


def gpu_processes(state, gpu, gi_id=None, ci_id=None):
    found = []
    for proc in state["processes"]:
        if proc["gpu"] != gpu["index"]:
            continue
        # A "live" entry mirrors a real host process: when that process ends
        # (for example killed by mig_mode/mig_config force), the GPU forgets it.
        if proc.get("live") and not host_pid_alive(proc["pid"]):
            continue
        if gi_id is not None and proc["gi"] != gi_id:
            continue
        if ci_id is not None and proc["ci"] != ci_id:
            continue
        found.append(proc)
    return found


def profile_of_gi(model, gi):
    return models.gi_profile_by_id(model, gi["profile_id"])


def slices_of_ci_profile(profile_id):
    return models.CI_PROFILE_SLICES.get(profile_id)


def mig_devices(gpu):
    """(gi, ci) pairs in MIG device index order."""
    pairs = []
    for gi in sorted(gpu["gpu_instances"], key=lambda item: item["id"]):
        for ci in sorted(gi["compute_instances"], key=lambda item: item["id"]):
            pairs.append((gi, ci))
    return pairs


def mig_device_name(model, gi, ci):
    """"3g.20gb" when the CI spans the GI, "1c.3g.20gb" otherwise."""
    gi_name = profile_of_gi(model, gi).name
    ci_size = slices_of_ci_profile(ci["profile_id"])
    if ci_size == profile_of_gi(model, gi).sm_slices:
        return gi_name
    return "%dc.%s" % (ci_size, gi_name)


def mig_enabled(gpu):
    return gpu["mig"] is not None and gpu["mig"]["current"] == MIG_ENABLE


def parse_bus_id(text):
    """(domain, bus, device, function) of "00000000:07:00.0", "0000:07:00.0" or "07:00.0"; None if malformed."""
    match = re.match(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$", text.strip())
    if not match:
        return None
    return tuple(int(part or "0", 16) for part in match.groups())
