# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""nvidia-smi of a simulated host: only `-r [-i ID[,ID...]]` and `-L` (see docs/simulator.md).

The host is the state file named by $GPUOPS_MIG_SIMULATE. simulator/bin/nvidia-smi
and the nvidia-smi of a simulated driver container run this.
"""

import os
import sys

import gpuops_mig_sim as sim

# nvidia-smi's documented exit codes for the cases the simulation has.
EXIT_BAD_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9


def parse(argv):
    """(action, ids) from argv; action is "reset" or "list"."""
    action, ids = None, []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-r", "--gpu-reset"):
            action = action or "reset"
        elif arg in ("-L", "--list-gpus"):
            action = action or "list"
        elif arg in ("-i", "--id") and args:
            ids.extend(part for part in args.pop(0).split(",") if part)
        elif arg.startswith("--id="):
            ids.extend(part for part in arg[len("--id="):].split(",") if part)
        else:
            return None, arg
    return action, ids


def _library_missing(state_path):
    """With a containerized driver, nvidia-smi finds libnvidia-ml.so.1 only when told where it is.

    The GPU Operator's validator runs the driver root's nvidia-smi with LD_PRELOAD
    set to the root's library; without that (or LD_LIBRARY_PATH) it cannot start.
    """
    try:
        root = sim.load_state(state_path)["host"].get("driver_root")
    except sim.SimulatorError:
        return None  # main() reports the state problem
    if not root:
        return None
    root = os.path.realpath(root).rstrip(os.sep) + os.sep
    preload = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    libdirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    candidates = preload + [os.path.join(d, sim.SONAME) for d in libdirs]
    if any(os.path.isfile(c) and os.path.realpath(c).startswith(root) for c in candidates):
        return None
    return ("nvidia-smi (simulated): cannot load %s: the driver of this host lives in the driver container's "
            "root %s; run that root's nvidia-smi with LD_PRELOAD=<root>/.../%s" % (sim.SONAME, root, sim.SONAME))


def main(argv):
    action, ids = parse(argv)
    if action is None:
        sys.stdout.write("nvidia-smi (simulated): unsupported arguments %s; only -r [-i IDS] and -L exist here\n"
                         % (" ".join(argv) or "(none)"))
        return EXIT_BAD_ARGUMENT
    state_path = os.environ.get("GPUOPS_MIG_SIMULATE")
    if not state_path:
        sys.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                         "(simulated: GPUOPS_MIG_SIMULATE is not set)\n")
        return EXIT_DRIVER_NOT_LOADED
    missing = _library_missing(state_path)
    if missing:
        sys.stdout.write(missing + "\n")
        return EXIT_DRIVER_NOT_LOADED
    try:
        if action == "list":
            sys.stdout.write(sim.format_gpu_list(sim.load_state(state_path)) + "\n")
            return 0
        results = sim.reset_gpus(state_path, ids)
    except sim.UnknownGpuError:
        sys.stdout.write("No devices were found\n")
        return EXIT_NOT_FOUND
    except sim.SimulatorError as exc:
        sys.stdout.write("nvidia-smi (simulated): %s\n" % exc)
        return EXIT_DRIVER_NOT_LOADED
    for _bus_id, _ok, message in results:
        sys.stdout.write(message + "\n")
    return sim.reset_exit_code(results)
