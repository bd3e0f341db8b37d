# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After fleet-a, its converged re-run and fleet-b around busy devices: the fleet, checked from outside."""

import hashlib
import json
import os

from bedview import (MOLECULE_DIR, RESTORE_UNIT, advertised, busy_devices, expected_devices, gpu_state, listed_devices,
                     mig_devices)

MIG_HOSTS = ("a100-0", "h100-0", "h200-0", "a30-0", "a100-vm")
MODULE_UTILS = os.path.join(MOLECULE_DIR, "..", "..", "plugins", "module_utils")
ENGINE_DIR = "/usr/local/lib/gpuops-mig/ansible_collections/gpuops/mig/plugins/module_utils"
# What the restore imports (gpuops.mig.mig_boot_restore derives it from the imports), and no simulator:
# the test hosts have it on their Python path instead.
ENGINE = ("__init__.py", "_boot_restore.py", "_bounded_yaml.py", "_cdi.py", "_errors.py",
          "_gpu_layout.py", "_gpu_selection.py", "_host_layout.py", "_host_mode.py", "_input.py",
          "_migparted.py", "_nvidia_caps.py", "_nvml.py")


def test_gpus_have_the_second_layout(name):
    for gpu in gpu_state(name)["gpus"]:
        expected = expected_devices("fleet-b", gpu["model"])
        if expected is None:
            assert gpu["mig"] is None and not gpu["gpu_instances"], gpu
        else:
            assert gpu["mig"] == {"current": 1, "pending": 1}, (name, gpu["index"])
            assert mig_devices(gpu) == expected, (name, gpu["index"])


def test_busy_devices_were_kept(name):
    state = gpu_state(name)
    for device in busy_devices(name):
        gpu = state["gpus"][device["gpu"]]
        gi = next(g for g in gpu["gpu_instances"] if g["id"] == device["gi"])
        assert gi["start"] == device["start"]
        assert [ci["uuid"] for ci in gi["compute_instances"] if ci["id"] == device["ci"]] == [device["uuid"]]
        assert any(p["pid"] == device["pid"] and p["gi"] == device["gi"] for p in state["processes"])
    assert bool(busy_devices(name)) == (name in ("a100-0", "a100-vm", "h100-0", "h200-0"))


def test_only_the_passthrough_vm_rebooted_once(name):
    # a100-vm cannot reset its GPUs, so enabling MIG took one reboot; nothing else ever rebooted.
    assert gpu_state(name)["boot_count"] == (1 if name == "a100-vm" else 0)


def test_boot_time_restore_is_installed(host, name):
    unit = host.file("/etc/systemd/system/" + RESTORE_UNIT)
    if name not in MIG_HOSTS:
        assert not unit.exists
        return
    assert unit.is_file and unit.user == "root" and unit.mode == 0o644
    assert "ExecStart=" in unit.content_string and "gpuops-mig-restore" in unit.content_string
    script = host.file("/usr/local/sbin/gpuops-mig-restore")
    assert script.is_file and script.user == "root" and script.mode == 0o755
    # The engine, unpacked from one archive: exactly the collection's files, root's, mode 0644
    # (and the bytecode cache of a host whose restore ran at boot).
    assert sorted(set(host.file(ENGINE_DIR).listdir()) - {"__pycache__"}) == list(ENGINE)
    for engine_file in ENGINE:
        installed = host.file(ENGINE_DIR + "/" + engine_file)
        assert installed.is_file and installed.user == "root" and installed.group == "root", engine_file
        assert installed.mode == 0o644, (engine_file, oct(installed.mode))
        if engine_file == "__init__.py":
            assert installed.size == 0
            continue
        with open(os.path.join(MODULE_UTILS, engine_file), "rb") as handle:
            assert installed.sha256sum == hashlib.sha256(handle.read()).hexdigest(), engine_file
    desired = json.loads(host.file("/etc/gpuops-mig/desired.json").content_string)
    assert desired["config_name"] == "fleet-b"
    assert host.check_output("systemctl is-enabled %s", RESTORE_UNIT) == "enabled"


def test_node_is_labelled_and_schedulable(cluster, name):
    node = cluster.node(name)
    labels = node.metadata.labels
    assert not node.spec.unschedulable
    assert "gpuops.mig/cordoned" not in (node.metadata.annotations or {})
    if name in MIG_HOSTS:
        assert labels["nvidia.com/mig.config"] == "fleet-b"
        assert labels["nvidia.com/mig.config.state"] == "success"


def test_device_plugin_advertises_the_layout(cluster, name):
    assert listed_devices(cluster.node(name)) == advertised(gpu_state(name))


def test_daemonset_pods_stayed(cluster, name):
    owners = [p.metadata.owner_references[0].kind for p in cluster.pods(node=name, namespace="gpu-monitoring")]
    assert owners == ["DaemonSet"]


def test_workload_pods_left_only_the_changed_nodes(cluster, name):
    pods = [p.metadata.name for p in cluster.pods(node=name, namespace="ml") if p.metadata.name.startswith("train-b-")]
    assert pods == (["train-b-h100-0"] if name == "h100-0" else [])
