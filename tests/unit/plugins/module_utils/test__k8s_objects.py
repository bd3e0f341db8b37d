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


def test_configmaps_to_read_by_name_with_the_operators_config_when_it_runs():
    # "" stands for the operator's namespace; each name once.
    asked = [{"name": "a", "namespace": ""}, {"name": "b", "namespace": "x"}, {"name": "b", "namespace": "x"}]
    assert k8s.configmaps_to_read(asked, [], "gpu-operator") == {"gpu-operator": ["a"], "x": ["b"]}
    assert k8s.configmaps_to_read([], [], "gpu-operator", ["gpu-1"]) == {}
    named = {"spec": {"migManager": {"config": {"name": "custom-mig", "default": "all-disabled"}}}}
    assert k8s.configmaps_to_read(asked, [named], "nvidia", ["gpu-1"]) == {"nvidia": ["a", "custom-mig"], "x": ["b"]}
    # A ClusterPolicy that names no config: what mig-manager generates per node, and the chart's default.
    assert k8s.configmaps_to_read([], [{"spec": {}}], "gpu-operator", ["gpu-1", "gpu-2"]) == {
        "gpu-operator": ["default-mig-parted-config", "gpu-1-mig-config", "gpu-2-mig-config"]}
    # The device plugin's per-node configs, where the ClusterPolicy names them.
    plugin = {"spec": {"migManager": {"config": {"name": "custom-mig"}}, "devicePlugin": {"config": {"name": "dp"}}}}
    assert k8s.configmaps_to_read([], [plugin], "nvidia", ["gpu-1"]) == {"nvidia": ["custom-mig", "dp"]}


def test_configmaps_are_named_namespace_slash_name_and_a_bad_one_is_not_read():
    asked = ["a", "x/b", {"name": "c", "namespace": "x"}, "X/b", "a/b/c", "", None, 7, {"name": "-d"}]
    assert k8s.configmaps_to_read(asked, [], "gpu-operator") == {"gpu-operator": ["a"], "x": ["b", "c"]}
    assert k8s.configmap_ref("mig-configs/fleet.mig") == {"namespace": "mig-configs", "name": "fleet.mig"}
    assert k8s.configmap_ref("fleet") == {"namespace": "", "name": "fleet"}
    assert k8s.configmap_ref("n" * 64 + "/fleet") is None      # a namespace is a DNS label
    assert k8s.configmap_ref("x/" + "f" * 254) is None         # a name at most 253 characters


class Found:
    """What kubernetes.core's K8sService.find returns: the objects of a kind, [] where the API lacks the kind."""

    def __init__(self, objects):
        self.objects, self.asked = objects, []

    def find(self, kind, api_version, name=None, namespace=None, field_selectors=()):
        self.asked.append((kind, namespace, name) + ((tuple(field_selectors),) if field_selectors else ()))
        if isinstance(self.objects.get(kind), Exception):
            raise self.objects[kind]
        return {"resources": [o for o in self.objects.get(kind, []) if namespace in (None, o["metadata"].get("namespace"))
                              and name in (None, o["metadata"]["name"])]}


def read_params(**params):
    return dict(dict(operator=True, nodes=True, node_status=False, configmaps=[], operator_config_nodes=[]), **params)


def test_read_cluster_reads_only_what_is_asked_and_trims_it():
    service = Found({
        "ClusterPolicy": [{"metadata": {"name": "cluster-policy"}, "status": {"namespace": "nvidia"},
                           "spec": {"migManager": {"config": {"name": "cm"}}}}],
        "DaemonSet": [daemonset("logs"), dict(daemonset("nvidia-dra-driver-kubelet-plugin"), status={"x": 1})],
        "Node": [{"metadata": {"name": "gpu-1", "managedFields": [{}]}, "status": {"images": []}}],
        "ConfigMap": [{"metadata": {"name": "cm", "namespace": "nvidia"}},
                      {"metadata": {"name": "other", "namespace": "nvidia"}}]})
    read = k8s.read_cluster(service, read_params())
    assert read["operator_namespace"] == "nvidia"
    assert [d["metadata"]["name"] for d in read["daemonsets"]] == ["nvidia-dra-driver-kubelet-plugin"]
    assert "status" not in read["daemonsets"][0] and read["nodes"] == [{"metadata": {"name": "gpu-1"}}]
    assert read["configmaps"] == {"nvidia": [{"metadata": {"name": "cm", "namespace": "nvidia"}}]}
    assert ("ConfigMap", "nvidia", "cm") in service.asked
    service = Found({"ClusterPolicy": [{"metadata": {"name": "p"}}]})
    read = k8s.read_cluster(service, read_params(operator=False, nodes=False, configmaps=[{"name": "x", "namespace": ""}]))
    assert read == {"configmaps": {"gpu-operator": []}, "operator_namespace": "gpu-operator", "leases": {}}
    assert service.asked == [("ConfigMap", "gpu-operator", "x")]


