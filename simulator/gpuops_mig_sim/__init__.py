# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Simulated NVIDIA GPU hosts beneath pynvml, for testing gpuops.mig without a GPU.

Not part of what runs on production hosts: no module of the collection carries
it. The collection's NVML adapter imports this package only when the
environment variable GPUOPS_MIG_SIMULATE names a host's state file, so a test
host needs it on its Python path (docs/simulator.md, "Pointing a host at the
simulator"). stdlib and ctypes only; pynvml is needed just to install the
simulated library.

    state      the host's JSON state file, its store and read helpers
    library    the simulated libnvidia-ml (the C symbols pynvml calls)
    host       host operations: create, processes, quirks, faults, reset, reboot, driver container
    models     the GPU model catalog
    cli, smi   the mig-sim command line and the simulated nvidia-smi
"""

from .host import (
    DRIVER_LIBRARY_DIR,
    DRIVER_SMI_DIR,
    add_fault,
    add_process,
    boot_id,
    clear_faults,
    clear_processes,
    create_state,
    format_gpu_list,
    format_models,
    format_state,
    parse_error,
    parse_gpus_spec,
    reboot,
    reset_exit_code,
    reset_gpus,
    set_host,
    start_driver_container,
)
from .library import SONAME, SimulatedNvml, install, open_library, symbol_names
from .state import (
    AUTO_PLACEMENTS,
    DEFAULT_CUDA_DRIVER_VERSION,
    DEFAULT_DRIVER_VERSION,
    DEFAULT_SEED,
    ERRORS,
    MIG_DISABLE,
    MIG_ENABLE,
    PROCESS_TYPES,
    STATE_ENV,
    SimulatorError,
    UnknownGpuError,
    load_state,
)

__all__ = [
    "add_fault",
    "add_process",
    "AUTO_PLACEMENTS",
    "boot_id",
    "clear_faults",
    "clear_processes",
    "create_state",
    "DEFAULT_CUDA_DRIVER_VERSION",
    "DEFAULT_DRIVER_VERSION",
    "DEFAULT_SEED",
    "DRIVER_LIBRARY_DIR",
    "DRIVER_SMI_DIR",
    "ERRORS",
    "format_gpu_list",
    "format_models",
    "format_state",
    "install",
    "load_state",
    "MIG_DISABLE",
    "MIG_ENABLE",
    "open_library",
    "parse_error",
    "parse_gpus_spec",
    "PROCESS_TYPES",
    "reboot",
    "reset_exit_code",
    "reset_gpus",
    "set_host",
    "SimulatedNvml",
    "SimulatorError",
    "SONAME",
    "start_driver_container",
    "STATE_ENV",
    "symbol_names",
    "UnknownGpuError",
]
