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


def test_operator_namespace_from_the_cluster_policy_status_else_the_default():
    assert k8s.operator_namespace([]) == "gpu-operator"
    assert k8s.operator_namespace([{"status": {}}, {"status": {"namespace": "nvidia"}}]) == "nvidia"


def test_configmap_namespaces_each_once_with_the_operators_when_it_runs():
    # "" stands for the operator's namespace; with a ClusterPolicy that namespace is read anyway.
    assert k8s.configmap_namespaces(["", "b", "b"], [], "gpu-operator") == ["b", "gpu-operator"]
    assert k8s.configmap_namespaces(["b"], [{"status": {"namespace": "nvidia"}}], "nvidia") == ["b", "nvidia"]
    assert k8s.configmap_namespaces([], [], "gpu-operator") == []


class Found:
    """What kubernetes.core's K8sService.find returns: the objects of a kind, [] where the API lacks the kind."""

    def __init__(self, objects):
        self.objects, self.asked = objects, []

    def find(self, kind, api_version, namespace=None):
        self.asked.append((kind, namespace))
        return {"resources": [o for o in self.objects.get(kind, []) if namespace in (None, o["metadata"].get("namespace"))]}


def test_read_cluster_reads_only_what_is_asked_and_trims_it():
    service = Found({
        "ClusterPolicy": [{"metadata": {"name": "cluster-policy"}, "status": {"namespace": "nvidia"}}],
        "DaemonSet": [daemonset("logs"), dict(daemonset("nvidia-dra-driver-kubelet-plugin"), status={"x": 1})],
        "Node": [{"metadata": {"name": "gpu-1", "managedFields": [{}]}, "status": {"images": []}}],
        "ConfigMap": [{"metadata": {"name": "cm", "namespace": "nvidia"}}]})
    read = k8s.read_cluster(service, dict(operator=True, nodes=True, node_status=False, configmap_namespaces=[]))
    assert read["operator_namespace"] == "nvidia"
    assert [d["metadata"]["name"] for d in read["daemonsets"]] == ["nvidia-dra-driver-kubelet-plugin"]
    assert "status" not in read["daemonsets"][0] and read["nodes"] == [{"metadata": {"name": "gpu-1"}}]
    assert list(read["configmaps"]) == ["nvidia"]
    service = Found({"ClusterPolicy": [{"metadata": {"name": "p"}}]})
    read = k8s.read_cluster(service, dict(operator=False, nodes=False, node_status=False, configmap_namespaces=[""]))
    assert read == {"configmaps": {"gpu-operator": []}, "operator_namespace": "gpu-operator"}
    assert service.asked == [("ConfigMap", "gpu-operator")]
