# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Can a host take part in a MIG rollout? Checked on the controller from one read of the host.

Inputs are plain data: the ``facts`` and ``container_toolkit`` that gpuops.mig.mig_node_info
returns, and the options of the mig_preflight role. Each problem names the host, says what is
wrong and how to fix it.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

NVML_MISSING = "nvidia-ml-py"


def nvml_missing(facts: Mapping[str, Any] | None) -> bool:
    """True when the host's Python cannot import pynvml (the only problem pip can fix)."""
    return NVML_MISSING in ((((facts or {}).get("driver") or {}).get("error")) or "")


def version_tuple(text: object) -> tuple[int, ...]:
    """'550.90.07' -> (550, 90, 7); what is not a number is left out."""
    return tuple(int(part) for part in re.findall(r"[0-9]+", str(text)))


def too_old(gpus: Iterable[Mapping[str, Any]], driver_version: str | None,
            minimums: Sequence[Mapping[str, Any]]) -> list[str]:
    """'GPU i (name), which needs X or newer' for each MIG-capable GPU whose model needs a newer driver.

    minimums: [{pattern, version}]; the first pattern that matches the GPU name (case-insensitive) applies."""
    found = []
    for gpu in gpus:
        if not gpu.get("mig_capable"):
            continue
        for entry in minimums:
            if re.search(entry["pattern"], gpu["name"], re.IGNORECASE):
                if version_tuple(driver_version) < version_tuple(entry["version"]):
                    found.append("GPU %d (%s), which needs %s or newer" % (gpu["index"], gpu["name"], entry["version"]))
                break
    return found


def problems(host: str, facts: Mapping[str, Any], toolkit: Mapping[str, Any] | None, options: Mapping[str, Any],
             python: str = "python3") -> list[str]:
    """Every reason the host cannot take part, first the ones that hide the others.

    options: require_mig_capable, min_driver_versions, container_toolkit_min_version; toolkit is
    mig_node_info's container_toolkit result (None: not checked); python: the interpreter Ansible runs there."""
    driver = facts["driver"]
    if nvml_missing(facts):
        return ["%s: nvidia-ml-py (import pynvml) is not importable by %s, the Python Ansible runs there. Install it "
                "(%s -m pip install nvidia-ml-py), or set mig_preflight_install_nvml=true." % (host, python, python)]
    if not driver["present"]:
        return ["%s: no usable NVIDIA driver (%s). Install the NVIDIA data-center driver and load it (nvidia-smi must "
                "work), or, with the GPU Operator's driver container, set gpuops_mig_driver_root to where it is "
                "mounted; then run again." % (host, driver["error"])]
    found = []
    if options.get("require_mig_capable", True) and not facts["mig_capable_count"]:
        found.append("%s: no MIG-capable GPU found (GPUs: %s). MIG needs an A100, A30, H100, H200, B200 or newer "
                     "data-center GPU; leave this host out of the MIG rollout, or set "
                     "mig_preflight_require_mig_capable=false." % (host, ", ".join(g["name"] for g in facts["gpus"])
                                                                   or "none"))
    old = too_old(facts["gpus"], driver["version"], options.get("min_driver_versions") or [])
    if old:
        found.append("%s: driver %s is too old for MIG on %s. Upgrade the NVIDIA driver, then run again."
                     % (host, driver["version"], "; ".join(old)))
    if toolkit is not None:
        minimum = str(options.get("container_toolkit_min_version") or "0")
        if toolkit["error"] is not None or toolkit["version"] is None:
            found.append("%s: the NVIDIA Container Toolkit is not installed (%s: %s). %s"
                         % (host, toolkit["command"], toolkit["error"] or "no version printed", _TOOLKIT_FIX))
        elif version_tuple(toolkit["version"]) < version_tuple(minimum):
            found.append("%s: NVIDIA Container Toolkit %s is older than %s. %s"
                         % (host, toolkit["version"], minimum, _TOOLKIT_FIX))
    return found


_TOOLKIT_FIX = ("Install or upgrade nvidia-container-toolkit (NVIDIA's apt/yum repository), or set "
                "mig_preflight_container_toolkit_command to '' for hosts that run no containers.")


def ready(host: str, facts: Mapping[str, Any], toolkit: Mapping[str, Any] | None) -> str:
    """One line: the host is ready, with its driver, GPUs and toolkit."""
    models = []
    for gpu in facts["gpus"]:
        if gpu["name"] not in models:
            models.append(gpu["name"])
    line = "%s: driver %s, %d MIG-capable GPU(s) of %d (%s)" % (
        host, facts["driver"]["version"], facts["mig_capable_count"], facts["gpu_count"], ", ".join(models))
    if toolkit is not None and toolkit["version"]:
        line += ", NVIDIA Container Toolkit %s" % toolkit["version"]
    return line + "."
