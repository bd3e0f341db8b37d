"""playbooks/site.yml's preview (issues 21 and 27): mig_node_force reaches it, gpuops_mig_preview_failure=skip
leaves a refused node out, a misspelt variable is refused; on GPU Operator clusters a mig-manager run already in
flight is waited out before the label changes, and a ClusterPolicy without mig.strategy means none."""

import subprocess
import threading
import time

import pytest

import gpuops_mig_sim as sim
from tests.support.kubeapi import migmanager
from tests.support.simhost import nvml_on
from test_gpu_operator import FAST, operator_fleet, profiles
from test_roles import CONFIG, STATE, Fleet, output

pytestmark = pytest.mark.playbook

SEVEN_1G = [{"gpus": "all", "devices": {"1g.10gb": 7}}]


def busy_3g(state):
    """MIG on, a 3g.40gb with a live process on it (a real one, reaped as soon as it dies)."""
    sim.create_state(state, "1xH100-SXM5-80GB", seed="gpu-busy", mig="enabled", force=True)
    with nvml_on(state) as nvml:
        gi = nvml.create_gpu_instance(0, 9, 4, 4)
        nvml.create_compute_instance(0, gi, 2, 0)
    proc = subprocess.Popen(["sleep", "600"])
    threading.Thread(target=proc.wait, daemon=True).start()
    sim.add_process(state, 0, pid=proc.pid, gi=gi, ci=0, live=True)
    return proc


def test_typo_skip_and_force(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    busy = fleet.add("gpu-busy", "1xH100-SXM5-80GB", mig_node_layouts=SEVEN_1G)
    proc = busy_3g(busy)
    fleet.add("gpu-free", "1xH100-SXM5-80GB", mig_node_layouts=SEVEN_1G)
    fast = {"mig_node_validate_delay": "1"}
    try:
        # A misspelt variable is refused by the preview, with the closest documented name; nothing changes.
        before = {name: fleet.digest(name) for name in fleet.hosts}
        typo = fleet.run("playbooks/site.yml", dict(fast, mig_node_config_nmae="all-3g"))
        assert typo.returncode != 0, output(typo)
        assert "unknown variable mig_node_config_nmae (did you mean mig_node_config_name?)" in typo.stdout, output(typo)
        assert {name: fleet.digest(name) for name in fleet.hosts} == before

        bad = fleet.run("playbooks/site.yml", dict(fast, gpuops_mig_preview_failure="skp"))
        assert bad.returncode != 0 and "gpuops_mig_preview_failure must be stop or skip, not 'skp'" in bad.stdout

        # skip: the busy node is left as it is and listed with the reason; the other one is rolled out.
        skipped = fleet.run("playbooks/site.yml", dict(fast, gpuops_mig_preview_failure="skip"))
        assert skipped.returncode == 0, output(skipped)
        assert fleet.digest("gpu-busy") == before["gpu-busy"]
        assert not cluster.get("Node", "gpu-busy")["spec"].get("unschedulable")
        assert fleet.devices("gpu-free") == {0: {"1g.10gb": 7}}
        assert "1 node(s) to change (gpu-free), 0 already converged. 1 skipped, left as they are (gpu-busy)." \
            in skipped.stdout, output(skipped)
        summary = skipped.stdout.split("TASK [Show the summary]")[1]
        assert "gpu-busy  skipped" in summary and "gpu-free  changed" in summary, summary
        assert "gpu-busy skipped: " in summary and "force" in summary.split("gpu-busy skipped: ")[1], summary

        # mig_node_force reaches the preview: the busy device goes, its process is terminated.
        forced = fleet.run("playbooks/site.yml", dict(fast, mig_node_force="true"))
        assert forced.returncode == 0, output(forced)
        assert fleet.devices("gpu-busy") == {0: {"1g.10gb": 7}}
        for _attempt in range(50):
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is not None
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_mig_manager_run_in_flight_is_waited_out_before_the_label_changes(
    cluster, cluster_env, tmp_path
):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    # A run for layout-a in flight (pending) when the rollout to layout-b starts: it ends with its own
    # success after the collection could have patched the label. Runs take a while (2 s a step), as real
    # ones do, so that the GPUs are checked before the run for layout-b could have made them right.
    cluster.patch("Node", "gpu-0", {"metadata": {"labels": {CONFIG: "layout-a"},
                                                 "annotations": {migmanager.HOLD_ANNOTATION: "50",
                                                                 migmanager.DELAY_ANNOTATION: "2"}}})
    for _attempt in range(200):
        if cluster.get("Node", "gpu-0")["metadata"]["labels"].get(STATE) == "pending":
            break
        time.sleep(0.05)
    assert cluster.get("Node", "gpu-0")["metadata"]["labels"][STATE] == "pending"
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b"))
    assert site.returncode == 0, output(site)
    assert "once its run in flight (nvidia.com/mig.config.state=pending) has ended" in site.stdout, output(site)
    assert profiles(fleet, "gpu-0") == [9, 9]
    migmanager.wait_idle(cluster)
    labels = cluster.get("Node", "gpu-0")["metadata"]["labels"]
    assert labels[CONFIG] == "layout-b" and labels[STATE] == "success"
    assert profiles(fleet, "gpu-0") == [9, 9]


def test_a_clusterpolicy_without_mig_strategy_means_none(cluster, cluster_env, tmp_path):
    fleet = operator_fleet(
        tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",), strategy=None
    )
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin-daemonset", "gpu-operator")
    assert "MIG_STRATEGY" not in [e["name"] for e in plugin["spec"]["template"]["spec"]["containers"][0]["env"]]
    # No strategy declared (the simulated fleet's group_vars declare mixed): the operator's counts.
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b", gpuops_mig_strategy=""))
    assert site.returncode == 0, output(site)
    assert profiles(fleet, "gpu-0") == [9, 9]
    # The device plugin runs with none: the GPU is advertised whole, and validation expected just that.
    allocatable = cluster.get("Node", "gpu-0")["status"]["allocatable"]
    assert allocatable["nvidia.com/gpu"] == "1" and "nvidia.com/mig-3g.40gb" not in allocatable
    refused = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-a", gpuops_mig_strategy="mixed"))
    assert refused.returncode != 0
    assert "ClusterPolicy cluster-policy sets no mig.strategy (its device plugin and GFD run with their default, " \
           "'none')" in refused.stdout, output(refused)


def test_a_run_wedged_before_the_rollout_is_recovered_before_the_label_changes(
    cluster, cluster_env, tmp_path
):
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    # An earlier run wedged at pending (gpu-operator issue 2833): no run is in flight, the state stays pending.
    cluster.patch("Node", "gpu-0", {"metadata": {"labels": {CONFIG: "layout-a"},
                                                 "annotations": {migmanager.WEDGE_ANNOTATION: "once"}}})
    migmanager.wait_idle(cluster)
    assert cluster.get("Node", "gpu-0")["metadata"]["labels"][STATE] == "pending"
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b", mig_node_mig_manager_timeout="5"))
    assert site.returncode == 0, output(site)
    assert "Let its run end" in site.stdout, output(site)
    assert profiles(fleet, "gpu-0") == [9, 9]
    labels = cluster.get("Node", "gpu-0")["metadata"]["labels"]
    assert labels[CONFIG] == "layout-b" and labels[STATE] == "success"
