"""The Kubernetes API emulator (tests/support/kubeapi) against the real clients the roles use:
kubernetes.core modules run by ansible-playbook, helm 3.17, kubectl and the kubernetes Python client.
The last tests pin emulator semantics that those clients do not reach on their own.
"""

import json
import os
import subprocess
import sys
import threading

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

import gpuops_mig_sim as sim
from tests.support.kubeapi import ApiError, seed
from tests.support.kubeapi import patch as patches
from tests.support.kubeapi import protobuf
from tests.support.kubeapi.deviceplugin import advertise
from tests.support.playbook import run_tasks

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)
CHART = os.path.join(REPO, "tests", "support", "charts", "nvidia-device-plugin")
GPU = {"nvidia.com/gpu.present": "true"}


def node_labels(api, name):
    return api.get("Node", name)["metadata"].get("labels", {})


# ----- real clients -----------------------------------------------------------------------------

@pytest.mark.playbook
def test_kubernetes_core_labels_cordon_drain_and_pdb(kube_api, kube_env, tmp_path):
    kube_api.seed(
        seed.node("gpu-1", dict(GPU, stale="yes")), seed.node("gpu-2", GPU), seed.node("cpu-1"),
        seed.daemonset("logs"),
        seed.pod("web-1", node="gpu-1", labels={"app": "web"}, owner=("ReplicaSet", "web-5d8f"), emptydir=True),
        seed.pod("web-2", node="gpu-1", labels={"app": "web"}, owner=("ReplicaSet", "web-5d8f")),
        seed.pod("web-3", node="cpu-1", labels={"app": "web"}, owner=("ReplicaSet", "web-5d8f")),
        seed.pod("db-1", node="gpu-2", labels={"app": "db"}, owner=("ReplicaSet", "db-6c9e")),
        seed.pdb("db", {"app": "db"}, min_available=1),
    )
    label = {"kubernetes.core.k8s": {"state": "patched", "kind": "Node", "name": "gpu-1", "definition": {
        "metadata": {"labels": {"nvidia.com/mig.config": "all-1g.5gb", "stale": None}}}}}
    drain_options = {"ignore_daemonsets": True, "delete_emptydir_data": True, "wait_timeout": 10}
    results = run_tasks([
        {"name": "list gpu nodes", "kubernetes.core.k8s_info": {
            "kind": "Node", "label_selectors": ["nvidia.com/gpu.present=true"]}},
        dict(label, name="label gpu-1"),
        dict(label, name="label gpu-1 again"),
        {"name": "cordon gpu-2", "kubernetes.core.k8s_drain": {"name": "gpu-2", "state": "cordon"}},
        {"name": "drain gpu-1", "kubernetes.core.k8s_drain": {"name": "gpu-1", "delete_options": drain_options}},
        {"name": "drain gpu-2", "ignore_errors": True,
         "kubernetes.core.k8s_drain": {"name": "gpu-2", "delete_options": drain_options}},
        {"name": "uncordon gpu-1", "kubernetes.core.k8s_drain": {"name": "gpu-1", "state": "uncordon"}},
    ], kube_env, tmp_path)

    assert [n["metadata"]["name"] for n in results["list gpu nodes"]["resources"]] == ["gpu-1", "gpu-2"]

    assert results["label gpu-1"]["changed"] is True
    assert results["label gpu-1 again"]["changed"] is False
    labels = node_labels(kube_api, "gpu-1")
    assert labels["nvidia.com/mig.config"] == "all-1g.5gb" and "stale" not in labels

    drained = results["drain gpu-1"]
    assert drained["changed"] is True and "2 Pod(s) deleted from node" in drained["result"]
    assert any("Ignoring DaemonSet-managed Pods" in w for w in drained["warnings"])
    pods = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in kube_api.list("Pod")}
    assert "web-1" not in pods and "web-2" not in pods
    assert pods["web-3"] == "cpu-1"                    # other nodes are left alone
    assert sorted(pods.values()).count("gpu-1") == 1   # only the DaemonSet pod stays
    evictions = {r.path.split("/")[-2] for r in kube_api.requests if r.path.endswith("/eviction")}
    assert evictions == {"web-1", "web-2", "db-1"}
    assert not [r for r in kube_api.requests if r.method == "DELETE"]  # evicted, never deleted

    blocked = results["drain gpu-2"]
    assert blocked["failed"] is True
    assert "Failed to delete pod default/db-1" in blocked["msg"] and '"code": 429' in blocked["msg"]
    assert "disruption budget" in blocked["msg"]
    assert "db-1" in pods
    assert kube_api.get("Node", "gpu-2")["spec"]["unschedulable"] is True

    assert results["uncordon gpu-1"]["changed"] is True
    assert not kube_api.get("Node", "gpu-1")["spec"].get("unschedulable")


