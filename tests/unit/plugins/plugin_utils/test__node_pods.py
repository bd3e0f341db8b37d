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
