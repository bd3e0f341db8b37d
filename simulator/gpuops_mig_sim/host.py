# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Host operations on a simulated host: create it, start processes, set quirks, inject
faults, reset GPUs, reboot; and the text the CLI and the nvidia-smi shim print.
"""

import os
import re
import sys
import uuid

from . import models, procfs
from .library import normalise_function, symbol_names
from .state import (
    AUTO_PLACEMENTS, DEFAULT_CUDA_DRIVER_VERSION, DEFAULT_DRIVER_VERSION, DEFAULT_SEED, ERRORS,
    FORMAT_VERSION, MAX_GPUS, MIG_DISABLE, MIG_ENABLE, PROCESS_TYPES, SUCCESS, UUID_NAMESPACE, dump,
    gpu_processes, host_pid_alive, is_hopper_or_newer, load_state, locked, mig_device_name, mig_devices,
    mig_enabled, model_of, parse_bus_id, profile_of_gi, SimulatorError, StateStore, UnknownGpuError,
    write_file,
)

# The first eight bus ids of a DGX A100/H100; later GPUs get made-up ones.
_DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def _find_gpu(state, target):
    """A GPU by bus id (any common spelling), UUID or index; None if there is none."""
    target = str(target).strip()
    wanted_bus = parse_bus_id(target)
    for gpu in state["gpus"]:
        if wanted_bus is not None and parse_bus_id(gpu["bus_id"]) == wanted_bus:
            return gpu
        if target.lower() == gpu["uuid"].lower() or target == str(gpu["index"]):
            return gpu
    return None


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
    return str(uuid.uuid5(UUID_NAMESPACE, "%s/boot/%d" % (seed, boot_count)))


def create_state(path, gpus, driver_version=DEFAULT_DRIVER_VERSION, cuda_driver_version=DEFAULT_CUDA_DRIVER_VERSION,
                 nvml_version=None, seed=DEFAULT_SEED, mig="disabled", force=False, root=None):
    """Write a new simulated host to `path` and return its state.

    gpus: a spec string or a list of them, e.g. "8xH100-SXM5-80GB" or ["2xA100-SXM4-40GB", "1xA30-24GB"].
    mig: "enabled"/"disabled" (or a bool) for every MIG-capable GPU, current and pending alike.
    root: the host's root directory, under which the driver's /proc is kept (procfs.py).
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
            "driver_root": None,
            "root": _host_root(root),
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
            "uuid": "GPU-%s" % uuid.uuid5(UUID_NAMESPACE, "%s/gpu/%d" % (seed, index)),
            "bus_id": _bus_id(index),
            "persistence_mode": 1,
            "mig": {"current": mode, "pending": mode} if capable else None,
            "gpu_instances": [],
        })
    with locked(path):
        write_file(path, dump(state))
        procfs.write_proc(state)
    return state


def _host_root(root):
    if root is None or str(root).lower() in ("", "none"):
        return None
    if not os.path.isabs(str(root)):
        raise SimulatorError("the host root must be an absolute path, not %r" % (root,))
    return os.path.normpath(str(root))


