# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the GPU Operator scenario, from outside: the GPUs (state files), the node labels, one device
plugin (the operator's), the boot-time restore on the taken-over hosts only, the failed node, and the
driver only under the driver container's root."""

import os

import yaml

from bedview import BED, MOLECULE_DIR, RESTORE_UNIT, expected_devices, gpu_state, mig_devices

testinfra_hosts = ["ansible://a100-0", "ansible://h100-0", "ansible://h200-0", "ansible://a30-0"]

TAKEN_OVER = ("a100-0", "h100-0")
MIG_MANAGER = "nvidia.com/gpu.deploy.mig-manager"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


def operator_devices(config_name, model_key):
    """What config `config_name` of the operator's ConfigMap (this scenario's mig-parted-config.yml) gives."""
    from gpuops_mig_sim import models
    with open(os.path.join(MOLECULE_DIR, "operator", "mig-parted-config.yml"), encoding="utf-8") as handle:
        entries = yaml.safe_load(handle)["mig-configs"][config_name]
    pci_id = models.get_model(model_key).pci_device_id
    for entry in entries:
        if pci_id in [int(f, 16) for f in entry.get("device-filter", [])]:
            return sorted(p for p, n in entry["mig-devices"].items() for dummy in range(n))
    return None


def test_gpus(name):
    state = gpu_state(name)
    for gpu in state["gpus"]:
        if name in TAKEN_OVER:
            assert mig_devices(gpu) == expected_devices("fleet-a", gpu["model"]), (name, gpu["index"])
        elif name == "a30-0":  # the batch after the failure never started: still mig-manager's op-b
            assert mig_devices(gpu) == operator_devices("op-b", gpu["model"])
        assert gpu["mig"]["current"] == gpu["mig"]["pending"] == 1


def test_node_labels(name, cluster):
    node = cluster.node(name)
    labels = node.metadata.labels
    if name in TAKEN_OVER:
        assert labels[MIG_MANAGER] == "false"
        assert labels[CONFIG] == "fleet-a" and labels[STATE] == "success"
        assert not node.spec.unschedulable
    elif name == "a30-0":
        assert labels[MIG_MANAGER] == "true"
        assert labels[CONFIG] == "op-b" and labels[STATE] == "success"
        assert not node.spec.unschedulable
    else:  # h200-0: mig-manager's run failed
        assert labels[STATE] == "failed"
        assert node.spec.unschedulable
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"


def test_mig_manager_left_the_taken_over_nodes_only(name, cluster):
    pods = [p for p in cluster.pods(node=name, namespace="gpu-operator")
            if p.metadata.labels.get("app") == "nvidia-mig-manager"]
    assert len(pods) == (0 if name in TAKEN_OVER else 1)


def test_one_device_plugin_the_operators(name, cluster):
    plugins = [p for p in cluster.pods(node=name)
               if (p.metadata.labels or {}).get("app") == "nvidia-device-plugin-daemonset"
               or (p.metadata.labels or {}).get("app.kubernetes.io/name") == "nvidia-device-plugin"]
    assert [(p.metadata.namespace, p.metadata.labels.get("app")) for p in plugins] == \
        [("gpu-operator", "nvidia-device-plugin-daemonset")]
    assert "nvidia-device-plugin" not in [ns.metadata.name for ns in cluster.core.list_namespace().items]


def test_the_operators_plugin_advertises_the_mig_devices(name, cluster):
    if name == "h200-0":
        return  # failed: whatever mig-manager left
    allocatable = cluster.node(name).status.allocatable
    counts = {}
    for gpu in gpu_state(name)["gpus"]:
        for profile in mig_devices(gpu):
            counts["nvidia.com/mig-" + profile] = counts.get("nvidia.com/mig-" + profile, 0) + 1
    assert {k: int(v) for k, v in allocatable.items() if k.startswith("nvidia.com/mig-")} == counts


def test_boot_time_restore_on_taken_over_hosts_only(host, name):
    unit = host.file("/etc/systemd/system/" + RESTORE_UNIT)
    if name not in TAKEN_OVER:
        assert not unit.exists  # mig-manager re-applies its label at boot
        return
    after = [line.split("=", 1)[1].split() for line in unit.content_string.splitlines() if line.startswith("After=")]
    assert any("kubelet.service" in units for units in after), unit.content_string
    assert host.check_output("systemctl is-enabled %s", RESTORE_UNIT) == "enabled"


def test_driver_only_under_the_driver_container_root(host, name):
    """No NVML on the host's library path: the simulated nvidia-smi fails there, the root's works.
    The modules found the root by themselves (no driver root anywhere in the rollouts' variables)."""
    root = "/run/nvidia/driver" if name == "a100-0" else "%s/hosts/%s/driver" % (BED, name)
    assert gpu_state(name)["host"]["driver_root"] == root
    assert host.run("nvidia-smi -L").rc != 0
    library = root + "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert host.file(library).exists
    listed = host.run("LD_PRELOAD=%s %s/usr/bin/nvidia-smi -L", library, root)
    assert listed.rc == 0 and "GPU 0" in listed.stdout
    ready = host.file("/run/nvidia/validations/driver-ready")
    if name == "a100-0":
        assert not ready.exists  # found at /run/nvidia/driver, the last place the modules look
    else:
        assert "NVIDIA_DRIVER_ROOT=%s" % root in ready.content_string
