"""The GPU Operator, mig-manager and DRA kubelet plugin stand-ins (tests/support/kubeapi operator.py,
migmanager.py, dra.py) through the clients the roles use: kubernetes.core, the kubernetes Python client
and kubectl, against simulated GPU hosts (gpuops_mig_sim), on the real test cluster: each write is followed by
idle(), until the stand-ins, kube-controller-manager and kwok are done with it."""

import os
import subprocess
import time

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import dynamic as k8s_dynamic
from kubernetes.dynamic.exceptions import ResourceNotFoundError

import gpuops_mig_sim as sim
from tests.support.controlplane.cluster import daemonsets_rolled_out
from tests.support.playbook import run_tasks
from tests.support.kubeapi import dra, migmanager, seed

GPU = {"nvidia.com/gpu.present": "true"}
DP, GFD = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.gpu-feature-discovery"
PAUSED = "paused-for-mig-change"
MIG_CONFIG, STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"
NS = "gpu-operator"


@pytest.fixture
def host(tmp_path):
    path = str(tmp_path / "gpu-1.json")
    sim.create_state(path, "1xA100-SXM4-40GB")
    return path


def settled(cluster, namespace=NS):
    """What the real cluster does after a write is done: the stand-ins caught up with every
    stored change, the DaemonSets of `namespace` (None: every namespace; by default the
    operator's) rolled out by kube-controller-manager, mig-manager's workers idle."""
    for dummy in range(2):
        cluster.stand_ins.sync()
        started = [(d["metadata"]["name"], d.get("status"))
                   for d in cluster.list("DaemonSet", namespace)]
        cluster.wait_for(lambda: not cluster.list("DaemonSet", namespace)
                         or daemonsets_rolled_out(cluster, namespace, ready=False),
                         f"the DaemonSets to roll out (at the start: {started})",
                         timeout=60)
        migmanager.wait_idle(cluster, 60)
    cluster.stand_ins.sync()


@pytest.fixture
def idle(cluster):
    """Wait for the mig-manager workers before the cluster is reset."""
    yield lambda: settled(cluster)
    settled(cluster)


def labels_of(api, node="gpu-1"):
    return api.get("Node", node)["metadata"].get("labels", {})


def pods(api, app, node="gpu-1"):
    return list(api.list("Pod", NS, label_selector=f"app={app}", field_selector=f"spec.nodeName={node}"))


def gis(path):
    return sorted((gi["profile_id"], gi["start"]) for gi in sim.load_state(path)["gpus"][0]["gpu_instances"])


def core_api(api):
    return k8s_client.CoreV1Api(k8s_config.new_client_from_config(api.control_plane.kubeconfig))


def running_pod(cluster, namespace, selector="", old_uid=None, what="pod"):
    """The one pod of `namespace` (`selector`: labels) once kwok runs it, with no other pod
    beside it (a deleted one terminating) and not `old_uid`."""
    def one():
        found = cluster.list("Pod", namespace, label_selector=selector)
        if len(found) == 1 and found[0]["metadata"]["uid"] != old_uid and \
                not found[0]["metadata"].get("deletionTimestamp") and \
                (found[0].get("status") or {}).get("phase") == "Running":
            return found[0]
        return None
    return cluster.wait_for(one, f"{'a new ' if old_uid else ''}{what} running", timeout=60)


def replace_pod(cluster, namespace, selector="", what="pod"):
    """Deletes the one pod of `namespace` (`selector`) and waits until its DaemonSet runs a new
    one."""
    [pod] = cluster.list("Pod", namespace, label_selector=selector)
    cluster.delete("Pod", pod["metadata"]["name"], namespace)
    return running_pod(cluster, namespace, selector, pod["metadata"]["uid"], what)


def restart_dra_plugin(cluster, namespace="nvidia-dra-driver-gpu"):
    """Deletes the DRA plugin's pod and waits until its DaemonSet runs a new one."""
    replace_pod(cluster, namespace, what="DRA plugin pod")


def dynamic(api):
    return k8s_dynamic.DynamicClient(k8s_config.new_client_from_config(api.control_plane.kubeconfig))


def record(api, node="gpu-1"):
    """(mig.config.state, device-plugin deploy label) after every change of either, as a watch
    of the node sees them."""
    seen = []
    labels = labels_of(api, node)
    last = [(labels.get(STATE), labels.get(DP))]

    def hook(event):
        if event.obj["metadata"]["name"] != node:
            return
        new = event.obj["metadata"].get("labels", {})
        if (new.get(STATE), new.get(DP)) != last[0]:
            last[0] = (new.get(STATE), new.get(DP))
            seen.append(last[0])
    api.on("modified", hook, kind="Node")
    return seen


