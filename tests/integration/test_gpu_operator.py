"""playbooks/site.yml on GPU Operator clusters (docs/gpu-operator.md), on the real test cluster as
the rollout's ServiceAccount: hosts whose NVML lives only under the driver container's root, a
ClusterPolicy, and the stand-ins of the operator, mig-manager and the DRA kubelet plugin
(tests/support/kubeapi/operator.py, migmanager.py, dra.py) hosted as controllers; the operands'
DaemonSets run their pods through kube-controller-manager and kwok."""

import json
import os
import subprocess
import sys

import pytest
import yaml

import gpuops_mig_sim as sim
from tests.support.controlplane.cluster import daemonsets_rolled_out
from tests.support.kubeapi import migmanager, seed
from test_roles import CONFIG, REPO, STATE, Fleet, output

pytestmark = pytest.mark.playbook

MIG_MANAGER = "nvidia.com/gpu.deploy.mig-manager"
DRA_PLUGIN, DCGM_DRA, DRA_VALIDATOR = ("nvidia.com/gpu.deploy." + c for c in ("dra-driver", "dcgm-dra", "dra-validator"))
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
FAST = {"mig_node_validate_delay": "1",
        "mig_node_mig_manager_timeout": "60", "mig_node_validate_timeout": "60"}


def operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB", "1xA100-SXM4-40GB"), strategy="mixed",
                   device_plugin=True, config_name=USER_CONFIG, operator_env=None, **hostvars):
    """Hosts whose driver is the GPU Operator's driver container (NVML only under its root)."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    for i, model in enumerate(models):
        name = "gpu-%d" % i
        state = fleet.add(name, model, **hostvars)
        root = str(fleet.dir / name / "run" / "nvidia" / "driver")
        sim.set_host(state, driver_root=root)
        sim.start_driver_container(state)
        fleet.hosts[name]["gpuops_mig_driver_root"] = root
    # The layouts live in a ConfigMap of the user's: the operator rewrites default-mig-parted-config.
    cluster.seed(*seed.gpu_operator(mig_strategy=strategy, config_name=config_name,
                                    config=LAYOUTS if config_name else None, device_plugin=device_plugin,
                                    env=operator_env))
    migmanager.wait_idle(cluster)
    # The operands' pods come from kube-controller-manager's DaemonSet controller and kwok,
    # after the operator made the DaemonSets; a rollout that looked before mig-manager ran on
    # the node would take the node over instead.
    cluster.wait_for(lambda: operands_ready(cluster), "the GPU Operator's operands to run")
    migmanager.wait_idle(cluster)
    return fleet


def operands_ready(cluster, namespace="gpu-operator"):
    """Every DaemonSet of the operator's namespace has its pods, current and ready."""
    return daemonsets_rolled_out(cluster, namespace)


def profiles(fleet, name):
    return sorted(gi["profile_id"] for gpu in sim.load_state(fleet.state_path(name))["gpus"]
                  for gi in gpu["gpu_instances"])


def node_labels(cluster, name):
    return cluster.get("Node", name)["metadata"]["labels"]


