"""The emulator's GPU Operator, mig-manager and DRA kubelet plugin (tests/support/kubeapi operator.py,
migmanager.py, dra.py) through the clients the roles use: kubernetes.core, the kubernetes Python client
and kubectl, against simulated GPU hosts (gpuops_mig_sim). The rest of these tests run on the real
control plane in test_standins_operator.py; these still rely on the emulator answering at once
(hooks that see the old object, GC and DaemonSet pods without delay) and move there next."""


import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import dynamic as k8s_dynamic

import gpuops_mig_sim as sim
from test_standins_operator import labels_of, pods
from tests.support.kubeapi import allocations, migmanager, seed

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


@pytest.fixture
def idle(kube_api):
    """Wait for the mig-manager workers before the emulator stops."""
    yield lambda: migmanager.wait_idle(kube_api, 60)
    migmanager.wait_idle(kube_api, 60)


def core_api(api):
    return k8s_client.CoreV1Api(k8s_config.new_client_from_config(api.kubeconfig))


def record(api):
    """(mig.config.state, device-plugin deploy label) after every change of either."""
    seen = []

    def hook(event):
        old, new = (event.old or {}).get("metadata", {}).get("labels", {}), event.obj["metadata"].get("labels", {})
        if (old.get(STATE), old.get(DP)) != (new.get(STATE), new.get(DP)):
            seen.append((new.get(STATE), new.get(DP)))
    api.on("modified", hook, kind="Node")
    return seen


def dynamic(api):
    return k8s_dynamic.DynamicClient(k8s_config.new_client_from_config(api.kubeconfig))


def test_mig_manager_delay_knob_and_client_daemonsets(kube_api, host, idle):
    """gpu.deploy.client (operator v26.7): a DRA plugin selecting it is bounced across the change."""
    kube_api.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.gpu_operator(),
                  *seed.dra_driver(node_selector={"nvidia.com/gpu.deploy.client": "true"}))
    idle()
    assert [d["name"] for d in kube_api.get("ResourceSlice", "gpu-1-gpu.nvidia.com")["spec"]["devices"]] == ["gpu-0"]
    kube_api.patch("Node", "gpu-1", {"metadata": {"annotations": {migmanager.DELAY_ANNOTATION: "1"},
                                                  "labels": {MIG_CONFIG: "all-1g.10gb"}}})
    with pytest.raises(TimeoutError):
        migmanager.wait_idle(kube_api, 1.5)
    assert labels_of(kube_api)[STATE] == "pending"
    idle()
    assert labels_of(kube_api)["nvidia.com/gpu.deploy.client"] == "true"
    slice_ = kube_api.get("ResourceSlice", "gpu-1-gpu.nvidia.com")
    assert slice_["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in slice_["spec"]["devices"]] == [f"gpu-0-mig-1g10gb-15-{s}" for s in (0, 2, 4, 6)]


def test_a_failure_after_a_completed_run_leaves_the_gpu_clients_paused(kube_api, host, idle):
    config = {"version": "v1", "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 4}}],
        "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 8}}]}}
    kube_api.seed(seed.node("gpu-1", dict(GPU, **{GFD: "false", "nvidia.com/mig.capable": "true"}), nvml_state=host),
                  *seed.gpu_operator(config_name="custom-mig-config", config=config))
    idle()
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "all-1g.10gb"}}})
    idle()
    assert labels_of(kube_api)[STATE] == "success" and labels_of(kube_api)[DP] == "true"
    # NoRestartK8sDaemonsetsOnExit is set for good in this pod: its next failure restores nothing.
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: "too-many"}}})
    idle()
    labels = labels_of(kube_api)
    assert labels[STATE] == "failed" and labels[DP] == PAUSED and labels[GFD] == "false"
    assert not pods(kube_api, "nvidia-device-plugin-daemonset")
    assert "left as they are" in kube_api.get("Node", "gpu-1")["metadata"]["annotations"][migmanager.LOG_ANNOTATION]
    # A new pod (a new process) runs the label again and, failing, puts them back.
    [manager] = pods(kube_api, "nvidia-mig-manager")
    kube_api.delete("Pod", manager["metadata"]["name"], NS)
    idle()
    assert labels_of(kube_api)[STATE] == "failed" and labels_of(kube_api)[DP] == "true"


