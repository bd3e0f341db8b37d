"""Which pods of a node the mig_node role's steps touch (plugins/plugin_utils/_node_pods.py)."""

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_pods as pods


def pod(name, limits=None, owner=None, labels=None, annotations=None, init=False, phase=None, namespace="ml"):
    container = {"name": "c", "resources": {"limits": limits} if limits else {}}
    spec = {"containers": [] if init else [container], "initContainers": [container] if init else None}
    meta = {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations}
    if owner:
        meta["ownerReferences"] = [{"kind": owner}]
    out = {"metadata": meta, "spec": spec}
    if phase:
        out["status"] = {"phase": phase}
    return out


NODE_PODS = [
    pod("train", {"nvidia.com/mig-1g.5gb": 1}, owner="ReplicaSet"),
    pod("init-gpu", {"nvidia.com/gpu": 1}, init=True),
    pod("web", {"cpu": "1"}, owner="ReplicaSet"),
    pod("plugin", {"nvidia.com/gpu": 1}, owner="DaemonSet", labels={"app.kubernetes.io/name": "nvidia-device-plugin"}),
    pod("static", annotations={"kubernetes.io/config.mirror": "x"}),
]


def names(refs):
    return [r["metadata"]["name"] for r in refs]


def test_a_drain_evicts_all_but_daemonset_and_mirror_pods_or_only_gpu_pods():
    assert names(pods.pods_to_evict(NODE_PODS, False, "gpuops.mig/evict")) == ["train", "init-gpu", "web"]
    chosen = pods.pods_to_evict(NODE_PODS, True, "gpuops.mig/evict")
    assert names(chosen) == ["train", "init-gpu"]
    assert chosen[0] == {"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "train", "namespace": "ml", "labels": {"gpuops.mig/evict": "true"}}}
    assert pods.pods_to_evict(None, True, "x") == []
    # A pod with ResourceClaims may hold a GPU through NVIDIA's DRA driver: a GPU pod for the drain.
    claimed = dict(pod("dra-train", owner="ReplicaSet"))
    claimed["spec"] = dict(claimed["spec"], resourceClaims=[{"name": "gpu", "resourceClaimName": "train"}])
    evicted = names(pods.pods_to_evict(NODE_PODS + [claimed], True, "gpuops.mig/evict"))
    assert evicted == ["train", "init-gpu", "dra-train"]


def test_plugin_pods_match_any_selector_once():
    selectors = ["app.kubernetes.io/name=nvidia-device-plugin", "app=nvidia-device-plugin", "broken"]
    assert pods.plugin_pods(NODE_PODS, selectors) == [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin", "namespace": "ml"}}]


def test_smoke_pods_one_per_resource_and_the_failure_names_each():
    smoke = pods.smoke_pods(["nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.5gb"], "gpu-1", "cuda", ["true"], "default",
                            "gpuops.mig/smoke-test")
    assert [p["metadata"]["name"] for p in smoke] == ["gpuops-mig-smoke-gpu-1-1", "gpuops-mig-smoke-gpu-1-2"]
    assert smoke[0]["spec"]["containers"][0] == {"name": "smoke", "image": "cuda", "command": ["true"],
                                                 "resources": {"limits": {"nvidia.com/mig-1g.5gb": 1}}}
    assert smoke[0]["spec"]["nodeName"] == "gpu-1" and smoke[0]["metadata"]["labels"] == {"gpuops.mig/smoke-test": "gpu-1"}
    assert "command" not in pods.smoke_pods(["r"], "n", "i", [], "d", "l")[0]["spec"]["containers"][0]
    done = [dict(smoke[0], status={"phase": "Succeeded"}), smoke[1]]
    assert pods.smoke_failure(done, "gpu-1", "cuda", 60) == (
        "gpu-1: smoke workloads (cuda) did not succeed within 60 s: nvidia.com/mig-1g.5gb (gpuops-mig-smoke-gpu-1-1): "
        "Succeeded; nvidia.com/mig-2g.10gb (gpuops-mig-smoke-gpu-1-2): Pending")
    assert pods.smoke_failure([], "gpu-1", "cuda", 60).endswith("none started")


# -- which pods a change evicts -----------------------------------------------------

import pytest  # noqa: E402

RUNNING = {"phase": "Running"}


def gpu_pod(name, phase="Running", owner="ReplicaSet"):
    out = pod(name, {"nvidia.com/mig-1g.5gb": 1}, owner=owner)
    out["status"] = {"phase": phase}
    return out


def alloc(name, uuid):
    return {"device_uuid": uuid, "namespace": "ml", "pod": name, "container": "c", "resource": "nvidia.com/mig-1g.5gb"}


WINDOW_PODS = [gpu_pod("a"), gpu_pod("b"), gpu_pod("c"), gpu_pod("fresh"), gpu_pod("done", "Succeeded"),
               pod("web", {"cpu": "1"}, owner="ReplicaSet"), gpu_pod("agent", owner="DaemonSet")]
INFO = {"allocations_source": "podresources", "allocations_error": None,
        "allocations": [alloc("a", "MIG-a"), alloc("b", "MIG-b"), alloc("c", "MIG-c")],
        "evictions": {"drain_node": False, "evicts_nothing": False,
                      "pods": [{"pod": "ml/b", "reasons": [{"reason": "device destroyed", "gpu": 0, "uuid": "MIG-b"}]}]}}


@pytest.mark.parametrize("setting, mode", [(True, "devices"), ("true", "devices"), ("devices", "devices"),
                                           ("node", "node"), (False, "none"), ("none", "none"), ("NO", "none")])
def test_drain_modes(setting, mode):
    assert pods.drain_mode(setting) == mode


def test_an_unknown_drain_mode_is_refused():
    with pytest.raises(ValueError, match="mig_node_drain must be devices, node or none"):
        pods.drain_mode("gpus")


def test_devices_evicts_the_pods_whose_devices_go_and_gpu_pods_the_map_lacks():
    out = pods.drain_plan(WINDOW_PODS, "devices", INFO, False, "gpuops.mig/evict")
    assert out["mode"] == "devices" and out["why"] == ""
    assert names(out["evict"]) == ["b", "fresh"]
    assert out["pods"][0] == {"pod": "ml/b", "reasons": INFO["evictions"]["pods"][0]["reasons"]}
    assert out["pods"][1]["reasons"][0]["reason"] == "device unknown"
    idle = dict(INFO, evictions={"pods": [], "drain_node": False})
    assert names(pods.drain_plan(WINDOW_PODS[:3], True, idle, False, "x")["evict"]) == []


def test_devices_falls_back_to_the_whole_node_drain_and_says_why():
    unknown = dict(INFO, allocations_source=None, allocations_error="no socket at /var/lib/kubelet/pod-resources/kubelet.sock")
    out = pods.drain_plan(WINDOW_PODS, "devices", unknown, True, "x")
    assert out["mode"] == "node" and "no socket at" in out["why"]
    assert names(out["evict"]) == ["a", "b", "c", "fresh", "done"]
    reboot = dict(INFO, evictions={"pods": [], "drain_node": True})
    out = pods.drain_plan(WINDOW_PODS, "devices", reboot, False, "x")
    assert out["why"] == "the change reboots the node" and "web" in names(out["evict"])
    assert pods.drain_plan(WINDOW_PODS, "node", INFO, True, "x")["why"] == ""
    assert pods.drain_plan(WINDOW_PODS, False, INFO, True, "x") == {
        "mode": "none", "why": "", "evict": [], "pods": [],
        "text": "no drain (mig_node_drain is none)"}


def test_a_whole_node_drain_the_preview_chose_keeps_the_previews_reason():
    """The window's plan is given the preview's drain: its reason, not "mig_node_drain is node"."""
    manager = "the GPU Operator's mig-manager recreates every MIG device of a GPU it changes"
    out = pods.drain_plan(WINDOW_PODS, {"mode": "node", "why": manager}, INFO, True, "x")
    assert out["mode"] == "node" and out["why"] == manager
    assert {r["detail"] for p in out["pods"] for r in p["reasons"]} == {manager}
    asked = pods.drain_plan(WINDOW_PODS, {"mode": "node", "why": ""}, INFO, True, "x")
    assert {r["detail"] for p in asked["pods"] for r in p["reasons"]} == {"mig_node_drain is node"}
    kept = pods.drain_plan(WINDOW_PODS, {"mode": "devices", "why": ""}, INFO, False, "x")
    assert kept == pods.drain_plan(WINDOW_PODS, "devices", INFO, False, "x")


def test_kept_pods_must_run_on_with_their_devices():
    before = INFO["allocations"]
    after = [alloc("a", "MIG-a"), alloc("c", "MIG-c2")]
    now = [gpu_pod("a"), gpu_pod("c")]
    assert pods.kept_pods_problems(before, after, ["ml/b"], now) == ["ml/c held MIG-c and now holds MIG-c2"]
    assert pods.kept_pods_problems(before, before, [], [gpu_pod("a"), gpu_pod("b", "Failed")]) == [
        "ml/b, kept on its devices, is Failed", "ml/c, kept on its devices, is gone"]
    assert pods.kept_pods_problems(before, before[:1], ["ml/b", "ml/c"], now) == []
    assert pods.kept_pods_problems(before, None, ["ml/b"], now) == [
        "which pod holds which MIG device could not be read after the change, so ml/a, ml/c cannot be checked"]
    assert pods.kept_pods_problems(before, None, ["ml/a", "ml/b", "ml/c"], now) == []


def test_the_drain_plan_in_words():
    plan = pods.drain_plan(WINDOW_PODS, "devices", INFO, False, "x", "n1")
    assert plan["text"] == ("n1: evicting ml/b (device destroyed), ml/fresh (device unknown); "
                            "every other pod runs on with its devices")
    idle = dict(INFO, evictions={"pods": [], "drain_node": False})
    assert pods.drain_plan(WINDOW_PODS[:3], "devices", idle, False, "x", "n1")["text"] == (
        "n1: no pod holds a MIG device that goes: nothing is evicted")
    reboot = dict(INFO, evictions={"pods": [], "drain_node": True})
    assert pods.drain_plan([], "devices", reboot, False, "x", "n1")["text"] == (
        "n1: whole-node drain (the change reboots the node): no pod to evict")
    assert pods.drain_plan([], "none", INFO, False, "x", "n1")["text"] == (
        "n1: no drain (mig_node_drain is none)")
    assert pods.drain_plan([], "devices", reboot, False, "x")["text"] == (
        "whole-node drain (the change reboots the node): no pod to evict")


def test_the_preview_says_which_pods_go_or_why_the_whole_node_drains():
    out = pods.drain_preview(True, INFO)
    assert out["mode"] == "devices" and out["text"] == "evicts 1 pod(s): ml/b (device destroyed)"
    idle = pods.drain_preview("devices", dict(INFO, evictions={"pods": [], "drain_node": False}))
    assert idle["text"] == "evicts no pod (only MIG devices no pod holds change)"
    assert pods.drain_preview("devices", INFO, "mig-manager")["text"] == (
        "the whole node is drained (the GPU Operator's mig-manager recreates every MIG device of a GPU it changes)")
    unknown = pods.drain_preview("devices", {"allocations_error": "grpcio is not installed"})
    assert unknown["mode"] == "node" and "grpcio is not installed" in unknown["text"]
    assert pods.drain_preview("node", INFO)["text"] == "the whole node is drained"
    assert pods.drain_preview("none", INFO) == {"mode": "none", "why": "", "pods": [],
                                                "text": "no drain (mig_node_drain is none)"}