@pytest.mark.playbook
def test_kubernetes_core_helm_release_lifecycle(kube_api, kube_env, tmp_path):
    kube_api.seed(seed.node("gpu-1", GPU), seed.node("cpu-1"))
    seen = []  # (DaemonSet name, MIG_STRATEGY) as the chart's DaemonSets are written
    placed = set()  # nodes that got a plugin pod

    def record_daemonset(event):
        env = event.obj["spec"]["template"]["spec"]["containers"][0].get("env", [])
        strategy = next((e["value"] for e in env if e["name"] == "MIG_STRATEGY"), None)
        if (event.obj["metadata"]["name"], strategy) not in seen:
            seen.append((event.obj["metadata"]["name"], strategy))

    def record_pod(event):
        if event.obj["metadata"]["labels"].get("app.kubernetes.io/name") == "nvidia-device-plugin":
            placed.add(event.obj["spec"]["nodeName"])

    kube_api.on("added", record_daemonset, kind="DaemonSet")
    kube_api.on("modified", record_daemonset, kind="DaemonSet")
    kube_api.on("added", record_pod, kind="Pod")

    release = {"name": "nvdp", "chart_ref": CHART, "release_namespace": "nvidia-device-plugin",
               "create_namespace": True, "binary_path": os.path.join(BIN, "helm")}
    mixed = {"migStrategy": "mixed", "gfd": {"enabled": True}}
    results = run_tasks([
        {"name": "install", "kubernetes.core.helm": dict(release, release_values=mixed)},
        {"name": "install again", "kubernetes.core.helm": dict(release, release_values=mixed)},
        {"name": "upgrade", "kubernetes.core.helm": dict(release, release_values=dict(mixed, migStrategy="single"))},
        {"name": "info", "kubernetes.core.helm_info": {
            "name": "nvdp", "release_namespace": "nvidia-device-plugin", "binary_path": os.path.join(BIN, "helm")}},
        {"name": "uninstall", "kubernetes.core.helm": {
            "name": "nvdp", "release_namespace": "nvidia-device-plugin", "state": "absent",
            "binary_path": os.path.join(BIN, "helm")}},
    ], kube_env, tmp_path)

    assert results["install"]["changed"] is True
    assert results["install again"]["changed"] is False
    assert results["upgrade"]["changed"] is True
    assert str(results["upgrade"]["status"]["revision"]) == "2"
    info = results["info"]["status"]
    assert info["status"] == "deployed" and str(info["revision"]) == "2"
    assert info["values"] == {"migStrategy": "single", "gfd": {"enabled": True}}
    assert results["uninstall"]["changed"] is True

    plugin, gfd = "nvdp-nvidia-device-plugin", "nvdp-nvidia-device-plugin-gpu-feature-discovery"
    assert set(seen) == {(plugin, "mixed"), (gfd, "mixed"), ("nvdp-node-feature-discovery-worker", None),
                         (plugin, "single"), (gfd, "single")}
    assert seen.index((plugin, "mixed")) < seen.index((plugin, "single"))
    assert placed == {"gpu-1"}  # the chart's default affinity keeps the plugin off nodes without GPUs
    # helm stored its release as protobuf Secrets, decoded by the emulator, and removed them again.
    assert any(r.content_type == "application/vnd.kubernetes.protobuf" for r in kube_api.requests)
    assert kube_api.list("Secret", "nvidia-device-plugin", label_selector="owner=helm") == []
    assert kube_api.list("DaemonSet", "nvidia-device-plugin") == []
    assert kube_api.list("Pod", "nvidia-device-plugin") == []