def test_dra_claims_of_bound_pods_are_allocated_released_and_fail_their_pod_when_the_device_goes(kube_api, host, idle):
    assert migmanager.apply_config(host, seed.DEFAULT_MIG_PARTED_CONFIG, "all-3g.20gb")[0] == 0
    kube_api.seed(seed.node("gpu-1", GPU, nvml_state=host), *seed.dra_driver(),
                  *[seed.resource_claim("c%d" % i, namespace="ml", profile="3g.20gb") for i in range(3)],
                  seed.resource_claim("whole", namespace="ml", device_class="gpu.nvidia.com"),
                  *[seed.pod("p%d" % i, node="gpu-1", namespace="ml", claims=["c%d" % i]) for i in range(3)],
                  seed.pod("w", node="gpu-1", namespace="ml", claims=["whole"]))
    names = [d["name"] for d in kube_api.get("ResourceSlice", "gpu-1-gpu.nvidia.com")["spec"]["devices"]]
    claims = dict((c["metadata"]["name"], c.get("status") or {}) for c in kube_api.list("ResourceClaim", "ml"))
    for i, name in enumerate(names):          # one device each, in slice order, reserved for its pod
        [result] = claims["c%d" % i]["allocation"]["devices"]["results"]
        assert result == {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-1", "device": name}
        assert claims["c%d" % i]["reservedFor"] == [
            {"resource": "pods", "name": "p%d" % i, "uid": kube_api.get("Pod", "p%d" % i, "ml")["metadata"]["uid"]}]
        assert claims["c%d" % i]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] \
            == ["gpu-1"]
    assert "allocation" not in claims["c2"] and "allocation" not in claims["whole"]   # two 3g.20gb only; no whole GPU
    kube_api.delete("Pod", "p0", "ml")
    assert kube_api.get("ResourceClaim", "c0", "ml")["status"] == {"reservedFor": []}
    assert kube_api.get("ResourceClaim", "c2", "ml")["status"]["allocation"]["devices"]["results"][0]["device"] == names[0]
    # The device under p1 destroyed: p1 fails, naming it; p2 (on the other) runs on.
    assert migmanager.apply_config(host, seed.DEFAULT_MIG_PARTED_CONFIG, "all-1g.5gb")[0] == 0
    allocations.sync(kube_api)
    p1 = kube_api.get("Pod", "p1", "ml")["status"]
    assert p1["phase"] == "Failed" and p1["reason"] == "DeviceDestroyed" and names[1] in p1["message"]


def test_operator_deploy_labels_leave_set_values_alone(kube_api, idle):
    kube_api.seed(
        seed.node("gpu-1", dict(GPU, **{DP: "false", GFD: "paused-for-mig-change", "nvidia.com/mig.capable": "true",
                                        "nvidia.com/gpu.deploy.mig-manager": "false"})),
        seed.node("gpu-2", dict(GPU, **{"nvidia.com/gpu.deploy.operands": "false", DP: "true"})),
        seed.node("a10-1", dict(GPU, **{"nvidia.com/gpu.product": "NVIDIA-A10"})),
        seed.node("h100-1", dict(GPU, **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", DP: ""})),
        seed.node("cpu-1", {"nvidia.com/gpu.deploy.driver": "true"}),
    )
    assert labels_of(kube_api, "gpu-2")[DP] == "true"  # no ClusterPolicy yet: nothing happens
    kube_api.seed(*seed.gpu_operator())
    one = labels_of(kube_api)
    assert (one[DP], one[GFD], one["nvidia.com/gpu.deploy.mig-manager"]) == ("false", "paused-for-mig-change", "false")
    assert one["nvidia.com/gpu.deploy.driver"] == one["nvidia.com/gpu.deploy.container-toolkit"] == "true"
    assert one["nvidia.com/gpu.deploy.operator-validator"] == "true"
    assert one[MIG_CONFIG] == "all-disabled"  # whatever gpu.deploy.mig-manager says
    assert not [k for k in labels_of(kube_api, "gpu-2") if k.startswith("nvidia.com/gpu.deploy.") and
                k != "nvidia.com/gpu.deploy.operands"]
    a10 = labels_of(kube_api, "a10-1")
    assert a10[DP] == "true" and "nvidia.com/gpu.deploy.mig-manager" not in a10 and MIG_CONFIG not in a10
    h100 = labels_of(kube_api, "h100-1")
    assert h100[DP] == h100["nvidia.com/gpu.deploy.mig-manager"] == "true" and h100[MIG_CONFIG] == "all-disabled"
    assert "nvidia.com/gpu.deploy.driver" not in labels_of(kube_api, "cpu-1")  # not a GPU node

    # Removing mig.config is not a trigger; a ClusterPolicy spec change is.
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: None}}})
    assert MIG_CONFIG not in labels_of(kube_api)
    kube_api.patch("ClusterPolicy", "cluster-policy", {"spec": {"mig": {"strategy": "mixed"}}})
    assert labels_of(kube_api)[MIG_CONFIG] == "all-disabled"
    # config.default "" stops the default label; deleting the deploy label brings it back.
    kube_api.patch("ClusterPolicy", "cluster-policy", {"spec": {"migManager": {"config": {"default": ""}}}})
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {MIG_CONFIG: None, DP: None}}})
    assert MIG_CONFIG not in labels_of(kube_api) and labels_of(kube_api)[DP] == "true"
