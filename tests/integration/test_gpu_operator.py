"""playbooks/site.yml on GPU Operator clusters (docs/gpu-operator.md): hosts whose NVML lives only under the
driver container's root, the emulator's ClusterPolicy, operand DaemonSets, simulated mig-manager and DRA
kubelet plugin (tests/support/kubeapi/operator.py, migmanager.py, dra.py)."""

import pytest

import gpuops_mig_sim as sim
from tests.support.kubeapi import migmanager, seed
from test_roles import CONFIG, STATE, Fleet, output

pytestmark = pytest.mark.playbook

MIG_MANAGER = "nvidia.com/gpu.deploy.mig-manager"
LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "layout-a": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                      "mig-devices": {"1g.10gb": 7}},
                     {"device-filter": ["0x20B010DE"], "devices": "all", "mig-enabled": True,
                      "mig-devices": {"1g.5gb": 7}}],
        "layout-b": [{"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True,
                      "mig-devices": {"3g.40gb": 2}},
                     {"device-filter": ["0x20B010DE"], "devices": "all", "mig-enabled": True,
                      "mig-devices": {"3g.20gb": 2}}],
    },
}
USER_CONFIG = "mig-layouts"
FAST = {"mig_node_validate_delay": "1", "mig_node_drain_retry_delay": "1", "mig_node_mig_manager_delay": "1",
        "mig_node_mig_manager_timeout": "60", "mig_node_validate_timeout": "60"}


def operator_fleet(tmp_path, kube_api, kube_env, models=("1xH100-SXM5-80GB", "1xA100-SXM4-40GB"), strategy="mixed",
                   device_plugin=True, **hostvars):
    """Hosts whose driver is the GPU Operator's driver container (NVML only under its root)."""
    fleet = Fleet(tmp_path, kube_api, kube_env)
    for i, model in enumerate(models):
        name = "gpu-%d" % i
        state = fleet.add(name, model, **hostvars)
        root = str(fleet.dir / name / "run" / "nvidia" / "driver")
        sim.set_host(state, driver_root=root)
        sim.start_driver_container(state)
        fleet.hosts[name]["gpuops_mig_driver_root"] = root
    # The layouts live in a ConfigMap of the user's: the operator rewrites default-mig-parted-config.
    kube_api.seed(*seed.gpu_operator(mig_strategy=strategy, config_name=USER_CONFIG, config=LAYOUTS,
                                     device_plugin=device_plugin))
    migmanager.wait_idle(kube_api)
    return fleet


def profiles(fleet, name):
    return sorted(gi["profile_id"] for gpu in sim.load_state(fleet.state_path(name))["gpus"]
                  for gi in gpu["gpu_instances"])


def node_labels(kube_api, name):
    return kube_api.get("Node", name)["metadata"]["labels"]