def test_python_client_and_kubectl(kube_api, kube_env):
    kube_api.seed(seed.node("gpu-1", GPU), seed.node("cpu-1"), seed.daemonset("logs"))
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(kube_api.kubeconfig))

    assert [n.metadata.name for n in core.list_node(label_selector="nvidia.com/gpu.present=true").items] == ["gpu-1"]
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/mig.config": "all-balanced"}}})
    assert core.read_node("gpu-1").metadata.labels["nvidia.com/mig.config"] == "all-balanced"
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1").items
    assert [p.metadata.owner_references[0].kind for p in pods] == ["DaemonSet"]
    with pytest.raises(k8s_client.ApiException) as missing:
        core.read_node("gpu-9")
    assert missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"

    def kubectl(*args):
        proc = subprocess.run([os.path.join(BIN, "kubectl"), *args], env=kube_env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    listed = json.loads(kubectl("get", "nodes", "-l", "nvidia.com/mig.config=all-balanced", "-o", "json"))
    assert [n["metadata"]["name"] for n in listed["items"]] == ["gpu-1"]
    kubectl("label", "node", "cpu-1", "role=cpu")
    kubectl("label", "node", "gpu-1", "nvidia.com/mig.config-")
    assert node_labels(kube_api, "cpu-1")["role"] == "cpu"
    assert "nvidia.com/mig.config" not in node_labels(kube_api, "gpu-1")
    assert kubectl("get", "pods", "--field-selector", "spec.nodeName=cpu-1", "-o", "name").startswith("pod/logs-")


# ----- emulator semantics -----------------------------------------------------------------------

def test_strategic_merge_patch_follows_list_strategies():
    spec = {"containers": [{"name": "plugin", "image": "a:1", "env": [{"name": "A", "value": "1"}],
                            "ports": [{"containerPort": 80, "name": "http"}]},
                           {"name": "sidecar", "image": "s:1"}],
            "tolerations": [{"key": "x", "operator": "Exists"}]}
    patched = patches.strategic_merge_patch({"spec": spec, "metadata": {"finalizers": ["a"]}}, {
        "metadata": {"finalizers": ["b"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "plugin"}],
            "containers": [{"name": "plugin", "env": [{"name": "B", "value": "2"}],
                            "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                           {"name": "sidecar", "$patch": "delete"}],
            "tolerations": [{"key": "y", "operator": "Exists"}],
        }})
    plugin, = patched["spec"]["containers"]
    assert plugin["image"] == "a:1"                                        # merged by name
    assert plugin["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert plugin["ports"] == [{"containerPort": 80, "name": "http", "protocol": "TCP"}]
    assert patched["spec"]["tolerations"] == [{"key": "y", "operator": "Exists"}]  # atomic list: replaced
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    reordered = patches.strategic_merge_patch({"spec": spec}, {"spec": {
        "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "plugin"}]}})
    assert [c["name"] for c in reordered["spec"]["containers"]] == ["sidecar", "plugin"]
    assert patches.merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None}, "d": [1]}) == {"a": {"c": 2}, "d": [1]}


def test_eviction_honours_budgets_and_hooks_can_relax_them(kube_api):
    kube_api.seed(seed.node("n1"), seed.replicaset("web-5d8f", 3, labels={"app": "web"}),
                  *[seed.pod(f"web-{i}", node="n1", labels={"app": "web"}, owner=("ReplicaSet", "web-5d8f"))
                    for i in range(3)],
                  seed.pdb("web", {"app": "web"}, max_unavailable=1))
    assert kube_api.get("PodDisruptionBudget", "web")["status"]["disruptionsAllowed"] == 1
    kube_api.evict("web-0")
    budget = kube_api.get("PodDisruptionBudget", "web")["status"]
    # The ReplicaSet still wants 3 pods, so the budget is spent until a replacement is Ready.
    assert (budget["expectedPods"], budget["currentHealthy"], budget["disruptionsAllowed"]) == (3, 2, 0)

    refusals = []

    def relax_after_two(event):
        refusals.append(event.obj["metadata"]["name"])
        if len(refusals) == 2:
            kube_api.patch("PodDisruptionBudget", event.pdb["metadata"]["name"], {"spec": {"maxUnavailable": 2}})

    kube_api.on("eviction-refused", relax_after_two)
    for _attempt in range(2):
        with pytest.raises(ApiError) as refused:
            kube_api.evict("web-1")
        assert refused.value.code == 429 and refused.value.reason == "TooManyRequests"
    cause = refused.value.details["causes"][0]["message"]
    assert cause == "The disruption budget web needs 2 healthy pods and has 2 currently"
    kube_api.evict("web-1")
    assert [p["metadata"]["name"] for p in kube_api.list("Pod")] == ["web-2"]

    # A budget without minAvailable/maxUnavailable keeps the status the test writes.
    kube_api.seed(seed.pod("db-0", node="n1", labels={"app": "db"}, owner=("ReplicaSet", "db")),
                  seed.pdb("db", {"app": "db"}, disruptions_allowed=0))
    with pytest.raises(ApiError):
        kube_api.evict("db-0")
    kube_api.set_status("PodDisruptionBudget", "db", dict(kube_api.get("PodDisruptionBudget", "db")["status"],
                                                          disruptionsAllowed=1))
    kube_api.evict("db-0")
    assert kube_api.find("Pod", "db-0") is None


def test_selectors_conflicts_and_status_subresource(kube_api):
    kube_api.seed(seed.node("n1", {"app": "web", "tier": "front"}), seed.node("n2", {"app": "db"}),
                  seed.node("n3", {"app": "cache", "legacy": "1"}, unschedulable=True))

    def names(**selectors):
        return [n["metadata"]["name"] for n in kube_api.list("Node", **selectors)]

    assert names(label_selector="app in (web, db),tier!=back") == ["n1", "n2"]
    assert names(label_selector="!legacy,app notin (db)") == ["n1"]
    assert names(label_selector="tier") == ["n1"]
    assert names(field_selector="spec.unschedulable=true") == ["n3"]
    assert names(field_selector="metadata.name!=n1,spec.unschedulable!=true") == ["n2"]
    with pytest.raises(ApiError) as bad:
        kube_api.list("Node", label_selector="app in web")
    assert bad.value.code == 400

    with pytest.raises(ApiError) as exists:
        kube_api.create(seed.node("n1"))
    assert (exists.value.code, exists.value.reason) == (409, "AlreadyExists")
    stale = kube_api.get("Node", "n1")
    kube_api.patch("Node", "n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiError) as conflict:
        kube_api.replace(stale)
    assert (conflict.value.code, conflict.value.reason) == (409, "Conflict")
    with pytest.raises(ApiError) as no_namespace:
        kube_api.create(seed.pod("p", namespace="missing"))
    assert no_namespace.value.code == 404

    # Over HTTP, writes to the object leave status alone; the status subresource changes only status.
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(kube_api.kubeconfig))
    core.patch_node("n2", {"metadata": {"labels": {"y": "1"}}, "status": {"allocatable": {"cpu": "1"}}})
    assert kube_api.get("Node", "n2")["status"]["allocatable"]["cpu"] == "16"
    core.patch_node_status("n2", {"metadata": {"labels": {"z": "1"}}, "status": {"allocatable": {"cpu": "2"}}})
    node = kube_api.get("Node", "n2")
    assert node["status"]["allocatable"]["cpu"] == "2" and node["metadata"]["labels"]["y"] == "1"
    assert "z" not in node["metadata"]["labels"]


def test_daemonset_controller_follows_nodes_and_templates(kube_api):
    kube_api.seed(seed.node("n1"), seed.node("n2", taints=[{"key": "gpu", "effect": "NoSchedule"}]),
                  seed.daemonset("agent", node_selector={"role": "gpu"}))

    def agent_pods():
        return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in kube_api.list("Pod", label_selector="app=agent")}

    assert agent_pods() == {}
    kube_api.patch("Node", "n1", {"metadata": {"labels": {"role": "gpu"}}})
    kube_api.patch("Node", "n2", {"metadata": {"labels": {"role": "gpu"}}})
    assert list(agent_pods()) == ["n1"]  # n2's taint is not tolerated
    first = agent_pods()["n1"]
    kube_api.patch("Node", "n1", {"spec": {"unschedulable": True}})
    assert agent_pods() == {"n1": first}  # daemons survive a cordon
    kube_api.delete("Pod", first)
    recreated = agent_pods()["n1"]
    assert recreated != first
    kube_api.patch("DaemonSet", "agent", {"spec": {"template": {"spec": {
        "tolerations": [{"key": "gpu", "operator": "Exists"}]}}}})
    pods = agent_pods()
    assert set(pods) == {"n1", "n2"} and pods["n1"] != recreated  # the new template replaced the old pod
    status = kube_api.get("DaemonSet", "agent")["status"]
    assert status["numberReady"] == status["desiredNumberScheduled"] == 2 and status["observedGeneration"] == 2
    kube_api.patch("Node", "n1", {"metadata": {"labels": {"role": None}}})
    assert list(agent_pods()) == ["n2"]
    kube_api.delete("DaemonSet", "agent")
    assert agent_pods() == {}  # owned pods are garbage-collected
    kube_api.seed(seed.daemonset("agent", namespace="scratch"))
    kube_api.delete("Namespace", "scratch")
    assert kube_api.list("Pod", "scratch") == [] and kube_api.list("DaemonSet") == []


def test_watch_replays_from_a_resource_version_and_streams(kube_api):
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(kube_api.kubeconfig))
    since = core.list_namespaced_pod("default").metadata.resource_version
    kube_api.seed(seed.pod("early", node="n1", labels={"app": "w"}))
    threading.Timer(0.3, lambda: kube_api.delete("Pod", "early")).start()
    watcher, events = k8s_watch.Watch(), []
    for event in watcher.stream(core.list_namespaced_pod, "default", label_selector="app=w",
                                resource_version=since, timeout_seconds=20):
        events.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            watcher.stop()
    assert events == [("ADDED", "early"), ("DELETED", "early")]


def _pb_varint(value):
    out = b""
    while True:
        byte, value = value & 0x7F, value >> 7
        out += bytes([byte | (0x80 if value else 0)])
        if not value:
            return out


def _pb(number, payload):
    if isinstance(payload, int):
        return _pb_varint(number << 3) + _pb_varint(payload)
    payload = payload.encode() if isinstance(payload, str) else payload
    return _pb_varint(number << 3 | 2) + _pb_varint(len(payload)) + payload


def test_protobuf_bodies_decode_to_json():
    meta = _pb(1, "sh.helm.release.v1.nvdp.v1") + _pb(3, "gpu") + _pb(11, _pb(1, "owner") + _pb(2, "helm"))
    secret = _pb(1, meta) + _pb(2, _pb(1, "release") + _pb(2, b"\x00\xff")) + _pb(3, "helm.sh/release.v1")
    body = protobuf.MAGIC + _pb(1, _pb(1, "v1") + _pb(2, "Secret")) + _pb(2, secret)
    assert protobuf.decode(body) == {
        "apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1", "data": {"release": "AP8="},
        "metadata": {"name": "sh.helm.release.v1.nvdp.v1", "namespace": "gpu", "labels": {"owner": "helm"}}}
    options = _pb(1, 0) + _pb(2, _pb(1, "uid-1")) + _pb(4, "Background")
    body = protobuf.MAGIC + _pb(1, _pb(1, "v1") + _pb(2, "DeleteOptions")) + _pb(2, options)
    assert protobuf.decode(body) == {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                     "preconditions": {"uid": "uid-1"}, "propagationPolicy": "Background"}
    with pytest.raises(ApiError) as unsupported:
        protobuf.decode(protobuf.MAGIC + _pb(1, _pb(1, "v1") + _pb(2, "Pod")))
    assert unsupported.value.code == 415


# ----- simulated device plugin and GFD ----------------------------------------------------------

GI_1G, GI_2G, GI_3G = 0, 1, 2  # NVML_GPU_INSTANCE_PROFILE_{1,2,3}_SLICE
CI_1C, CI_2C, CI_3C = 0, 1, 2  # NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3}_SLICE
PARTITION = """
import json, sys
import pynvml
import gpuops_mig_sim
gpuops_mig_sim.install(sys.argv[1])
pynvml.nvmlInit()
for index, pairs in json.loads(sys.argv[2]).items():
    gpu = pynvml.nvmlDeviceGetHandleByIndex(int(index))
    for gi_profile, ci_profile in pairs:
        gi = pynvml.nvmlDeviceCreateGpuInstance(gpu, pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, gi_profile).id)
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, 0)
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
pynvml.nvmlShutdown()
"""


def simulated_host(path, gpus, layout):
    """A simulated host with MIG on and `layout` ({gpu index: [(GI profile, CI profile)]}) made through pynvml."""
    sim.create_state(str(path), gpus, mig="enabled")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".build", "collections"))
    subprocess.run([sys.executable, "-c", PARTITION, str(path), json.dumps(layout)], env=env, check=True,
                   timeout=60)
    return str(path)