def test_drive_mig_manager_from_one_layout_to_another_then_converged(cluster, cluster_env, tmp_path):
    fleet = operator_fleet(tmp_path, cluster, cluster_env)
    for layout, h100, a100 in (("layout-a", [19] * 7, [19] * 7), ("layout-b", [9, 9], [9, 9])):
        site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name=layout))
        assert site.returncode == 0, output(site)
        assert profiles(fleet, "gpu-0") == h100 and profiles(fleet, "gpu-1") == a100, output(site)
        for name in ("gpu-0", "gpu-1"):
            labels = node_labels(cluster, name)
            assert labels[CONFIG] == layout and labels[STATE] == "success" and labels[MIG_MANAGER] == "true"
            assert not cluster.get("Node", name)["spec"].get("unschedulable")
        assert "applied by the GPU Operator's mig-manager" in site.stdout
        # The operator runs the device plugin: no second release, and its plugin advertises the layout.
        assert cluster.list("DaemonSet", namespace="nvidia-device-plugin") == []
    allocatable = cluster.get("Node", "gpu-0")["status"]["allocatable"]
    assert allocatable["nvidia.com/mig-3g.40gb"] == "2"
    # No boot-time restore where mig-manager owns the node (it re-applies the label at boot).
    assert not (fleet.dir / "gpu-0" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service").exists()

    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b"))
    assert all(again.recap[n]["changed"] == 0 and again.recap[n]["failed"] == 0 for n in ("gpu-0", "gpu-1")), \
        output(again)


def test_drive_mig_manager_recovers_the_pending_wedge_and_stops_on_a_failure(cluster, cluster_env, tmp_path):
    fleet = operator_fleet(tmp_path, cluster, cluster_env)
    cluster.patch("Node", "gpu-0", {"metadata": {"annotations": {migmanager.WEDGE_ANNOTATION: "once"}}})
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-a", gpuops_mig_serial="1",
                                                mig_node_mig_manager_timeout="8"))
    assert site.returncode == 0, output(site)
    assert "Restart the node's mig-manager pod" in site.stdout
    assert profiles(fleet, "gpu-0") == [19] * 7
    assert node_labels(cluster, "gpu-0")["nvidia.com/gpu.deploy.device-plugin"] == "true"

    # mig-manager fails on gpu-0: the node stays cordoned, labelled failed, and gpu-1 is not touched.
    sim.add_fault(fleet.state_path("gpu-0"), "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    before = fleet.digest("gpu-1")
    failed = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b", gpuops_mig_serial="1"))
    assert failed.recap["gpu-0"]["failed"] == 1, output(failed)
    assert "through the GPU Operator's mig-manager failed" in failed.stdout
    node = cluster.get("Node", "gpu-0")
    assert node["metadata"]["labels"][STATE] == "failed" and node["spec"]["unschedulable"] is True
    assert fleet.digest("gpu-1") == before
    # That mig-manager pod had completed a run: it left the operands paused; the collection put them back.
    assert node["metadata"]["labels"]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert "nvidia.com/gpu.deploy.device-plugin" in failed.stdout and "were set back to true" in failed.stdout


def test_drive_mig_manager_on_the_default_install_with_its_per_node_config(cluster, cluster_env, tmp_path):
    """No migManager.config.name (the chart's default): mig-manager applies what it generated for the node,
    <node>-mig-config; the preview checks that config, and default-mig-parted-config is never used."""
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",), config_name="")
    # all-3g.40gb is only in what mig-manager generated (the operator's asset has no such config).
    assert "all-3g.40gb" not in seed.DEFAULT_MIG_PARTED_CONFIG["mig-configs"]
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="all-3g.40gb"))
    assert site.returncode == 0, output(site)
    assert profiles(fleet, "gpu-0") == [9, 9] and node_labels(cluster, "gpu-0")[STATE] == "success"
    # Naming the operator's default ConfigMap is refused before any change: mig-manager does not read it.
    before = fleet.digest("gpu-0")
    refused = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="all-1g.10gb",
                                                   mig_node_config_configmap="default-mig-parted-config"))
    assert refused.returncode != 0 and "not from default-mig-parted-config" in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before


def test_drive_mig_manager_with_reboot_waits_out_the_reboot_and_the_driver_rebuild(
        cluster, cluster_env, tmp_path, monkeypatch):
    monkeypatch.setattr(migmanager, "TIME_SCALE", 1 / 20)     # reboot and driver rebuild: 12 s
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xA100-SXM4-40GB",),
                           operator_env={"WITH_REBOOT": "true"})
    sim.set_host(fleet.state_path("gpu-0"), passthrough=True)   # the reset is refused: the mode needs a reboot
    boot = sim.boot_id(fleet.state_path("gpu-0"))
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-a", mig_node_mig_manager_timeout="5",
                                                mig_node_reboot_timeout="30"))
    assert site.returncode == 0, output(site)
    assert sim.boot_id(fleet.state_path("gpu-0")) != boot and profiles(fleet, "gpu-0") == [19] * 7
    # Not taken for the stuck-at-pending case: the collection deleted no mig-manager pod.
    assert not [r for r in cluster.requests if r.method == "DELETE" and r.user.endswith(":rollout")
                and "/pods/nvidia-mig-manager" in r.path]
    labels = node_labels(cluster, "gpu-0")
    assert labels[STATE] == "success" and labels["nvidia.com/gpu.deploy.device-plugin"] == "true"