@pytest.mark.playbook
def test_kubernetes_core_reads_cluster_policy_and_resource_slices(cluster, admin_env, tmp_path, host, idle):
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), seed.node("gpu-2", GPU), *seed.gpu_operator(),
                 *seed.dra_driver())
    idle()
    results = run_tasks([
        {"name": "policy", "kubernetes.core.k8s_info": {"api_version": "nvidia.com/v1", "kind": "ClusterPolicy"}},
        {"name": "crd", "kubernetes.core.k8s_info": {"api_version": "apiextensions.k8s.io/v1",
                                                     "kind": "CustomResourceDefinition",
                                                     "name": "clusterpolicies.nvidia.com"}},
        {"name": "slices", "kubernetes.core.k8s_info": {"api_version": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                                        "field_selectors": ["spec.nodeName=gpu-1",
                                                                            "spec.driver=gpu.nvidia.com"]}},
        {"name": "classes", "kubernetes.core.k8s_info": {"api_version": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                         "name": "mig.nvidia.com"}},
        {"name": "relabel", "kubernetes.core.k8s": {
            "kind": "Node", "name": "gpu-1", "state": "patched",
            "definition": {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}}}},
    ], admin_env, tmp_path)
    policy = results["policy"]["resources"][0]
    assert policy["metadata"]["name"] == "cluster-policy"
    assert policy["spec"]["mig"]["strategy"] == "single" and policy["spec"]["migManager"]["config"] == {
        "name": "", "default": "all-disabled"}
    assert policy["status"] == {"namespace": NS, "state": "ready"}
    assert results["crd"]["resources"][0]["spec"]["names"]["kind"] == "ClusterPolicy"
    [slice_] = results["slices"]["resources"]
    assert slice_["metadata"]["name"] == "gpu-1-gpu.nvidia.com"
    assert [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0"]
    assert results["classes"]["resources"][0]["metadata"]["name"] == "mig.nvidia.com"
    idle()
    assert labels_of(cluster)[STATE] == "success" and len(gis(host)) == 4


def test_mig_manager_applies_a_config_when_the_label_changes(cluster, host, idle):
    same = dict(seed.DEFAULT_MIG_PARTED_CONFIG["mig-configs"]["all-1g.10gb"][0])
    config = {"version": "v1", "mig-configs": dict(seed.DEFAULT_MIG_PARTED_CONFIG["mig-configs"], **{
        "same-as-1g.10gb": [same]})}
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator(config_name="mine", config=config))
    idle()
    assert labels_of(cluster)[MIG_CONFIG] == "all-disabled" and labels_of(cluster)[STATE] == "success"
    before = {p["metadata"]["uid"] for p in pods(cluster, "nvidia-device-plugin-daemonset")}
    seen = record(cluster)

    core_api(cluster).patch_node("gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert seen[0] == ("pending", "true") and ("pending", "paused-for-mig-change") in seen
    assert seen[-1] == ("success", "true")
    assert gis(host) == [(15, 0), (15, 2), (15, 4), (15, 6)]
    labels = labels_of(cluster)
    assert labels[GFD] == "true" and labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert cluster.get("Node", "gpu-1")["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    after = {p["metadata"]["uid"] for p in pods(cluster, "nvidia-device-plugin-daemonset")}
    assert after and not after & before  # the plugin was restarted
    assert "1g.10gb x4 (created)" in cluster.get("Node", "gpu-1")["metadata"]["annotations"][
        migmanager.LOG_ANNOTATION]

    # The same value again: nothing happens. A name whose geometry is in place: success, no pending.
    del seen[:]
    core_api(cluster).patch_node("gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert seen == []
    core_api(cluster).patch_node("gpu-1", {"metadata": {"labels": {MIG_CONFIG: "same-as-1g.10gb"}}})
    idle()
    assert seen == [] and labels_of(cluster)[STATE] == "success"
    assert {p["metadata"]["uid"] for p in pods(cluster, "nvidia-device-plugin-daemonset")} == after
    # An empty value wakes nothing.
    core_api(cluster).patch_node("gpu-1", {"metadata": {"labels": {MIG_CONFIG: ""}}})
    idle()
    assert seen == [] and len(gis(host)) == 4


def test_mig_manager_fails_unknown_names_and_engine_refusals(cluster, host, idle):
    config = {"version": "v1", "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 8}}]}}
    cluster.seed(seed.node("gpu-1", dict(GPU, **{GFD: "false", "nvidia.com/mig.capable": "true"}), nvml_state=host),
                 *seed.gpu_operator(config_name="custom-mig-config", config=config))
    idle()
    seen = record(cluster)
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "no-such-config"}}})
    idle()
    assert seen == [("failed", "true")]  # straight to failed, no pending
    assert "not in ConfigMap gpu-operator/custom-mig-config" in cluster.get("Node", "gpu-1")["metadata"][
        "annotations"][migmanager.LOG_ANNOTATION]

    del seen[:]
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "too-many"}}})
    idle()
    assert seen[0] == ("pending", "true") and seen[-1] == ("failed", "true")
    labels = labels_of(cluster)
    assert labels[DP] == "true" and labels[GFD] == "false"  # restored; false kept
    assert gis(host) == []
    log = cluster.get("Node", "gpu-1")["metadata"]["annotations"][migmanager.LOG_ANNOTATION]
    assert "engine exit status 1" in log and "cannot be applied" in log