def test_drive_mig_manager_from_one_layout_to_another_then_converged(kube_api, kube_env, tmp_path):
    fleet = operator_fleet(tmp_path, kube_api, kube_env)
    for layout, h100, a100 in (("layout-a", [19] * 7, [19] * 7), ("layout-b", [9, 9], [9, 9])):
        site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name=layout))
        assert site.returncode == 0, output(site)
        assert profiles(fleet, "gpu-0") == h100 and profiles(fleet, "gpu-1") == a100, output(site)
        for name in ("gpu-0", "gpu-1"):
            labels = node_labels(kube_api, name)
            assert labels[CONFIG] == layout and labels[STATE] == "success" and labels[MIG_MANAGER] == "true"
            assert not kube_api.get("Node", name)["spec"].get("unschedulable")
        assert "applied by the GPU Operator's mig-manager" in site.stdout
        # The operator runs the device plugin: no second release, and its plugin advertises the layout.
        assert kube_api.list("DaemonSet", namespace="nvidia-device-plugin") == []
    allocatable = kube_api.get("Node", "gpu-0")["status"]["allocatable"]
    assert allocatable["nvidia.com/mig-3g.40gb"] == "2"
    # No boot-time restore where mig-manager owns the node (it re-applies the label at boot).
    assert not (fleet.dir / "gpu-0" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service").exists()

    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b"))
    assert all(again.recap[n]["changed"] == 0 and again.recap[n]["failed"] == 0 for n in ("gpu-0", "gpu-1")), \
        output(again)


def test_drive_mig_manager_recovers_the_pending_wedge_and_stops_on_a_failure(kube_api, kube_env, tmp_path):
    fleet = operator_fleet(tmp_path, kube_api, kube_env)
    kube_api.patch("Node", "gpu-0", {"metadata": {"annotations": {migmanager.WEDGE_ANNOTATION: "once"}}})
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-a", gpuops_mig_serial="1",
                                                mig_node_mig_manager_timeout="8"))
    assert site.returncode == 0, output(site)
    assert "Restart the node's mig-manager pod" in site.stdout
    assert profiles(fleet, "gpu-0") == [19] * 7
    assert node_labels(kube_api, "gpu-0")["nvidia.com/gpu.deploy.device-plugin"] == "true"

    # mig-manager fails on gpu-0: the node stays cordoned, labelled failed, and gpu-1 is not touched.
    sim.add_fault(fleet.state_path("gpu-0"), "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    before = fleet.digest("gpu-1")
    failed = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b", gpuops_mig_serial="1"))
    assert failed.recap["gpu-0"]["failed"] == 1, output(failed)
    assert "through the GPU Operator's mig-manager failed" in failed.stdout
    node = kube_api.get("Node", "gpu-0")
    assert node["metadata"]["labels"][STATE] == "failed" and node["spec"]["unschedulable"] is True
    assert fleet.digest("gpu-1") == before


def test_take_over_from_mig_manager_then_converged(kube_api, kube_env, tmp_path):
    fleet = operator_fleet(tmp_path, kube_api, kube_env, models=("1xH100-SXM5-80GB",) * 2,
                           mig_node_layouts=[{"gpus": "all", "devices": {"2g.20gb": 3}}])
    # auto refuses an inventory layout on a node mig-manager manages, before any change.
    before = fleet.digest("gpu-0")
    refused = fleet.run("playbooks/site.yml", FAST)
    assert refused.returncode != 0 and "would be fought over" in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before and node_labels(kube_api, "gpu-0")[MIG_MANAGER] == "true"

    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="takeover"))
    assert site.returncode == 0, output(site)
    for name in ("gpu-0", "gpu-1"):
        labels = node_labels(kube_api, name)
        assert labels[MIG_MANAGER] == "false" and labels[STATE] == "success" and labels[CONFIG] == "custom"
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        assert profiles(fleet, name) == [14, 14, 14]
    assert kube_api.list("Pod", namespace="gpu-operator", label_selector="app=nvidia-mig-manager") == []
    unit = (fleet.dir / "gpu-0" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service").read_text()
    assert "After=" in unit and "kubelet.service" in unit.split("After=", 1)[1].splitlines()[0]
    # From now on auto works on these nodes (mig-manager is off there), and nothing changes.
    again = fleet.run("playbooks/site.yml", FAST)
    assert all(again.recap[n]["changed"] == 0 and again.recap[n]["failed"] == 0 for n in ("gpu-0", "gpu-1")), \
        output(again)


def test_hand_a_node_back_to_mig_manager(kube_api, kube_env, tmp_path):
    fleet = operator_fleet(tmp_path, kube_api, kube_env, models=("1xH100-SXM5-80GB",))
    fleet.hosts["gpu-0"]["mig_node_layouts"] = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="takeover"))
    assert site.returncode == 0, output(site)
    # Hand back (docs/gpu-operator.md): the label names an operator config matching the GPUs, then mig-manager on.
    kube_api.patch("Node", "gpu-0", {"metadata": {"labels": {CONFIG: "layout-b", STATE: None, MIG_MANAGER: "true"}}})
    migmanager.wait_idle(kube_api)
    assert node_labels(kube_api, "gpu-0")[STATE] == "success" and profiles(fleet, "gpu-0") == [9, 9]
    del fleet.hosts["gpu-0"]["mig_node_layouts"]
    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_persist="false"))
    assert again.returncode == 0 and again.recap["gpu-0"]["changed"] == 0, output(again)
    assert "is already in place" in again.stdout