def test_drive_mig_manager_says_when_a_config_name_just_added_may_not_be_mounted_yet(
        cluster, cluster_env, tmp_path, monkeypatch):
    monkeypatch.setattr(migmanager, "TIME_SCALE", 3.0)      # the kubelet's sync: 3 minutes, longer than the run
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    added = dict(LAYOUTS["mig-configs"], **{"layout-c": [{"devices": "all", "mig-enabled": True,
                                                          "mig-devices": {"7g.80gb": 1}}]})
    cluster.patch("ConfigMap", USER_CONFIG, {"data": {"config.yaml": yaml.safe_dump(
        dict(LAYOUTS, **{"mig-configs": added}))}}, "gpu-operator")
    failed = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-c"))
    assert failed.returncode != 0 and node_labels(cluster, "gpu-0")[STATE] == "failed", output(failed)
    assert "if 'layout-c' was added to ConfigMap gpu-operator/mig-layouts in the last minutes" in failed.stdout


def test_take_over_from_mig_manager_then_converged(cluster, cluster_env, tmp_path):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",) * 2,
                           mig_node_layouts=[{"gpus": "all", "devices": {"2g.20gb": 3}}])
    # auto refuses an inventory layout on a node mig-manager manages, before any change.
    before = fleet.digest("gpu-0")
    refused = fleet.run("playbooks/site.yml", FAST)
    assert refused.returncode != 0 and "would be fought over" in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before and node_labels(cluster, "gpu-0")[MIG_MANAGER] == "true"

    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="takeover"))
    assert site.returncode == 0, output(site)
    for name in ("gpu-0", "gpu-1"):
        labels = node_labels(cluster, name)
        assert labels[MIG_MANAGER] == "false" and labels[STATE] == "success" and labels[CONFIG] == "custom"
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        assert profiles(fleet, name) == [14, 14, 14]
    assert cluster.list("Pod", namespace="gpu-operator", label_selector="app=nvidia-mig-manager") == []
    unit = (fleet.dir / "gpu-0" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service").read_text()
    assert "After=" in unit and "kubelet.service" in unit.split("After=", 1)[1].splitlines()[0]
    # From now on auto works on these nodes (mig-manager is off there), and nothing changes.
    again = fleet.run("playbooks/site.yml", FAST)
    assert all(again.recap[n]["changed"] == 0 and again.recap[n]["failed"] == 0 for n in ("gpu-0", "gpu-1")), \
        output(again)


def test_hand_a_node_back_to_mig_manager(cluster, cluster_env, tmp_path):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    fleet.hosts["gpu-0"]["mig_node_layouts"] = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="takeover"))
    assert site.returncode == 0, output(site)
    # Hand back (docs/gpu-operator.md): the label names an operator config matching the GPUs, then mig-manager on.
    cluster.patch("Node", "gpu-0", {"metadata": {"labels": {CONFIG: "layout-b", STATE: None, MIG_MANAGER: "true"}}})
    # mig-manager acts once its new pod runs (DaemonSet controller, scheduler, kwok): wait_idle
    # alone can return before that pod exists.
    cluster.wait_for(lambda: node_labels(cluster, "gpu-0").get(STATE) == "success",
                     "mig-manager back on gpu-0", timeout=60)
    migmanager.wait_idle(cluster)
    assert node_labels(cluster, "gpu-0")[STATE] == "success" and profiles(fleet, "gpu-0") == [9, 9]
    del fleet.hosts["gpu-0"]["mig_node_layouts"]
    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_persist="false"))
    assert again.returncode == 0 and again.recap["gpu-0"]["changed"] == 0, output(again)
    assert "is already in place" in again.stdout


