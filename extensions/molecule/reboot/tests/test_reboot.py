# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the reboot path: one VM converged through a real reboot, the other failed cleanly."""

import os

from bedview import BED, expected_devices, gpu_state, mig_devices

testinfra_hosts = ["ansible://a100-vm", "ansible://a30-0"]


def test_rebooted_exactly_once(host, name):
    state = gpu_state(name)
    assert state["boot_count"] == 1
    # The host really went down: a new boot id, and the SSH session is a new one.
    assert host.file("/proc/sys/kernel/random/boot_id").content_string.strip() == state["boot_id"]


def test_boot_time_restore_ran_at_boot(name):
    # simulator/bin/systemctl (the hosts' init) logs every unit it ran at boot.
    with open(os.path.join(BED, "hosts", name, "state.json.boot.log"), encoding="utf-8") as handle:
        log = handle.read()
    expected = "exit 0" if name == "a100-vm" else "exit 3"  # 3: the mode is still pending
    assert "gpuops-mig-restore.service: %s" % expected in log, log


def test_passthrough_vm_converged(cluster):
    for gpu in gpu_state("a100-vm")["gpus"]:
        assert gpu["mig"] == {"current": 1, "pending": 1}
        assert mig_devices(gpu) == expected_devices("fleet-a", gpu["model"])
    node = cluster.node("a100-vm")
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "success"
    assert not node.spec.unschedulable


def test_mode_still_wrong_after_reboot_ends_failed(cluster):
    state = gpu_state("a30-0")
    assert [g["mig"] for g in state["gpus"]] == [{"current": 0, "pending": 1}]
    assert not any(g["gpu_instances"] for g in state["gpus"])
    node = cluster.node("a30-0")
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "failed"
    assert node.spec.unschedulable  # stays cordoned for a person to look at
    assert state["host"]["clients"] == ["nvidia-dcgm"]  # the GPU clients were started again
