"""What the rollout keeps of Kubernetes objects, and which DaemonSet is NVIDIA's DRA kubelet plugin."""

from ansible_collections.gpuops.mig.plugins.module_utils import _k8s_objects as k8s


def daemonset(name, pod_labels=None):
    return {"metadata": {"name": name, "namespace": "x"},
            "spec": {"template": {"metadata": {"labels": pod_labels or {}}, "spec": {}}}}


def test_dra_kubelet_plugin_by_pod_label_or_name():
    assert k8s.is_dra_kubelet_plugin(daemonset("gpus", {"app.kubernetes.io/name": k8s.DRA_APP}))
    assert k8s.is_dra_kubelet_plugin(daemonset("nvidia-dra-driver-kubelet-plugin"))
    assert k8s.is_dra_kubelet_plugin(daemonset("dra-driver-nvidia-gpu-kubelet-plugin"))
    assert not k8s.is_dra_kubelet_plugin(daemonset("nvidia-device-plugin-daemonset", {"app": "nvidia-device-plugin"}))
    assert not k8s.is_dra_kubelet_plugin(daemonset("dra-driver-nvidia-gpu-controller"))
    assert not k8s.is_dra_kubelet_plugin({"metadata": {"name": "bare"}})


def test_trimmed_drops_managed_fields_and_optionally_status_without_touching_the_original():
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "labels": {"a": "b"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"unschedulable": True}, "status": {"images": [{"names": ["x"]}]}}
    assert k8s.trimmed(node, keep_status=False) == {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {"a": "b"}},
        "spec": {"unschedulable": True}}
    assert k8s.trimmed(node)["status"] == node["status"]
    assert "managedFields" in node["metadata"] and "status" in node
