# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the drills: the faulted node converged on the re-run; the node that never came back is left
cordoned and marked, and really is down."""

import os
import subprocess

from bedview import BED, expected_devices, gpu_state, mig_devices

testinfra_hosts = ["ansible://h100-0", "ansible://a30-0"]


def test_rerun_converged_both_nodes(host, name, cluster):
    state = gpu_state(name)
    assert not state["faults"] or all(f["calls"] >= f["nth"] for f in state["faults"])
    for gpu in state["gpus"]:
        assert mig_devices(gpu) == expected_devices("fleet-a", gpu["model"])
    node = cluster.node(name)
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "success"
    assert not node.spec.unschedulable
    assert "gpuops.mig/cordoned" not in (node.metadata.annotations or {})
    assert host.check_output("systemctl is-active %s", "nvsm" if name == "h100-0" else "nvidia-dcgm") == "active"


def test_node_that_never_came_back_is_left_cordoned(cluster):
    node = cluster.node("a100-vm")
    assert node.spec.unschedulable
    assert node.metadata.labels["nvidia.com/mig.config.state"] in ("rebooting", "failed")


def test_node_that_never_came_back_is_down():
    assert os.path.exists(os.path.join(BED, "hosts", "a100-vm", "down"))
    probe = subprocess.run(["ip", "netns", "exec", "gpuops-a100-vm", "nc", "-z", "-w", "1", "127.0.0.1", "22"],
                           capture_output=True, check=False)
    assert probe.returncode != 0
    # It went down before booting again: its GPUs did not reboot.
    assert gpu_state("a100-vm")["boot_count"] == 0