@pytest.mark.parametrize("extra, message", [
    ({"mig_node_config_name": "layout-x"},
     "ConfigMap gpu-operator/mig-layouts (key config.yaml): no config named 'layout-x'"),
    ({"mig_node_config_configmap": "nope", "mig_node_config_name": "layout-a"},
     "no ConfigMap nope in namespace gpu-operator holds the MIG config"),
    ({"mig_node_config_configmap": "no-key", "mig_node_config_name": "layout-a"},
     "ConfigMap gpu-operator/no-key has no key 'config.yaml' (it has: other)"),
    ({"mig_node_config_configmap": "broken", "mig_node_config_name": "layout-a"},
     "ConfigMap gpu-operator/broken (key config.yaml)"),
    ({"mig_node_config_name": "layout-a", "gpuops_mig_strategy": "single"},
     "mig_node_mig_strategy is 'single' but the GPU Operator's ClusterPolicy cluster-policy has mig.strategy 'mixed'"),
    ({"mig_node_config_name": "layout-a", "gpuops_mig_driver_root": "/nonexistent/driver"},
     "the driver root /nonexistent/driver holds no NVIDIA driver"),
    ({"mig_node_config_name": "layout-a", "gpuops_mig_deploy_device_plugin": "true"},
     "already runs the device plugin; two would advertise the same GPUs"),
    # Without operator detection in the preview, the device-plugin play still reads the ClusterPolicy itself.
    ({"mig_node_operator_detect": "false", "mig_node_layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}],
      "gpuops_mig_deploy_device_plugin": "true"},
     "already runs the device plugin; two would advertise the same GPUs"),
])
def test_bad_input_is_refused_before_any_change(kube_api, kube_env, tmp_path, extra, message):
    fleet = operator_fleet(tmp_path, kube_api, kube_env, models=("1xH100-SXM5-80GB",))
    kube_api.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-key", "namespace": "gpu-operator"},
                   "data": {"other": "x"}},
                  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "broken", "namespace": "gpu-operator"},
                   "data": {"config.yaml": "version: v1\nmig-configs: {layout-a: [{devices: all, mig-devices: 7}]}\n"}})
    if "gpuops_mig_driver_root" in extra:
        fleet.hosts["gpu-0"]["gpuops_mig_driver_root"] = extra.pop("gpuops_mig_driver_root")
    before = fleet.digest("gpu-0")
    site = fleet.run("playbooks/site.yml", dict(FAST, **extra))
    assert site.returncode != 0
    assert message in site.stdout, output(site)
    assert fleet.digest("gpu-0") == before
    node = kube_api.get("Node", "gpu-0")
    assert node["metadata"]["labels"][CONFIG] == "all-disabled" and not node["spec"].get("unschedulable")


def test_dra_driver_static_mig_is_validated_through_resourceslices_and_dynamic_mig_is_refused(
        kube_api, kube_env, tmp_path):
    fleet = operator_fleet(tmp_path, kube_api, kube_env, models=("1xH100-SXM5-80GB",), device_plugin=False,
                           mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}],
                           mig_node_operator_mode="takeover")
    kube_api.seed(*seed.dra_driver())
    site = fleet.run("playbooks/site.yml", FAST)
    assert site.returncode == 0, output(site)
    assert "Wait until the node's ResourceSlices publish the layout" in site.stdout
    devices = kube_api.list("ResourceSlice", field_selector="spec.nodeName=gpu-0")[0]["spec"]["devices"]
    assert sorted(d["attributes"]["profile"]["string"] for d in devices) == ["3g.40gb", "3g.40gb"]

    kube_api.seed(*seed.dra_driver(dynamic_mig=True))     # destroys the devices it did not create
    fleet.hosts["gpu-0"]["mig_node_layouts"] = [{"gpus": "all", "devices": {"1g.10gb": 7}}]
    before = fleet.digest("gpu-0")
    refused = fleet.run("playbooks/site.yml", FAST)
    assert refused.returncode != 0 and "DynamicMIG feature gate" in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before
