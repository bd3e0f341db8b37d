"""Hand-off of a node to a dynamic MIG partitioner and back (mig_node_operator_mode=dynamic-dra or dynamic-hami,
mig_node_dynamic_take_back; docs/gpu-operator.md, "Hand-off to dynamic partitioners"): a GPU Operator node that
mig-manager set up is handed to NVIDIA's DRA driver with DynamicMIG (the kubelet plugin's stand-in, dra.py and
dynamic.py, on the real test cluster), left alone by static runs, and taken back to a static layout that mig-manager applies again."""

import json

import pytest

import gpuops_mig_sim as sim
from tests.support.kubeapi import dynamic, hami, seed
from test_gpu_operator import FAST, MIG_MANAGER, operator_fleet, profiles, node_labels
from test_roles import CONFIG, STATE, Fleet, output

pytestmark = pytest.mark.playbook

HANDED_OFF = "gpuops.mig/handed-off"
SELECTOR = {"gpuops.mig/dynamic": "nvidia-dra"}


def dynamic_fleet(tmp_path, cluster, cluster_env):
    """One H100 node at layout-a through mig-manager, and a DynamicMIG DRA driver that runs only on the nodes
    labelled for it."""
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xH100-SXM5-80GB",))
    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-a"))
    assert site.returncode == 0 and profiles(fleet, "gpu-0") == [19] * 7, output(site)
    cluster.seed(*seed.dra_driver(dynamic_mig=True, node_selector=SELECTOR))
    # The kubelet wipes a gone plugin's slices after 30 s; a second here.
    cluster.patch("Node", "gpu-0", {"metadata": {"annotations": {dynamic.WIPING_DELAY_ANNOTATION: "1"}}})
    return fleet


def slices(cluster):
    return cluster.list("ResourceSlice", field_selector="spec.nodeName=gpu-0")


def test_a_static_node_is_handed_to_dynamic_mig_left_alone_then_taken_back(cluster, cluster_env, tmp_path):
    fleet = dynamic_fleet(tmp_path, cluster, cluster_env)
    assert slices(cluster) == []           # the plugin does not run on the node yet

    site = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="dynamic-dra"))
    assert site.returncode == 0, output(site)
    assert "hand the node to the dynamic partitioner nvidia-dra" in site.stdout
    state = sim.load_state(fleet.state_path("gpu-0"))
    assert profiles(fleet, "gpu-0") == [] and state["gpus"][0]["mig"]["current"] == 1     # MIG on, no device
    node = cluster.get("Node", "gpu-0")
    labels = node["metadata"]["labels"]
    assert labels[MIG_MANAGER] == "false" and labels["gpuops.mig/dynamic"] == "nvidia-dra"
    assert CONFIG not in labels and STATE not in labels and not node["spec"].get("unschedulable")
    record = json.loads(node["metadata"]["annotations"][HANDED_OFF])
    assert record["partitioner"] == "nvidia-dra" and record["mig_manager"] == "true"
    # The plugin publishes the whole GPU and every placement of every profile, with shared counters.
    published = [d for s in slices(cluster) for d in s["spec"].get("devices") or []]
    kinds = sorted({d["attributes"]["type"]["string"] for d in published})
    mig = [d for d in published if d["attributes"]["type"]["string"] == "mig"]
    assert kinds == ["gpu", "mig"] and mig and not any("uuid" in d["attributes"] for d in mig)
    assert "gpu-0-mig-1g10gb-19-6" in {d["name"] for d in published}
    assert any(s["spec"].get("sharedCounters") for s in slices(cluster))

    again = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="dynamic-dra"))
    assert again.returncode == 0 and again.recap["gpu-0"]["changed"] == 0, output(again)
    assert "handed to the dynamic partitioner nvidia-dra already" in again.stdout

    # A static run leaves the node to the partitioner, and says so.
    before = fleet.digest("gpu-0")
    static = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b"))
    assert static.returncode == 0 and "left to it. Set mig_node_dynamic_take_back=true" in static.stdout, output(static)
    assert fleet.digest("gpu-0") == before and HANDED_OFF in cluster.get("Node", "gpu-0")["metadata"]["annotations"]

    # Taken back: the plugin leaves, its slices go, mig-manager comes back and applies the static layout.
    back = fleet.run("playbooks/site.yml", dict(FAST, mig_node_config_name="layout-b", mig_node_dynamic_take_back=True))
    assert back.returncode == 0, output(back)
    assert "take the node back from the dynamic partitioner nvidia-dra" in back.stdout
    assert profiles(fleet, "gpu-0") == [9, 9]
    node = cluster.get("Node", "gpu-0")
    labels = node["metadata"]["labels"]
    assert labels[MIG_MANAGER] == "true" and labels[CONFIG] == "layout-b" and labels[STATE] == "success"
    assert "gpuops.mig/dynamic" not in labels and HANDED_OFF not in (node["metadata"].get("annotations") or {})
    assert not node["spec"].get("unschedulable")
    # The plugin's pod terminates and the kubelet wipes its slices a second later.
    cluster.wait_for(lambda: slices(cluster) == [], "the dynamic plugin's slices to go")