def test_mig_manager_delay_knob_and_client_daemonsets(cluster, host, idle):
    """gpu.deploy.client (operator v26.7): a DRA plugin selecting it is bounced across the change."""
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator(),
                 *seed.dra_driver(node_selector={"nvidia.com/gpu.deploy.client": "true"}))
    idle()
    slice_ = cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")
    assert [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0"]
    # Three seconds a step: long enough to see the run in progress on a loaded machine.
    cluster.patch("Node", "gpu-1", {"metadata": {"annotations": {migmanager.DELAY_ANNOTATION: "3"},
                                                 "labels": {MIG_CONFIG: "all-1g.10gb"}}})
    with pytest.raises(TimeoutError):
        migmanager.wait_idle(cluster, 1.5)
    # The run reads its config for one step before it writes pending.
    cluster.wait_for(lambda: labels_of(cluster)[STATE] == "pending", "the run to write pending")
    idle()
    assert labels_of(cluster)[STATE] == "success"
    assert labels_of(cluster)["nvidia.com/gpu.deploy.client"] == "true"

    # The DRA plugin's new pod publishes the new devices. The kubelet may have wiped the old
    # pod's slice before it started, so the pool's generation is 1 or 2.
    def published():
        found = cluster.find("ResourceSlice", "gpu-1-gpu.nvidia.com") or {}
        return [d["name"] for d in (found.get("spec") or {}).get("devices") or []]
    cluster.wait_for(lambda: published() == [f"gpu-0-mig-1g10gb-15-{s}" for s in (0, 2, 4, 6)],
                     "the new plugin pod's slice with four 1g.10gb devices", timeout=60)


def test_a_failure_after_a_completed_run_leaves_the_gpu_clients_paused(cluster, host, idle):
    config = {"version": "v1", "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4}}],
        "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 8}}]}}
    cluster.seed(seed.node("gpu-1", dict(GPU, **{GFD: "false", "nvidia.com/mig.capable": "true"}),
                           nvml_state=host),
                 *seed.gpu_operator(config_name="custom-mig-config", config=config))
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert labels_of(cluster)[STATE] == "success" and labels_of(cluster)[DP] == "true"
    # NoRestartK8sDaemonsetsOnExit is set for good in this pod: its next failure restores nothing.
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "too-many"}}})
    idle()
    labels = labels_of(cluster)
    assert labels[STATE] == "failed" and labels[DP] == PAUSED and labels[GFD] == "false"
    cluster.wait_for(lambda: not pods(cluster, "nvidia-device-plugin-daemonset"),
                     "the device plugin's pod gone")
    log = cluster.get("Node", "gpu-1")["metadata"]["annotations"][migmanager.LOG_ANNOTATION]
    assert "left as they are" in log
    # A new pod (a new process) runs the label again and, failing, puts them back.
    replace_pod(cluster, NS, "app=nvidia-mig-manager", "mig-manager pod")
    idle()
    cluster.wait_for(lambda: labels_of(cluster)[DP] == "true",
                     "the new mig-manager to put the device plugin back", timeout=60)
    assert labels_of(cluster)[STATE] == "failed"