@pytest.mark.parametrize("extra, message", [
    ({"mig_node_config_name": "layout-x"},
     "ConfigMap gpu-operator/mig-layouts (key config.yaml): no config named 'layout-x'"),
    ({"mig_node_config_configmap": "other-layouts", "mig_node_config_name": "layout-a"},
     "reads its MIG config from ConfigMap gpu-operator/mig-layouts (its migManager.config.name), not from "
     "other-layouts"),
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
    # Without operator detection in the preview (deprecated), the device-plugin play still reads the
    # ClusterPolicy itself.
    ({"mig_node_operator_detect": "false", "mig_node_layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}],
      "gpuops_mig_deploy_device_plugin": "true"},
     "already runs the device plugin; two would advertise the same GPUs"),
])
def test_bad_input_is_refused_before_any_change(cluster, cluster_env, tmp_path, extra, message):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    cluster.seed({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-key", "namespace": "gpu-operator"},
                  "data": {"other": "x"}},
                 {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "other-layouts", "namespace": "gpu-operator"},
                  "data": {"config.yaml": yaml.safe_dump(LAYOUTS)}},
                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "broken", "namespace": "gpu-operator"},
                  "data": {"config.yaml": "version: v1\nmig-configs: {layout-a: [{devices: all, mig-devices: 7}]}\n"}})
    if "gpuops_mig_driver_root" in extra:
        fleet.hosts["gpu-0"]["gpuops_mig_driver_root"] = extra.pop("gpuops_mig_driver_root")
    before = fleet.digest("gpu-0")
    site = fleet.run("playbooks/site.yml", dict(FAST, **extra))
    assert site.returncode != 0
    assert message in site.stdout, output(site)
    assert fleet.digest("gpu-0") == before
    node = cluster.get("Node", "gpu-0")
    assert node["metadata"]["labels"][CONFIG] == "all-disabled" and not node["spec"].get("unschedulable")


def test_dra_driver_static_mig_is_validated_through_resourceslices_and_dynamic_mig_is_refused(
        cluster, cluster_env, tmp_path):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",), device_plugin=False,
                           mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}],
                           mig_node_operator_mode="takeover")
    cluster.seed(*seed.dra_driver())
    site = fleet.run("playbooks/site.yml", FAST)
    assert site.returncode == 0, output(site)
    assert "Wait until the node's ResourceSlices publish the layout" in site.stdout
    devices = cluster.list("ResourceSlice", field_selector="spec.nodeName=gpu-0")[0]["spec"]["devices"]
    assert sorted(d["attributes"]["profile"]["string"] for d in devices) == ["3g.40gb", "3g.40gb"]

    cluster.seed(*seed.dra_driver(dynamic_mig=True))     # destroys the devices it did not create
    # The DaemonSet controller rolls the plugin's pod; the new one destroys them when it starts.
    cluster.wait_for(lambda: dynamic_plugin_runs(cluster, "gpu-0"), "the DynamicMIG plugin to run",
                     timeout=90)
    cluster.stand_ins.sync()
    fleet.hosts["gpu-0"]["mig_node_layouts"] = [{"gpus": "all", "devices": {"1g.10gb": 7}}]
    before = fleet.digest("gpu-0")
    refused = fleet.run("playbooks/site.yml", FAST)
    assert refused.returncode != 0 and "DynamicMIG feature gate" in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before


def dynamic_plugin_runs(cluster, node):
    """A pod of NVIDIA's DRA kubelet plugin with DynamicMIG on runs on `node`, and no other."""
    pods = [p for p in cluster.list("Pod", "nvidia-dra-driver-gpu", field_selector="spec.nodeName=" + node)
            if not p["metadata"].get("deletionTimestamp")]
    gates = [e.get("value") for p in pods for e in p["spec"]["containers"][0].get("env") or []
             if e["name"] == "FEATURE_GATES"]
    return len(pods) == 1 and pods[0]["status"].get("phase") == "Running" and gates == ["DynamicMIG=true"]