def test_advertised_resources_and_labels_follow_the_mig_strategy(tmp_path):
    mixed_layout = simulated_host(tmp_path / "a.json", "2xA100-SXM4-40GB", {
        0: [(GI_3G, CI_3C), (GI_1G, CI_1C), (GI_1G, CI_1C), (GI_2G, CI_1C)]})  # GPU 1: MIG on, empty
    state = sim.load_state(mixed_layout)
    mixed = advertise(state, "mixed")
    # 1c.2g.10gb spans only part of its GPU instance, so mixed does not advertise it.
    assert mixed["resources"] == {"nvidia.com/mig-3g.20gb": 1, "nvidia.com/mig-1g.5gb": 2}
    assert mixed["labels"]["nvidia.com/mig-1g.5gb.count"] == "2"
    assert mixed["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert not [k for k in mixed["labels"] if "2g.10gb" in k]
    assert advertise(state, "none")["resources"] == {"nvidia.com/gpu": 2}
    invalid = advertise(state, "single")
    assert invalid["plugin_ok"] is False and invalid["resources"] == {}
    assert invalid["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"

    uniform = sim.load_state(simulated_host(tmp_path / "b.json", "2xH100-SXM5-80GB", {
        0: [(GI_3G, CI_3C)] * 2, 1: [(GI_3G, CI_3C)] * 2}))
    single = advertise(uniform, "single")
    assert single["plugin_ok"] and single["resources"] == {"nvidia.com/gpu": 4}
    assert single["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    assert single["labels"]["nvidia.com/gpu.count"] == "4" and single["labels"]["nvidia.com/mig.capable"] == "true"


def test_device_plugin_pods_publish_what_the_gpus_hold_when_they_start(kube_api, tmp_path):
    host = simulated_host(tmp_path / "gpu-1.json", "1xA100-SXM4-40GB", {0: [(GI_3G, CI_3C), (GI_1G, CI_1C)]})
    daemons = [seed.daemonset(name, namespace="nvidia", labels={"app.kubernetes.io/name": name},
                              env={"MIG_STRATEGY": "mixed"}, node_selector=GPU)
               for name in ("nvidia-device-plugin", "nvidia-device-plugin-gpu-feature-discovery")]
    kube_api.seed(seed.node("gpu-1", GPU, nvml_state=host), seed.node("cpu-1"), *daemons)

    node = kube_api.get("Node", "gpu-1")
    assert {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "1"}
    assert node["metadata"]["labels"]["nvidia.com/mig-3g.20gb.count"] == "1"
    assert "nvidia.com/mig.strategy" not in node_labels(kube_api, "cpu-1")

    sim.reboot(host)  # GPU instances do not survive a reboot...
    assert kube_api.get("Node", "gpu-1")["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "1"
    plugin, = kube_api.list("Pod", "nvidia", label_selector="app.kubernetes.io/name=nvidia-device-plugin")
    kube_api.delete("Pod", plugin["metadata"]["name"], "nvidia")  # ...and the plugin sees that on restart
    # The kubelet keeps what the plugin no longer advertises at 0 until the node restarts (k8s-device-plugin #214)...
    status = kube_api.get("Node", "gpu-1")["status"]
    assert {k: v for k, v in status["allocatable"].items() if k.startswith("nvidia.com/")} == {
        "nvidia.com/mig-3g.20gb": "0", "nvidia.com/mig-1g.5gb": "0"}
    assert status["capacity"]["nvidia.com/mig-1g.5gb"] == "0" and status["capacity"]["cpu"] == "16"
    # ...and a JSON patch of the Node's status removes it; a failed test operation changes nothing (422).
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(kube_api.kubeconfig))
    gone = [{"op": "test", "path": "/status/capacity/nvidia.com~1mig-1g.5gb", "value": "1"},
            {"op": "remove", "path": "/status/capacity/nvidia.com~1mig-1g.5gb"}]
    with pytest.raises(k8s_client.ApiException) as refused:
        core.patch_node_status("gpu-1", gone)
    assert refused.value.status == 422 and kube_api.get("Node", "gpu-1")["status"] == status
    core.patch_node_status("gpu-1", [dict(gone[0], value="0")] + gone[1:] + [
        {"op": "remove", "path": "/status/allocatable/nvidia.com~1mig-1g.5gb"}])
    status = kube_api.get("Node", "gpu-1")["status"]
    assert "nvidia.com/mig-1g.5gb" not in status["capacity"] and "nvidia.com/mig-1g.5gb" not in status["allocatable"]
    assert status["allocatable"]["nvidia.com/mig-3g.20gb"] == "0" and status["allocatable"]["cpu"] == "16"
    assert node_labels(kube_api, "gpu-1")["nvidia.com/mig-1g.5gb.count"] == "1"  # GFD has not restarted

    # migStrategy=single on a MIG-enabled GPU without instances: the plugin crash-loops, GFD says INVALID.
    for name in ("nvidia-device-plugin", "nvidia-device-plugin-gpu-feature-discovery"):
        kube_api.patch("DaemonSet", name, {"spec": {"template": {"spec": {"containers": [
            {"name": name, "env": [{"name": "MIG_STRATEGY", "value": "single"}]}]}}}}, "nvidia", "strategic")
    plugin_ds = kube_api.get("DaemonSet", "nvidia-device-plugin", "nvidia")["status"]
    assert (plugin_ds["desiredNumberScheduled"], plugin_ds["numberReady"]) == (1, 0)
    labels = node_labels(kube_api, "gpu-1")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-INVALID"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")]  # stale mixed labels are gone
    assert labels["nvidia.com/gpu.present"] == "true"                  # labels GFD does not own stay
