"""mig_device_plugin's variables through the real helm binary and the stand-in chart: rendered
into the release's values (sharing configs into config.map with its default entry, the allocation
policy into each config, nvidiaDriverRoot from gpuops_mig_driver_root), checked before helm runs,
the free-form values merged last."""

import os

import pytest
import yaml

from test_roles import BIN, CHART, Fleet, output
from tests.support.kubeapi import seed

pytestmark = pytest.mark.playbook
NS = "nvidia-device-plugin"


def run(tmp_path, cluster, cluster_env, variables, name="plugin.yml"):
    playbook = tmp_path / name
    role = {"role": "gpuops.mig.mig_device_plugin", "vars": dict({
        "mig_device_plugin_chart_ref": CHART, "mig_device_plugin_chart_repo_url": "",
        "mig_device_plugin_helm_binary": os.path.join(BIN, "helm")}, **variables)}
    playbook.write_text(yaml.safe_dump([{"name": "Device plugin", "hosts": "localhost", "gather_facts": False,
                                         "roles": [role]}]))
    return Fleet(tmp_path, cluster, cluster_env).run(str(playbook))


def test_typed_settings_reach_the_chart(cluster, cluster_env, tmp_path):
    cluster.seed(seed.node("gpu-1", {"nvidia.com/gpu.present": "true"}))
    proc = run(tmp_path, cluster, cluster_env, {
        "gpuops_mig_driver_root": "/run/nvidia/driver",
        "mig_device_plugin_shared_devices_allocation_policy": "packed",
        "mig_device_plugin_sharing_configs": {"ts4": {"1g.10gb": {"replicas": 4, "rename": True}}},
        "mig_device_plugin_values": {"failOnInitError": True,
                                     "deviceListStrategy": "envvar,cdi-cri"}})
    assert proc.recap["localhost"]["failed"] == 0, output(proc)
    env = plugin_env(cluster)
    assert env["FAIL_ON_INIT_ERROR"] == "true"                 # free-form values
    assert env["DEVICE_LIST_STRATEGY"] == "envvar,cdi-cri"
    assert env["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["DEFAULT_CONFIG"] == "default"
    configs = cluster.get("ConfigMap", "nvidia-device-plugin-configs", NS)["data"]
    assert sorted(configs) == ["default", "ts4"]
    assert "sharing" not in yaml.safe_load(configs["default"])
    ts4 = yaml.safe_load(configs["ts4"])
    assert ts4["flags"]["plugin"] == {"sharedDevicesAllocationPolicy": "packed"}
    assert ts4["sharing"]["timeSlicing"] == {
        "renameByDefault": True, "failRequestsGreaterThanOne": False,
        "resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]}


def test_the_default_config_and_a_driver_root_in_the_values(cluster, cluster_env, tmp_path):
    cluster.seed(seed.node("gpu-1", {"nvidia.com/gpu.present": "true"}))
    ts4 = {"1g.10gb": {"replicas": 4}}
    proc = run(tmp_path, cluster, cluster_env, {
        "gpuops_mig_driver_root": "/run/nvidia/driver",
        "mig_device_plugin_sharing_configs": {"ts4": ts4, "default": ts4},
        "mig_device_plugin_values": {"nvidiaDriverRoot": "/opt/nvidia/driver"}})
    assert proc.recap["localhost"]["failed"] == 0, output(proc)
    env = plugin_env(cluster)
    assert env["NVIDIA_DRIVER_ROOT"] == "/opt/nvidia/driver"   # the values win
    assert env["DEFAULT_CONFIG"] == "default"
    configs = cluster.get("ConfigMap", "nvidia-device-plugin-configs", NS)["data"]
    assert sorted(configs) == ["default", "ts4"] and configs["default"] == configs["ts4"]
    assert yaml.safe_load(configs["default"])["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]


def plugin_env(cluster):
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin", NS)
    return dict((e["name"], e.get("value"))
                for e in plugin["spec"]["template"]["spec"]["containers"][0]["env"])


def test_bad_settings_fail_before_helm(cluster, cluster_env, tmp_path):
    proc = run(tmp_path, cluster, cluster_env, {
        "mig_device_plugin_sharing_configs": {"mps": {"1g.10gb": {"strategy": "mps", "replicas": 2}}}})
    assert proc.recap["localhost"]["failed"] == 1, output(proc)
    assert "config mps, profile 1g.10gb: MPS cannot share MIG devices" in proc.stdout, output(proc)
    assert "TASK [gpuops.mig.mig_device_plugin : Deploy the NVIDIA device plugin" not in proc.stdout
    assert cluster.find("DaemonSet", "nvidia-device-plugin", NS) is None