def test_a_gpu_cluster_node_gets_its_static_layout_from_the_collection(cluster, cluster_env, tmp_path):
    """GPU Operator v26.7's GPUCluster runs NVIDIA's DRA driver and no mig-manager: its MIG devices must be set up
    beforehand. The collection applies the layout itself and deploys no device plugin beside the DRA driver. The
    GPUCluster's DRA kubelet plugin and DCGM (the stand-in gpucluster.py renders them) are paused through their
    deploy labels while the GPUs change, come back afterwards, and the plugin's ResourceSlice is checked."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-0", "1xH100-SXM5-80GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}])
    cluster.seed(*seed.gpu_cluster())
    operands = ["nvidia-dcgm-dra", "nvidia-dcgm-exporter-dra", "nvidia-dra-driver-kubelet-plugin"]

    def running():
        pods = cluster.list("Pod", namespace="gpu-operator", field_selector="spec.nodeName=gpu-0")
        return sorted(p["metadata"]["labels"]["app"] for p in pods
                      if p["status"].get("phase") == "Running")
    cluster.wait_for(lambda: running() == operands, "the GPUCluster's operands to run")
    refused = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="mig-manager"))
    assert refused.returncode != 0 and "GPUCluster gpu-cluster runs NVIDIA's DRA driver and no mig-manager" in \
        refused.stdout, output(refused)
    history, gone = [], []

    def record(event):
        labels = event.obj["metadata"].get("labels") or {}
        entry = (labels.get(STATE), labels.get(DRA_PLUGIN), labels.get(DCGM_DRA), labels.get(DRA_VALIDATOR))
        if not history or history[-1] != entry:
            history.append(entry)
    cluster.on("modified", record, kind="Node")
    cluster.on("deleted", lambda event: gone.append(event.obj["metadata"]["labels"].get("app")), kind="Pod")
    site = fleet.run("playbooks/site.yml", FAST)
    assert site.returncode == 0, output(site)
    assert "a static layout under the GPUCluster gpu-cluster" in site.stdout
    assert profiles(fleet, "gpu-0") == [9, 9] and node_labels(cluster, "gpu-0")[STATE] == "success"
    # Paused while the change was pending (the driver and the DRA validator run on), then put back.
    paused = "paused-for-mig-change"
    assert ("pending", paused, paused, "true") in history, history
    assert history[-1] == ("success", "true", "true", "true"), history
    assert {"nvidia-dra-driver-kubelet-plugin", "nvidia-dcgm-dra", "nvidia-dcgm-exporter-dra"} <= set(gone), gone
    assert node_labels(cluster, "gpu-0")["nvidia.com/gpu.deploy.dcgm-exporter-dra"] == "true"
    assert "gpuops.mig/owed" not in cluster.get("Node", "gpu-0")["metadata"].get("annotations", {})
    # Validated on the ResourceSlice the restarted plugin published: the node's devices are the layout.
    assert "Wait until the node's ResourceSlices publish the layout" in site.stdout
    devices = cluster.list("ResourceSlice", field_selector="spec.nodeName=gpu-0")[0]["spec"]["devices"]
    assert sorted(d["attributes"]["profile"]["string"] for d in devices) == ["3g.40gb", "3g.40gb"]
    assert cluster.list("DaemonSet", namespace="nvidia-device-plugin") == []

    # A run that died after pausing them and changing the GPUs: the next run puts the labels back first and
    # validates on the ResourceSlices (the plugin's DaemonSet still counts as the node's while its label is paused).
    owed = {"run": "20261125T080000Z-dead", "job": "", "time": "2026-11-25T08:00:00Z", "services": [],
            "operands": {DRA_PLUGIN: "true", DCGM_DRA: "true"}, "device_plugin": True}
    cluster.patch("Node", "gpu-0", {"metadata": {"labels": {DRA_PLUGIN: paused, DCGM_DRA: paused},
                                                 "annotations": {"gpuops.mig/owed": json.dumps(owed)}}})
    # ... and the node's Lease, which names that run as its last holder (what ties the record to
    # it).
    cluster.patch("Lease", "gpuops-mig-gpu-0",
                  {"metadata": {"annotations": {"gpuops.mig/lease-run-id": owed["run"]}}},
                  namespace="default")
    repaired = fleet.run("playbooks/site.yml", FAST)
    assert repaired.returncode == 0, output(repaired)
    assert "run 20261125T080000Z-dead, interrupted" in repaired.stdout, output(repaired)
    assert "Wait until the node's ResourceSlices publish the layout" in repaired.stdout
    assert (node_labels(cluster, "gpu-0")[DRA_PLUGIN], node_labels(cluster, "gpu-0")[DCGM_DRA]) == ("true", "true")
    assert "gpuops.mig/owed" not in cluster.get("Node", "gpu-0")["metadata"].get("annotations", {})


# NVIDIA's host service as NVIDIA/mig-parted deployments/systemd installs it: a oneshot unit that applies the
# config its drop-in override.conf selects (MIG_PARTED_SELECTED_CONFIG) at every boot. Here its ExecStart applies
# that config of the operator's asset to the simulated GPUs.
NVIDIA_SERVICE = """
import os, sys
sys.path[:0] = [{repo!r}, os.path.join({repo!r}, "simulator")]
from tests.support.kubeapi import migmanager, seed
text = open({override!r}).read()
name = text.split("MIG_PARTED_SELECTED_CONFIG=", 1)[1].split('"', 1)[0].split()[0]
code, out = migmanager.apply_config(os.environ["GPUOPS_MIG_SIMULATE"], seed.DEFAULT_MIG_PARTED_CONFIG, name)
print(out)
sys.exit(code)
"""


def nvidia_mig_manager_service(fleet, name, selected="all-disabled"):
    """NVIDIA's nvidia-mig-manager.service, enabled, on a simulated host; returns a systemctl runner."""
    unit_dir = fleet.dir / name / "etc" / "systemd" / "system"
    (unit_dir / "nvidia-mig-manager.service.d").mkdir(parents=True)
    override = unit_dir / "nvidia-mig-manager.service.d" / "override.conf"
    override.write_text('[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=%s"\n' % selected)
    script = fleet.dir / name / "etc" / "nvidia-mig-manager" / "service.py"
    script.parent.mkdir(parents=True)
    script.write_text(NVIDIA_SERVICE.format(repo=REPO, override=str(override)))
    (unit_dir / "nvidia-mig-manager.service").write_text(
        "[Unit]\nDescription=Configure MIG on NVIDIA GPUs\nAfter=nvidia-persistenced.service\n\n"
        "[Service]\nType=oneshot\nExecStart=%s %s\n\n[Install]\nWantedBy=multi-user.target\n"
        % (sys.executable, script))
    env = dict(fleet.env, GPUOPS_MIG_SIMULATE=fleet.state_path(name), SYSTEMD_UNIT_PATH=str(unit_dir))

    def systemctl(*args):
        return subprocess.run([sys.executable, os.path.join(REPO, "simulator", "bin", "systemctl")] + list(args),
                              capture_output=True, text=True, timeout=300, env=env, check=False)
    assert systemctl("enable", "nvidia-mig-manager.service").returncode == 0
    return systemctl, override