def _edit(path):
    """A transaction on an existing state file."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SimulatorError("the simulated host state %s does not exist" % path)
    return StateStore(path).transaction()


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
        if live and not host_pid_alive(pid):
            raise SimulatorError("--live needs a running process, and PID %d is not running" % pid)
        if (gi is None) != (ci is None):
            raise SimulatorError("give both the GPU instance and the compute instance, or neither")
        if mig_enabled(target):
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
             add_clients=(), remove_clients=(), auto_placement=None, driver_root=None, root=None):
    """Change host quirks; arguments left as None stay as they are.

    root: the host's root directory, under which the driver's /proc is kept (procfs.py); "" or "none": none.

    driver_root: the root of a containerized driver (the GPU Operator's driver
    container mounts it at /run/nvidia/driver), which start_driver_container()
    lays out at once; "" or "none" puts the driver back on the host.
    """
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
        if root is not None:
            host["root"] = _host_root(root)
        if driver_root is not None:
            if str(driver_root).lower() in ("", "none"):
                host["driver_root"] = None
            elif not os.path.isabs(str(driver_root)):
                raise SimulatorError("the driver root must be an absolute path, not %r" % (driver_root,))
            else:
                host["driver_root"] = os.path.normpath(str(driver_root))
    if host.get("driver_root"):
        start_driver_container(path)


# Where a driver image keeps the library and nvidia-smi (Ubuntu-based images; RHEL-based ones use usr/lib64).
DRIVER_LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
DRIVER_SMI_DIR = "usr/bin"


def start_driver_container(path, validations_dir=None):
    """What the driver container does when it comes up: its root appears under driver_root.

    The root gets libnvidia-ml.so.1 (a link to libnvidia-ml.so.<driver version>, as a
    driver install has it) and an nvidia-smi that serves this host. With
    validations_dir, the operator validator's driver-ready file is written there
    too. A host whose driver is on the host has nothing to start.
    """
    path = os.path.abspath(path)
    state = load_state(path)
    root = state["host"].get("driver_root")
    if not root:
        raise SimulatorError("the simulated host %s has its driver on the host (no driver root)" % path)
    libdir = os.path.join(root, DRIVER_LIBRARY_DIR)
    smidir = os.path.join(root, DRIVER_SMI_DIR)
    for directory in (libdir, smidir):
        os.makedirs(directory, exist_ok=True)
    versioned = "libnvidia-ml.so.%s" % state["driver_version"]
    with open(os.path.join(libdir, versioned), "w") as handle:
        handle.write("simulated libnvidia-ml %s for the host in %s\n" % (state["driver_version"], path))
    _replace_link(versioned, os.path.join(libdir, "libnvidia-ml.so.1"))
    smi = os.path.join(smidir, "nvidia-smi")
    with open(smi + ".tmp", "w") as handle:
        handle.write("#!%s\n# nvidia-smi of the simulated driver container (gpuops_mig_sim)\n"
                     "import sys\nsys.path.insert(0, %r)\nfrom gpuops_mig_sim import smi\n"
                     "sys.exit(smi.main(sys.argv[1:]))\n"
                     % (sys.executable, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.chmod(smi + ".tmp", 0o755)
    os.replace(smi + ".tmp", smi)
    if validations_dir:
        os.makedirs(validations_dir, exist_ok=True)
        with open(os.path.join(validations_dir, "driver-ready"), "w") as handle:
            handle.write("IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=%s\nDRIVER_ROOT_CTR_PATH=/driver-root\n"
                         "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n" % root)
    return root


def _replace_link(target, link):
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)


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
    symbols = normalise_function(str(function))
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
    if gpu_processes(state, gpu) or state["host"]["clients"]:
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
            if is_hopper_or_newer(model_of(gpu)):
                gpu["mig"] = {"current": MIG_DISABLE, "pending": MIG_DISABLE}
            elif state["host"]["mode_change_survives_reboot"]:
                gpu["mig"]["current"] = gpu["mig"]["pending"]
        state["processes"] = []
        procfs.fresh_dev(state)
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
        "driver: %s" % ("container, root %s" % host["driver_root"] if host.get("driver_root") else "host"),
    ]
    for gpu in state["gpus"]:
        model = model_of(gpu)
        lines.append("GPU %d  %s  %s  %s  %s" % (gpu["index"], gpu["bus_id"], gpu["model"], model.name, gpu["uuid"]))
        if gpu["mig"] is None:
            lines.append("  MIG: not supported")
        else:
            lines.append("  MIG: current %s, pending %s" % (_mode_word(gpu["mig"]["current"]),
                                                            _mode_word(gpu["mig"]["pending"])))
        for gi in sorted(gpu["gpu_instances"], key=lambda item: item["start"]):
            profile = profile_of_gi(model, gi)
            lines.append("  GI %d  %s (profile id %d)  placement %d:%d" % (
                gi["id"], profile.name, gi["profile_id"], gi["start"], gi["size"]))
            for ci in sorted(gi["compute_instances"], key=lambda item: item["start"]):
                lines.append("    CI %d  %s (profile id %d)  placement %d:%d  %s" % (
                    ci["id"], mig_device_name(model, gi, ci), ci["profile_id"], ci["start"], ci["size"], ci["uuid"]))
        for proc in gpu_processes(state, gpu):
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
        model = model_of(gpu)
        lines.append("GPU %d: %s (UUID: %s)" % (gpu["index"], model.name, gpu["uuid"]))
        if mig_enabled(gpu):
            for index, (gi, ci) in enumerate(mig_devices(gpu)):
                lines.append("  MIG %-11s Device %2d: (UUID: %s)" % (mig_device_name(model, gi, ci), index, ci["uuid"]))
    return "\n".join(lines)


def format_models():
    """The catalog, one model per line (mig-sim models)."""
    key_width = max(len(m.key) for m in models.MODELS.values())
    name_width = max(len(m.name) for m in models.MODELS.values())
    lines = ["%-*s %-*s %-10s %10s  %s" % (key_width, "KEY", name_width, "NAME", "PCI ID", "MEMORY", "MIG")]
    for model in models.MODELS.values():
        mig = "%d slices" % model.sm_slices if models.is_mig_capable(model) else "no"
        lines.append("%-*s %-*s 0x%08X %6d MiB  %s" % (
            key_width, model.key, name_width, model.name, model.pci_device_id, model.memory_mib, mig))
    return "\n".join(lines)