def test_mig_manager_wedge_and_recovery_by_deleting_its_pod(cluster, host, idle):
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator())
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {
        "annotations": {migmanager.WEDGE_ANNOTATION: "once"}, "labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    node = cluster.get("Node", "gpu-1")
    labels = node["metadata"]["labels"]
    assert labels[STATE] == "pending" and labels[DP] == labels[GFD] == "paused-for-mig-change"
    assert migmanager.WEDGE_ANNOTATION not in node["metadata"]["annotations"]
    assert gis(host) == [] and not pods(cluster, "nvidia-device-plugin-daemonset")
    # a stopped plugin leaves its resources (the stand-in removes none when its pod goes)
    assert "nvidia.com/gpu" in node["status"]["allocatable"]

    # Setting the same label again does not help; deleting the mig-manager pod does.
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert labels_of(cluster)[STATE] == "pending"
    [manager] = pods(cluster, "nvidia-mig-manager")
    core_api(cluster).delete_namespaced_pod(manager["metadata"]["name"], NS)
    idle()
    labels = labels_of(cluster)
    assert labels[STATE] == "success" and labels[DP] == labels[GFD] == "true"
    assert len(gis(host)) == 4 and pods(cluster, "nvidia-device-plugin-daemonset")


def test_default_install_publishes_a_per_node_config_and_the_operator_rewrites_its_default(cluster, host, idle):
    """migManager.config.name unset (the chart's default): mig-manager generates <node>-mig-config from the
    hardware, owned by its pod; default-mig-parted-config is only the operator's asset, rewritten on every pass."""
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator())
    idle()
    [manager] = pods(cluster, "nvidia-mig-manager")
    env = {e["name"]: e.get("value") for e in manager["spec"]["containers"][0]["env"]}
    assert env["DEFAULT_CONFIG_FILE"] == "/mig-parted-config/config-default.yaml" and "CONFIG_FILE" not in env
    node_config = cluster.get("ConfigMap", "gpu-1-mig-config", NS)
    assert node_config["metadata"]["labels"] == {"app.kubernetes.io/component": "nvidia-mig-manager",
                                                 "nvidia.com/node-name": "gpu-1"}
    [owner] = node_config["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", manager["metadata"]["name"],
                                                            manager["metadata"]["uid"])
    generated = yaml.safe_load(node_config["data"]["config.yaml"])["mig-configs"]
    assert generated["all-1g.10gb"] == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4}}]
    assert labels_of(cluster)[STATE] == "success"

    # A layout written into default-mig-parted-config is overwritten at once, and mig-manager never reads it.
    default = cluster.get("ConfigMap", "default-mig-parted-config", NS)
    assert default["metadata"]["ownerReferences"][0]["kind"] == "ClusterPolicy"
    mine = {"version": "v1", "mig-configs": {"mine": [{"devices": "all", "mig-enabled": True,
                                                       "mig-devices": {"3g.20gb": 2}}]}}
    cluster.patch("ConfigMap", "default-mig-parted-config", {"data": {"config.yaml": yaml.safe_dump(mine)}}, NS)
    idle()
    assert yaml.safe_load(cluster.get("ConfigMap", "default-mig-parted-config", NS)["data"]["config.yaml"]) == \
        seed.DEFAULT_MIG_PARTED_CONFIG
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "mine"}}})
    idle()
    assert labels_of(cluster)[STATE] == "failed"
    assert "is not in the config generated for gpu-1" in cluster.get("Node", "gpu-1")["metadata"]["annotations"][
        migmanager.LOG_ANNOTATION]
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-3g.20gb"}}})
    idle()
    assert labels_of(cluster)[STATE] == "success" and gis(host) == [(9, 0), (9, 4)]

    # A new pod: the old one's ConfigMap goes with it (owner), the new one publishes its own.
    cluster.delete("Pod", manager["metadata"]["name"], NS)
    idle()
    [new] = pods(cluster, "nvidia-mig-manager")
    owner = cluster.get("ConfigMap", "gpu-1-mig-config", NS)["metadata"]["ownerReferences"][0]
    assert owner["uid"] == new["metadata"]["uid"] != manager["metadata"]["uid"]


def test_mig_parted_applies_gpu_by_gpu(cluster, tmp_path, idle):
    path = str(tmp_path / "two.json")
    sim.create_state(path, "2xA100-SXM4-40GB")
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=path), *seed.gpu_operator())
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-3g.20gb"}}})
    idle()
    # From 2 x 3g.20gb to 4 x 1g.10gb on each GPU; the sixth GPU instance (GPU 1's second) cannot be created.
    sim.add_fault(path, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", nth=6)
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert labels_of(cluster)[STATE] == "failed"
    gpus = sim.load_state(path)["gpus"]
    assert sorted(gi["profile_id"] for gi in gpus[0]["gpu_instances"]) == [15] * 4   # stays changed
    assert gpus[1]["gpu_instances"] == [] and gpus[1]["mig"]["current"] == sim.MIG_ENABLE  # cleared, not rolled back


def test_gpu_client_shutdown_waits_scale_with_the_knob(cluster, host, monkeypatch, idle):
    monkeypatch.setattr(migmanager, "TIME_SCALE", 1 / 300)     # 5 minutes per component: 1 s
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator(),
                 seed.pod("dcgm-stuck", node="gpu-1", namespace=NS, labels={"app": "nvidia-dcgm"}))
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    labels = labels_of(cluster)
    assert labels[STATE] == "pending" and labels[DP] == PAUSED and gis(host) == []
    assert "after 1 s: dcgm-stuck" in cluster.get("Node", "gpu-1")["metadata"]["annotations"][
        migmanager.LOG_ANNOTATION]


def test_a_config_name_just_added_reaches_the_pod_late(cluster, host, monkeypatch, idle):
    monkeypatch.setattr(migmanager, "TIME_SCALE", 1 / 60)      # the kubelet's sync: 1 s
    config = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host),
                 *seed.gpu_operator(config_name="custom-mig-config", config=config))
    idle()
    added = dict(config["mig-configs"], **{name: [{"devices": "all", "mig-enabled": True,
                                                   "mig-devices": {"3g.20gb": 2}}] for name in ("new-a", "new-b")})
    cluster.patch("ConfigMap", "custom-mig-config",
                  {"data": {"config.yaml": yaml.safe_dump({"version": "v1", "mig-configs": added})}}, NS)
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "new-a"}}})
    idle()
    assert labels_of(cluster)[STATE] == "failed" and gis(host) == []
    assert "is not in ConfigMap gpu-operator/custom-mig-config (as mounted)" in cluster.get(
        "Node", "gpu-1")["metadata"]["annotations"][migmanager.LOG_ANNOTATION]
    time.sleep(migmanager.scaled(migmanager.CONFIGMAP_SYNC_SECONDS) + 0.2)
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "new-b"}}})
    idle()
    assert labels_of(cluster)[STATE] == "success" and gis(host) == [(9, 0), (9, 4)]