@pytest.mark.parametrize("extra, busy, message", [
    ({"mig_node_operator_mode": "dynamic-run-ai"}, False,
     "mig_node_operator_mode must be one of: auto, mig-manager, takeover, dynamic-dra, dynamic-hami"),
    ({"mig_node_operator_mode": "dynamic-hami"}, False, "no DaemonSet of HAMi's device plugin"),
    ({}, True, "force"),
])
def test_a_bad_hand_off_is_refused_before_any_change(cluster, cluster_env, tmp_path, extra, busy, message):
    fleet = dynamic_fleet(tmp_path, cluster, cluster_env)
    if busy:         # a process on a MIG device the hand-off would destroy
        gi = sim.load_state(fleet.state_path("gpu-0"))["gpus"][0]["gpu_instances"][0]["id"]
        sim.add_process(fleet.state_path("gpu-0"), 0, pid=4242, gi=gi, ci=0)
    before = fleet.digest("gpu-0")
    labels = node_labels(cluster, "gpu-0")
    refused = fleet.run("playbooks/site.yml", dict(dict(FAST, mig_node_operator_mode="dynamic-dra"), **extra))
    assert refused.returncode != 0 and message in refused.stdout, output(refused)
    assert fleet.digest("gpu-0") == before and node_labels(cluster, "gpu-0") == labels
    assert HANDED_OFF not in (cluster.get("Node", "gpu-0")["metadata"].get("annotations") or {})


def test_a_partitioner_whose_plugin_cannot_run_fails_the_hand_off_naming_its_daemonset(
        cluster, cluster_env, tmp_path):
    """Taught by the real server: a DaemonSet whose ServiceAccount is missing makes no pod. The
    hand-off waits for the plugin to run on the node, then fails naming the DaemonSet and where
    its reason is (the wait's own output is hidden: the node failed with "Unknown error")."""
    fleet = dynamic_fleet(tmp_path, cluster, cluster_env)
    cluster.delete("ServiceAccount", "dra-driver-nvidia-gpu-service-account", "nvidia-dra-driver-gpu")
    failed = fleet.run("playbooks/site.yml", dict(FAST, mig_node_operator_mode="dynamic-dra",
                                                  mig_node_drain_timeout="10"))
    assert failed.returncode != 0, output(failed)
    assert ("gpu-0: the pod of DaemonSet nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin "
            "(app.kubernetes.io/component=kubelet-plugin,app.kubernetes.io/name=dra-driver-nvidia-gpu) "
            "did not run again on the node after 10 s") in failed.stdout, output(failed)
    assert "`kubectl -n nvidia-dra-driver-gpu get events` says why" in failed.stdout
    # The node's failure names that step, not the wait (which ansible-core still shows as an
    # "Unknown error" line before it moves on).
    assert "failed at 'Fail when the partitioner's plugin did not run again'" in failed.stdout


def test_a_node_without_the_gpu_operator_is_handed_to_hami_and_taken_back(cluster, cluster_env, tmp_path):
    """HAMi's device plugin (the stand-in hami.py): its per-node config turned to mig and put back, its
    registration checked, its plugin sent away again; the static layout is the collection's own."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-0", "1xH100-SXM5-80GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}])
    common = dict(FAST, gpuops_mig_deploy_device_plugin="false", mig_node_validate="false")
    assert fleet.run("playbooks/site.yml", common).returncode == 0 and profiles(fleet, "gpu-0") == [9, 9]
    cluster.seed(*hami.manifests(nodeconfig=[{"name": "gpu-9", "operatingmode": "hami-core"}]))

    site = fleet.run("playbooks/site.yml", dict(common, mig_node_operator_mode="dynamic-hami"))
    assert site.returncode == 0, output(site)
    assert profiles(fleet, "gpu-0") == []
    node = cluster.get("Node", "gpu-0")
    assert node["metadata"]["labels"]["gpu"] == "on" and not node["spec"].get("unschedulable")
    registered = json.loads(node["metadata"]["annotations"][hami.REGISTER])
    assert [d["mode"] for d in registered] == ["mig"] and registered[0]["migProfiles"]
    assert hami_nodeconfig(cluster) == {"gpu-9": "hami-core", "gpu-0": "mig"}
    record = json.loads(node["metadata"]["annotations"][HANDED_OFF])
    assert record["hami_entry"] is None and "pending" not in record

    back = fleet.run("playbooks/site.yml", dict(common, mig_node_dynamic_take_back=True))
    assert back.returncode == 0, output(back)
    assert profiles(fleet, "gpu-0") == [9, 9]
    node = cluster.get("Node", "gpu-0")
    assert "gpu" not in node["metadata"]["labels"] and HANDED_OFF not in node["metadata"]["annotations"]
    assert hami_nodeconfig(cluster) == {"gpu-9": "hami-core"}
    cluster.wait_for(lambda: cluster.list(
        "Pod", namespace="kube-system", field_selector="spec.nodeName=gpu-0") == [],
        "HAMi's plugin pod to leave gpu-0")


def hami_nodeconfig(cluster):
    config = json.loads(cluster.get("ConfigMap", hami.CONFIGMAP, "kube-system")["data"]["config.json"])
    return dict((e["name"], e["operatingmode"]) for e in config["nodeconfig"])
