# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""`nvidia-ctk cdi generate` and `nvidia-ctk cdi list` of a simulated host (simulator/bin/nvidia-ctk).

The spec (CDI 0.5.0, kind nvidia.com/gpu) lists what the host's driver holds when the command runs:
every GPU (named by index and by UUID), every MIG device (`<gpu index>:<MIG device index>` and its
MIG- UUID) and `all`. Like the real command it describes the devices of that moment, so a spec
generated before a MIG change lists the old MIG devices. The host is $GPUOPS_MIG_SIMULATE.
"""

import json
import os
import sys

import gpuops_mig_sim as sim
from gpuops_mig_sim import procfs

KIND = "nvidia.com/gpu"
CDI_VERSION = "0.5.0"
EXIT_USAGE = 2
EXIT_FAILED = 1


def devices(state):
    """[(names, device nodes)] of the host's GPUs and MIG devices, in NVML's order."""
    found = []
    for gpu in state["gpus"]:
        nodes = ["/dev/nvidia%d" % gpu["index"]]
        found.append(([str(gpu["index"]), gpu["uuid"]], nodes))
        enabled = (gpu.get("mig") or {}).get("current") == sim.MIG_ENABLE
        mig_index = 0
        for gi in sorted(gpu.get("gpu_instances") or [] if enabled else [], key=lambda g: g["id"]):
            for ci in sorted(gi.get("compute_instances") or [], key=lambda c: c["id"]):
                caps = (procfs.gi_minor(gpu["index"], gi["id"]), procfs.ci_minor(gpu["index"], gi["id"], ci["id"]))
                found.append((["%d:%d" % (gpu["index"], mig_index), ci["uuid"]],
                              nodes + ["/dev/nvidia-caps/nvidia-cap%d" % minor for minor in caps]))
                mig_index += 1
    return found


def spec(state):
    """The CDI spec as a dict."""
    entries = []
    for names, nodes in devices(state):
        entries.extend({"name": name, "containerEdits": {"deviceNodes": [{"path": node} for node in nodes]}}
                       for name in names)
    every = sorted(set(node for dummy, nodes in devices(state) for node in nodes))
    entries.append({"name": "all", "containerEdits": {"deviceNodes": [{"path": node} for node in every]}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": entries,
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                               "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]}}


def _dump(data, path):
    if path and path.endswith(".json"):
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    import yaml
    return "---\n" + yaml.safe_dump(data, default_flow_style=False, sort_keys=True)


def main(argv):
    args = list(argv)
    if args[:2] not in (["cdi", "generate"], ["cdi", "list"]):
        sys.stderr.write("nvidia-ctk (simulated): only --version, `cdi generate [--output PATH]` and `cdi list` "
                         "exist here\n")
        return EXIT_USAGE
    output = None
    rest = args[2:]
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg == "--output" and rest:
            output = rest.pop(0)
        else:
            sys.stderr.write("nvidia-ctk (simulated): unsupported argument %s\n" % arg)
            return EXIT_USAGE
    state_path = os.environ.get("GPUOPS_MIG_SIMULATE")
    if not state_path:
        sys.stderr.write("nvidia-ctk (simulated): failed to initialize NVML (GPUOPS_MIG_SIMULATE is not set)\n")
        return EXIT_FAILED
    try:
        data = spec(sim.load_state(state_path))
    except sim.SimulatorError as exc:
        sys.stderr.write("nvidia-ctk (simulated): failed to initialize NVML: %s\n" % exc)
        return EXIT_FAILED
    if args[1] == "list":
        sys.stdout.write("".join("%s=%s\n" % (KIND, d["name"]) for d in data["devices"]))
        return 0
    text = _dump(data, output)
    if not output:
        sys.stdout.write(text)
        return 0
    return _write(output, text)


def _write(output, text):
    """Write the spec where --output says; like the real command, make its directory first (mode 0755)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), 0o755, exist_ok=True)
    except OSError as exc:
        sys.stderr.write("nvidia-ctk (simulated): failed to write spec: failed to create Spec dir: %s\n" % exc)
        return EXIT_FAILED
    try:
        with open(output, "w") as handle:
            handle.write(text)
    except OSError as exc:
        sys.stderr.write("nvidia-ctk (simulated): failed to write spec: %s\n" % exc)
        return EXIT_FAILED
    return 0