def test_dynamic_mig_destroys_devices_it_did_not_create(cluster, host, idle):
    assert migmanager.apply_config(host, seed.DEFAULT_MIG_PARTED_CONFIG, "all-1g.10gb")[0] == 0
    sim.add_process(host, 0, 4242, gi=sim.load_state(host)["gpus"][0]["gpu_instances"][0]["id"], ci=0)
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.dra_driver(dynamic_mig=True))
    idle()
    [pod] = cluster.list("Pod", "nvidia-dra-driver-gpu")
    assert dra.feature_gates(pod) == {"DynamicMIG=true"}
    state = sim.load_state(host)["gpus"][0]
    assert state["mig"]["current"] == sim.MIG_ENABLE
    assert len(state["gpu_instances"]) == 1  # the one with a process survives (NVML: in use)
    # Then it publishes every profile at every placement, abstract (no uuid), with shared counters (dynamic.py).
    counters, gpu_slice = sorted(cluster.list("ResourceSlice", field_selector="spec.nodeName=gpu-1"),
                                 key=lambda s: s["metadata"]["name"])
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-0-counter-set"]
    mig = [d for d in gpu_slice["spec"]["devices"] if d["attributes"]["type"] == {"string": "mig"}]
    assert mig and not any("uuid" in d["attributes"] for d in mig)
    assert gpu_slice["spec"]["pool"]["resourceSliceCount"] == 2


def test_seed_config_map_holds_the_mig_parted_config():
    objs = seed.gpu_operator("ops", config_name="mine", mig_manager=False, device_plugin=False)
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert cm["metadata"] == {"name": "mine", "namespace": "ops"}
    assert yaml.safe_load(cm["data"]["config.yaml"]) == seed.DEFAULT_MIG_PARTED_CONFIG
    policy = objs[-1]
    assert policy["spec"]["migManager"]["enabled"] is False and policy["spec"]["devicePlugin"]["enabled"] is False
    assert policy["status"]["namespace"] == "ops"
    assert migmanager.SIM_BIN.endswith(os.path.join("simulator", "bin"))


def test_gpu_cluster_labels_its_nodes_renders_its_operands_and_honours_a_pause(cluster, host, idle):
    from tests.support.kubeapi import gpucluster

    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), seed.node("cpu-1"), *seed.gpu_cluster(dynamic_mig=True))
    idle()
    deploy = dict((k, v) for k, v in labels_of(cluster).items() if k.startswith("nvidia.com/gpu.deploy."))
    assert deploy == dict.fromkeys(gpucluster.STATE_LABELS, "true")
    assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in labels_of(cluster, "cpu-1"))
    owner = cluster.get("GPUCluster", "gpu-cluster")["metadata"]["uid"]
    sets = {d["metadata"]["name"]: d for d in cluster.list("DaemonSet", NS)}
    assert sorted(sets) == ["nvidia-dcgm-dra", "nvidia-dcgm-exporter-dra", "nvidia-dra-driver-kubelet-plugin"]
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == owner for d in sets.values())
    plugin = sets["nvidia-dra-driver-kubelet-plugin"]["spec"]["template"]
    assert plugin["spec"]["nodeSelector"] == {"nvidia.com/gpu.deploy.dra-driver": "true"}
    assert plugin["metadata"]["labels"]["app.kubernetes.io/name"] == "nvidia-dra-driver"
    [pod] = [p for p in cluster.list("Pod", NS) if p["metadata"]["labels"]["app"] == "nvidia-dra-driver-kubelet-plugin"]
    assert dra.feature_gates(pod) == {"DynamicMIG=true"}
    # dra.py plays the plugin; with DynamicMIG on, dynamic.py publishes the split slices of the node's pool.
    assert any(s["spec"].get("nodeName") == "gpu-1" and s["spec"]["driver"] == "gpu.nvidia.com"
               for s in cluster.list("ResourceSlice"))

    # A pause is honoured: the operator writes "true" only over an absent or empty label.
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.deploy.dra-driver": PAUSED,
                                                            "nvidia.com/gpu.deploy.dcgm-dra": ""}}})
    idle()
    assert labels_of(cluster)["nvidia.com/gpu.deploy.dra-driver"] == PAUSED
    assert labels_of(cluster)["nvidia.com/gpu.deploy.dcgm-dra"] == "true"
    assert sorted(p["metadata"]["labels"]["app"] for p in cluster.list("Pod", NS)) == [
        "nvidia-dcgm-dra", "nvidia-dcgm-exporter-dra"]
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.deploy.dra-driver": "true"}}})
    idle()
    assert len(cluster.list("Pod", NS)) == 3
    # Without the GPUCluster its operands go with it (ownerReference cascade). The garbage
    # collector learns a new CRD's kind from discovery every 30 s (kube-controller-manager's
    # garbageCollectorController syncPeriod), and this test is not much older than its CRD.
    cluster.delete("GPUCluster", "gpu-cluster")
    cluster.wait_for(lambda: cluster.list("DaemonSet", NS) == [],
                     "the garbage collector to delete the operands", timeout=90)


