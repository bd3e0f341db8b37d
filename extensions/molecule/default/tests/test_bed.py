# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The test bed itself, checked from outside before any rollout: every host is its own machine."""

import subprocess

from bedview import gpu_state, inventory_hosts

GPU_NAMES = {"A100-SXM4-40GB": "NVIDIA A100-SXM4-40GB", "A100-SXM4-80GB": "NVIDIA A100-SXM4-80GB",
             "H100-SXM5-80GB": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "A30-24GB": "NVIDIA A30",
             "L40S": "NVIDIA L40S"}


def test_hostname_is_the_inventory_name(host, name):
    assert host.check_output("hostname") == name


def test_sees_its_own_simulated_gpus(host, name):
    count, model = inventory_hosts()[name]["testbed_gpus"].split("x", 1)
    listing = host.check_output("nvidia-smi -L").splitlines()
    assert [line.split(": ", 1)[1].split(" (UUID")[0] for line in listing] == [GPU_NAMES[model]] * int(count)
    assert host.check_output("echo $GPUOPS_MIG_SIMULATE") == "/run/gpuops-sim/state.json"


def test_boot_id_is_the_simulated_one(host, name):
    assert host.file("/proc/sys/kernel/random/boot_id").content_string.strip() == gpu_state(name)["boot_id"]


def test_power_commands_are_the_test_beds(host):
    # A test host must never reboot the machine it runs on.
    for command in ("shutdown", "reboot", "poweroff", "halt"):
        assert "gpuops test bed: simulated power command" in host.file("/usr/sbin/" + command).content_string


def test_system_directories_are_private(host, name):
    marker = "/etc/gpuops-testbed-probe"
    host.run_test("echo %s > %s", name, marker)
    try:
        assert host.file(marker).content_string.strip() == name
        for other in inventory_hosts():
            if other != name:
                assert not host.file("/tmp/gpuops-testbed/hosts/%s/upper/etc/gpuops-testbed-probe" % other).exists
        assert not subprocess.run(["test", "-e", marker], check=False).returncode == 0  # the controller's /etc is untouched
    finally:
        host.run_test("rm -f %s", marker)


def test_target_python_has_only_what_a_gpu_host_needs(host):
    python = "/tmp/gpuops-testbed/venv/bin/python"
    host.run_test("%s -c 'import pynvml, yaml'", python)
    assert host.run("%s -c 'import ansible'", python).rc != 0


def test_listens_on_loopback_only(host):
    addresses = host.check_output("ip -o addr show").splitlines()
    assert all(" lo " in line for line in addresses), addresses


def test_root_namespace_has_no_route_to_the_hosts():
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "gpuops" not in links


def test_cluster_has_every_host_as_a_gpu_node(cluster, name):
    node = cluster.node(name)
    assert node.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert not node.spec.unschedulable
    pods = {p.metadata.name.rsplit("-", 1)[0]: p for p in cluster.pods(node=name)}
    assert pods["dcgm-exporter"].metadata.owner_references[0].kind == "DaemonSet"
    assert pods["train-7c9d"].metadata.owner_references[0].kind == "ReplicaSet"