def test_read_cluster_reads_the_nodes_leases_by_name():
    lease = {"metadata": {"name": "gpuops-mig-gpu-1", "namespace": "gpuops"}}
    service = Found({"Lease": [lease, {"metadata": {"name": "gpuops-mig-gpu-9", "namespace": "gpuops"}}]})
    read = k8s.read_cluster(service, read_params(operator=False, nodes=False, lease_namespace="gpuops",
                                                 leases=["gpuops-mig-gpu-1", "gpuops-mig-gpu-2"]))
    assert read["leases"] == {"gpuops-mig-gpu-1": lease}
    assert sorted(service.asked) == [("Lease", "gpuops", "gpuops-mig-gpu-1"), ("Lease", "gpuops", "gpuops-mig-gpu-2")]


def test_read_cluster_never_lists_configmaps():
    service = Found({"ClusterPolicy": [{"metadata": {"name": "p"}, "spec": {}}],
                     "ConfigMap": [{"metadata": {"name": "aws-auth", "namespace": "kube-system"}},
                                   {"metadata": {"name": "gpu-1-mig-config", "namespace": "gpu-operator"}}]})
    read = k8s.read_cluster(service, read_params(nodes=False, operator_config_nodes=["gpu-1"],
                                                 configmaps=[{"name": "fleet", "namespace": "kube-system"}]))
    assert read["configmaps"] == {"gpu-operator": [{"metadata": {"name": "gpu-1-mig-config", "namespace": "gpu-operator"}}],
                                  "kube-system": []}
    assert all(name for kind, _namespace, name in service.asked if kind == "ConfigMap")


DRA_SLICE = {"metadata": {"name": "gpu-1-gpu.nvidia.com", "managedFields": [{}]},
             "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-1", "pool": {"name": "gpu-1", "generation": 1},
                      "devices": [{"name": "gpu-0-mig-1g10gb-19-0", "attributes": {"uuid": {"string": "MIG-a"}}}]}}
DRA_RESULT = {"request": "mig", "driver": "gpu.nvidia.com", "pool": "gpu-1", "device": "gpu-0-mig-1g10gb-19-0"}
DRA_CLAIM = {"metadata": {"name": "train", "namespace": "ml"},
             "status": {"allocation": {"devices": {"results": [DRA_RESULT]}},
                        "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "u1"}]}}


def test_read_cluster_maps_the_dra_claims_of_the_nodes_the_driver_serves():
    service = Found({"ResourceSlice": [DRA_SLICE], "ResourceClaim": [DRA_CLAIM]})
    read = k8s.read_cluster(service, read_params(operator=False, nodes=False, dra_nodes=["gpu-1", "gpu-2"]))
    assert list(read["dra_allocations"]) == ["gpu-1"]      # gpu-2: no slice, no claim there
    assert [(a["device_uuid"], a["pod"]) for a in read["dra_allocations"]["gpu-1"]["allocations"]] == [("MIG-a", "train-0")]
    assert ("ResourceSlice", None, None, ("spec.driver=gpu.nvidia.com",)) in service.asked
    assert "dra_allocations" not in k8s.read_cluster(Found({}), read_params(operator=False, nodes=False))


def test_read_cluster_says_why_when_the_api_refuses_the_claims():
    refused = RuntimeError("Forbidden: resourceclaims.resource.k8s.io is forbidden")
    service = Found({"ResourceSlice": [DRA_SLICE], "ResourceClaim": refused})
    read = k8s.read_cluster(service, read_params(operator=False, nodes=False, dra_nodes=["gpu-1", "gpu-2"]))
    for node in ("gpu-1", "gpu-2"):      # whether gpu-2 is served cannot be told: its rollout drains the node
        assert read["dra_allocations"][node]["allocations"] is None
        assert read["dra_allocations"][node]["allocations_error"].startswith(node + ": the ResourceSlices and ")
        assert "forbidden" in read["dra_allocations"][node]["allocations_error"]
    # The DaemonSets read, and none runs NVIDIA's DRA kubelet plugin: a refusal is a cluster without the driver.
    service = Found({"ResourceSlice": refused, "DaemonSet": [daemonset("logs")]})
    read = k8s.read_cluster(service, read_params(nodes=False, dra_nodes=["gpu-1"]))
    assert read["dra_allocations"] == {}