def test_the_kubelet_keeps_a_running_gpu_cluster_plugins_slices_and_wipes_them_once_it_is_gone(cluster, host, idle):
    """The wipe follows the plugin, whichever chart deployed it: the GPUCluster's nvidia-dra-driver pod counts as
    much as the standalone chart's (a wipe 30 s after publishing failed a slow CI run)."""
    from tests.support.kubeapi.dynamic import WIPING_DELAY_ANNOTATION

    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_cluster())
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"annotations": {WIPING_DELAY_ANNOTATION: "0.5"}}})
    idle()
    time.sleep(2)
    assert [s["metadata"]["name"] for s in cluster.list("ResourceSlice")] == ["gpu-1-gpu.nvidia.com"]
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {"nvidia.com/gpu.deploy.dra-driver": PAUSED}}})
    idle()
    deadline = time.monotonic() + 10
    while cluster.list("ResourceSlice") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.list("ResourceSlice") == []


@pytest.mark.parametrize("api_version, kind, first, then", [
    ("nvidia.com/v1", "ClusterPolicy", [], seed.gpu_operator),
    # nvidia.com serves two versions: GPUCluster (operator v26.7's DRA stack) beside ClusterPolicy.
    ("nvidia.com/v1alpha1", "GPUCluster", seed.gpu_operator, seed.gpu_cluster)])
def test_nvidia_custom_resources_are_served_only_while_their_crds_exist(cluster, api_version, kind, first, then):
    if first:
        cluster.seed(*first())
    with pytest.raises(ResourceNotFoundError):
        dynamic(cluster).resources.get(api_version=api_version, kind=kind)
    cluster.seed(*then())
    dyn = dynamic(cluster)
    assert [o.metadata.name for o in dyn.resources.get(api_version=api_version, kind=kind).get().items] == [
        "cluster-policy" if kind == "ClusterPolicy" else "gpu-cluster"]
    assert [p.metadata.name for p in dyn.resources.get(api_version="nvidia.com/v1", kind="ClusterPolicy").get().items] \
        == ["cluster-policy"]
    assert dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice").get().items == []


def test_operand_daemonsets_follow_the_cluster_policy(cluster, admin_env, host, idle):
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator(mig_strategy="single"))
    idle()
    custom = k8s_client.CustomObjectsApi(k8s_config.new_client_from_config(cluster.control_plane.kubeconfig))
    names = sorted(ds["metadata"]["name"] for ds in cluster.list("DaemonSet", NS))
    assert names == ["gpu-feature-discovery", "nvidia-device-plugin-daemonset", "nvidia-mig-manager"]
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin-daemonset", NS)
    assert plugin["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-operator"
    [owner] = plugin["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("ClusterPolicy", "cluster-policy", True)
    assert plugin["spec"]["template"]["spec"]["nodeSelector"] == {DP: "true"}
    [pod] = pods(cluster, "nvidia-device-plugin-daemonset")
    assert {"name": "MIG_STRATEGY", "value": "single"} in pod["spec"]["containers"][0]["env"]
    assert labels_of(cluster)["nvidia.com/mig.strategy"] == "single"

    # NVIDIA's documented strategy change (kubectl JSON patch) rolls the plugin and GFD.
    subprocess.run(["kubectl", "patch", "clusterpolicies.nvidia.com/cluster-policy", "--type=json",
                    '-p=[{"op": "replace", "path": "/spec/mig/strategy", "value": "mixed"}]'],
                   env=admin_env, check=True, capture_output=True, timeout=60)
    idle()
    [new_pod] = pods(cluster, "nvidia-device-plugin-daemonset")
    assert new_pod["metadata"]["uid"] != pod["metadata"]["uid"]
    assert {"name": "MIG_STRATEGY", "value": "mixed"} in new_pod["spec"]["containers"][0]["env"]
    assert labels_of(cluster)["nvidia.com/mig.strategy"] == "mixed"  # the new GFD pod relabelled

    custom.patch_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy",
                                       {"spec": {"devicePlugin": {"enabled": False}, "migManager": {"enabled": False}}})
    idle()
    assert sorted(ds["metadata"]["name"] for ds in cluster.list("DaemonSet", NS)) == ["gpu-feature-discovery"]
    assert not pods(cluster, "nvidia-device-plugin-daemonset")
    custom.delete_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")
    # The garbage collector deletes the operands after their owner; kwok ends their pods.
    cluster.wait_for(lambda: cluster.list("DaemonSet", NS) == [] and cluster.list("Pod", NS) == [],
                     "the operands to go with the ClusterPolicy", timeout=120)


def test_with_reboot_a_mode_change_that_needs_one_reboots_and_waits_for_the_driver(
        cluster, tmp_path, monkeypatch, idle):
    monkeypatch.setattr(migmanager, "TIME_SCALE", 1 / 200)     # reboot and driver rebuild: 1.2 s
    path = str(tmp_path / "vm.json")
    sim.create_state(path, "1xA100-SXM4-40GB")
    sim.set_host(path, passthrough=True)                        # a GPU reset is refused: only a reboot applies it
    boot = sim.boot_id(path)
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=path), *seed.gpu_operator(env={"WITH_REBOOT": "true"}))
    idle()
    seen, times = record(cluster), {}

    last = [labels_of(cluster)[STATE]]

    def note(event):
        state = (event.obj["metadata"].get("labels") or {}).get(STATE)
        if state != last[0]:
            last[0], times[state] = state, time.monotonic()
    cluster.on("modified", note, kind="Node")
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert ("rebooting", PAUSED) in seen and seen[-1] == ("success", "true"), seen
    assert seen.index(("rebooting", PAUSED)) < seen.index(("pending", PAUSED), seen.index(("rebooting", PAUSED)))
    assert times["success"] - times["rebooting"] >= migmanager.scaled(
        migmanager.REBOOT_SECONDS + migmanager.DRIVER_REBUILD_SECONDS)
    assert sim.boot_id(path) != boot and len(gis(path)) == 4

    # A mode that does not take effect across the reboot either: failed after it, as the real one says.
    sim.set_host(path, mode_change_survives_reboot=False)
    del seen[:]
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-disabled"}}})
    idle()
    assert ("rebooting", PAUSED) in seen and labels_of(cluster)[STATE] == "failed"
    assert "did not take effect after rebooting" in cluster.get("Node", "gpu-1")["metadata"]["annotations"][
        migmanager.LOG_ANNOTATION]