def test_nvidia_host_mig_manager_service_is_off_while_we_manage_the_node_and_back_on_at_hand_back(
        cluster, cluster_env, tmp_path):
    """A host-driver node with NVIDIA's nvidia-mig-manager.service: it would revert the layout at every boot,
    after the collection's boot-time restore. It is disabled while the collection manages the node (its
    override.conf as found) and enabled again by playbooks/disable.yml."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-0", "1xA100-SXM4-40GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.20gb": 2}}])
    systemctl, override = nvidia_mig_manager_service(fleet, "gpu-0")
    before = override.read_bytes()
    site = fleet.run("playbooks/site.yml", FAST)
    assert site.returncode == 0, output(site)
    assert systemctl("is-enabled", "nvidia-mig-manager.service").stdout.strip() == "disabled"
    assert override.read_bytes() == before
    assert profiles(fleet, "gpu-0") == [9, 9]
    # A reboot: the collection's restore brings the layout back, and NVIDIA's unit no longer reverts it.
    assert systemctl("reboot").returncode == 0
    assert profiles(fleet, "gpu-0") == [9, 9]
    again = fleet.run("playbooks/site.yml", FAST)
    assert again.returncode == 0 and again.recap["gpu-0"]["changed"] == 0, output(again)

    # The hand-back: MIG off, the restore removed, NVIDIA's unit on again as it was found.
    off = fleet.run("playbooks/disable.yml", FAST)
    assert off.returncode == 0, output(off)
    assert systemctl("is-enabled", "nvidia-mig-manager.service").stdout.strip() == "enabled"
    assert override.read_bytes() == before
    assert not list((fleet.dir / "gpu-0").glob("var/lib/gpuops-mig/*"))
