# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The driver's MIG capabilities in /proc, and a fresh /dev at boot, under a simulated host's root.

With a host root set (create_state(root=...), set_host(root=...), mig-sim host --root), every change of
the state rewrites what the NVIDIA driver shows under <root>/proc: the nvidia-caps character major in
proc/devices, and proc/driver/nvidia/capabilities with mig/config, mig/monitor and, for each GPU with MIG
on, gpu<N>/mig/gi<G>/access and gpu<N>/mig/gi<G>/ci<C>/access ("DeviceFileMinor: ..." files). Minors
follow the driver's fixed table (/proc/driver/nvidia-caps/mig-minors): config 1, monitor 2, then 135 per
GPU, 9 per GPU instance (its access, then CIs 0..7). The device nodes under <root>/dev/nvidia-caps are
what userspace (nvidia-modprobe, nvidia-smi, gpuops.mig) makes of them; the driver never writes them,
so they go stale after a change. A reboot empties <root>/dev/nvidia-caps (devtmpfs starts empty).
"""

import os
import shutil

CAPS_MAJOR = 237          # any free dynamic major; the host setting caps_major changes it
CONFIG_MINOR, MONITOR_MINOR = 1, 2
MINORS_PER_GPU, MINORS_PER_GI = 135, 9
MODE_CONFIG, MODE_READABLE = 0o400, 0o444
CAPABILITIES = os.path.join("proc", "driver", "nvidia", "capabilities")
DEV_CAPS = os.path.join("dev", "nvidia-caps")


def gi_minor(gpu_minor, gi_id):
    return CONFIG_MINOR + MONITOR_MINOR + MINORS_PER_GPU * gpu_minor + MINORS_PER_GI * gi_id


def ci_minor(gpu_minor, gi_id, ci_id):
    return gi_minor(gpu_minor, gi_id) + 1 + ci_id


def capability_files(state):
    """{path under proc/driver/nvidia/capabilities: (minor, mode)} of what the driver holds now."""
    mig_capable = [gpu for gpu in state["gpus"] if gpu.get("mig") is not None]
    if not mig_capable:
        return {}
    files = {"mig/config": (CONFIG_MINOR, MODE_CONFIG), "mig/monitor": (MONITOR_MINOR, MODE_READABLE)}
    for gpu in mig_capable:
        if gpu["mig"]["current"] != 1:
            continue
        for gi in gpu.get("gpu_instances") or []:
            base = "gpu%d/mig/gi%d" % (gpu["index"], gi["id"])
            files[base + "/access"] = (gi_minor(gpu["index"], gi["id"]), MODE_READABLE)
            for ci in gi.get("compute_instances") or []:
                minor = ci_minor(gpu["index"], gi["id"], ci["id"])
                files["%s/ci%d/access" % (base, ci["id"])] = (minor, MODE_READABLE)
    return files


def write_proc(state):
    """Rewrite <root>/proc as the driver shows it (nothing without a host root)."""
    root = state["host"].get("root")
    if not root:
        return
    proc = os.path.join(root, "proc")
    os.makedirs(proc, exist_ok=True)
    with open(os.path.join(proc, "devices.tmp"), "w") as handle:
        handle.write("Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia\n%3d nvidia-caps\n510 nvidia-uvm\n\n"
                     "Block devices:\n  7 loop\n  8 sd\n" % state["host"].get("caps_major", CAPS_MAJOR))
    os.replace(os.path.join(proc, "devices.tmp"), os.path.join(proc, "devices"))
    top = os.path.join(root, CAPABILITIES)
    shutil.rmtree(top, ignore_errors=True)
    for name, (minor, mode) in sorted(capability_files(state).items()):
        path = os.path.join(top, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n" % (minor, mode))


def fresh_dev(state):
    """At boot /dev is a new devtmpfs: no /dev/nvidia-caps until something creates it."""
    root = state["host"].get("root")
    if root:
        shutil.rmtree(os.path.join(root, DEV_CAPS), ignore_errors=True)