def test_dra_plugin_publishes_at_start_and_stays_stale_until_restarted(cluster, host, idle):
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), seed.node("cpu-1"), *seed.dra_driver())
    idle()
    slice_ = cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")
    gpu = sim.load_state(host)["gpus"][0]
    assert slice_["spec"]["driver"] == "gpu.nvidia.com" and slice_["spec"]["nodeName"] == "gpu-1"
    assert slice_["spec"]["pool"] == {"name": "gpu-1", "generation": 1, "resourceSliceCount": 1}
    [device] = slice_["spec"]["devices"]
    assert device["name"] == "gpu-0" and device["attributes"]["type"] == {"string": "gpu"}
    assert device["attributes"]["uuid"] == {"string": gpu["uuid"]}
    assert cluster.list("ResourceSlice", field_selector="spec.nodeName=cpu-1") == []

    config = seed.DEFAULT_MIG_PARTED_CONFIG
    assert migmanager.apply_config(host, config, "all-balanced")[0] == 0
    assert [d["name"] for d in cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")["spec"]["devices"]] == ["gpu-0"]
    restart_dra_plugin(cluster)
    idle()
    slice_ = cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")
    assert slice_["spec"]["pool"]["generation"] == 2
    devices = {d["name"]: d for d in slice_["spec"]["devices"]}
    assert sorted(d["attributes"]["profile"]["string"] for d in devices.values()) == [
        "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    uuids = {ci["uuid"] for gi in sim.load_state(host)["gpus"][0]["gpu_instances"] for ci in gi["compute_instances"]}
    assert {d["attributes"]["uuid"]["string"] for d in devices.values()} == uuids
    assert {d["attributes"]["parentUUID"]["string"] for d in devices.values()} == {gpu["uuid"]}
    three = next(d for d in devices.values() if d["attributes"]["profile"]["string"] == "3g.20gb")
    start = next(gi["start"] for gi in sim.load_state(host)["gpus"][0]["gpu_instances"] if gi["profile_id"] == 9)
    assert three["name"] == f"gpu-0-mig-3g20gb-9-{start}" and three["capacity"]["memory"] == {"value": "19968Mi"}

    # MIG on without devices: published as nothing.
    assert migmanager.apply_config(host, config, "all-enabled")[0] == 0
    restart_dra_plugin(cluster)
    idle()
    # An empty list is left out of what the API server stores.
    assert not cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")["spec"].get("devices")


def test_operator_deploy_labels_leave_set_values_alone(cluster, idle):
    cluster.seed(
        seed.node("gpu-1", dict(GPU, **{DP: "false", GFD: "paused-for-mig-change",
                                        "nvidia.com/mig.capable": "true",
                                        "nvidia.com/gpu.deploy.mig-manager": "false"})),
        seed.node("gpu-2", dict(GPU, **{"nvidia.com/gpu.deploy.operands": "false", DP: "true"})),
        seed.node("a10-1", dict(GPU, **{"nvidia.com/gpu.product": "NVIDIA-A10"})),
        seed.node("h100-1", dict(GPU, **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                         DP: ""})),
        seed.node("cpu-1", {"nvidia.com/gpu.deploy.driver": "true"}),
    )
    idle()
    assert labels_of(cluster, "gpu-2")[DP] == "true"  # no ClusterPolicy yet: nothing happens
    cluster.seed(*seed.gpu_operator())
    idle()
    one = labels_of(cluster)
    assert (one[DP], one[GFD], one["nvidia.com/gpu.deploy.mig-manager"]) == (
        "false", "paused-for-mig-change", "false")
    assert one["nvidia.com/gpu.deploy.driver"] == "true"
    assert one["nvidia.com/gpu.deploy.container-toolkit"] == "true"
    assert one["nvidia.com/gpu.deploy.operator-validator"] == "true"
    assert one[MIG_CONFIG] == "all-disabled"  # whatever gpu.deploy.mig-manager says
    assert not [k for k in labels_of(cluster, "gpu-2") if k.startswith("nvidia.com/gpu.deploy.") and
                k != "nvidia.com/gpu.deploy.operands"]
    a10 = labels_of(cluster, "a10-1")
    assert a10[DP] == "true" and MIG_CONFIG not in a10
    assert "nvidia.com/gpu.deploy.mig-manager" not in a10
    h100 = labels_of(cluster, "h100-1")
    assert h100[DP] == h100["nvidia.com/gpu.deploy.mig-manager"] == "true"
    assert h100[MIG_CONFIG] == "all-disabled"
    assert "nvidia.com/gpu.deploy.driver" not in labels_of(cluster, "cpu-1")  # not a GPU node

    # Removing mig.config is not a trigger; a ClusterPolicy spec change is.
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: None}}})
    idle()
    assert MIG_CONFIG not in labels_of(cluster)
    cluster.patch("ClusterPolicy", "cluster-policy", {"spec": {"mig": {"strategy": "mixed"}}})
    idle()
    assert labels_of(cluster)[MIG_CONFIG] == "all-disabled"
    # config.default "" stops the default label; deleting the deploy label brings it back.
    cluster.patch("ClusterPolicy", "cluster-policy",
                  {"spec": {"migManager": {"config": {"default": ""}}}})
    idle()
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: None, DP: None}}})
    idle()
    assert MIG_CONFIG not in labels_of(cluster) and labels_of(cluster)[DP] == "true"


def test_dra_claims_of_bound_pods_are_allocated_released_and_fail_their_pod_when_the_device_goes(
        cluster, host, idle):
    assert migmanager.apply_config(host, seed.DEFAULT_MIG_PARTED_CONFIG, "all-3g.20gb")[0] == 0
    cluster.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.dra_driver(),
                 *[seed.resource_claim("c%d" % i, namespace="ml", profile="3g.20gb")
                   for i in range(3)],
                 seed.resource_claim("whole", namespace="ml", device_class="gpu.nvidia.com"),
                 *[seed.pod("p%d" % i, node="gpu-1", namespace="ml", claims=["c%d" % i])
                   for i in range(3)],
                 seed.pod("w", node="gpu-1", namespace="ml", claims=["whole"]))
    idle()

    def claims():
        cluster.stand_ins.sync()
        return dict((c["metadata"]["name"], c) for c in cluster.list("ResourceClaim", "ml"))

    names = [d["name"] for d in cluster.get("ResourceSlice", "gpu-1-gpu.nvidia.com")["spec"]["devices"]]
    now = claims()
    for i, name in enumerate(names):          # one device each, in slice order, reserved for its pod
        status = now["c%d" % i]["status"]
        [result] = status["allocation"]["devices"]["results"]
        assert result == {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-1", "device": name}
        uid = cluster.get("Pod", "p%d" % i, "ml")["metadata"]["uid"]
        assert status["reservedFor"] == [{"resource": "pods", "name": "p%d" % i, "uid": uid}]
        [term] = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == ["gpu-1"]
        # kube-scheduler's finalizer, without which the claim controller would not deallocate it
        assert now["c%d" % i]["metadata"]["finalizers"] == [dra.ALLOCATED_FINALIZER]
    # Two 3g.20gb only; no whole GPU.
    assert "allocation" not in (now["c2"].get("status") or {})
    assert "allocation" not in (now["whole"].get("status") or {})

    cluster.delete("Pod", "p0", "ml")
    # Released and deallocated (by the resource claim controller or the stand-in, whichever is
    # first; an empty reservedFor is left out of the stored object), then given to p2.
    cluster.wait_for(lambda: not (claims()["c0"].get("status") or {})
                     and not claims()["c0"]["metadata"].get("finalizers"),
                     "c0 released, deallocated and without the finalizer", timeout=60)
    cluster.wait_for(lambda: (((claims()["c2"].get("status") or {}).get("allocation") or {})
                              .get("devices") or {}).get("results", [{}])[0].get("device")
                     == names[0], "c2 allocated the device c0 gave back", timeout=60)
    # The device under p1 destroyed: p1 fails, naming it; p2 (on the other) runs on.
    assert migmanager.apply_config(host, seed.DEFAULT_MIG_PARTED_CONFIG, "all-1g.5gb")[0] == 0
    cluster.wait_for(lambda: claims() and (cluster.get("Pod", "p1", "ml").get("status") or {})
                     .get("phase") == "Failed", "p1 failed", timeout=60)
    p1 = cluster.get("Pod", "p1", "ml")["status"]
    assert p1["reason"] == "DeviceDestroyed" and names[1] in p1["message"]
