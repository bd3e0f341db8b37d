"""The emulator's GPU Operator, mig-manager and DRA kubelet plugin (tests/support/kubeapi/operator.py)."""

import time

import gpuops_mig_sim as sim
from tests.support.kubeapi import operator, seed

STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
DEPLOY = "nvidia.com/gpu.deploy."


def gpu_node(kube_api, tmp_path, name="gpu-1", gpus="1xH100-SXM5-80GB", labels=None, **state):
    path = str(tmp_path / ("%s.json" % name))
    sim.create_state(path, gpus, seed=name, **state)
    kube_api.seed(seed.node(name, dict({"nvidia.com/gpu.present": "true"}, **(labels or {})), nvml_state=path))
    return path


def labels(kube_api, name="gpu-1"):
    return kube_api.get("Node", name)["metadata"]["labels"]


def wait_for(check, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def devices(path):
    return sorted(gi["profile_id"] for gpu in sim.load_state(path)["gpus"] for gi in gpu["gpu_instances"])


def test_operator_labels_nodes_and_runs_its_operands(kube_api, tmp_path):
    gpu_node(kube_api, tmp_path, labels={DEPLOY + "device-plugin": "false"})
    kube_api.seed(*seed.gpu_operator(mig_strategy="mixed"))
    node = labels(kube_api)
    assert node[DEPLOY + "device-plugin"] == "false"                 # a user's false stays
    assert node[DEPLOY + "gpu-feature-discovery"] == "true" and node[DEPLOY + "mig-manager"] == "true"
    assert node[CONFIG] == "all-disabled"                            # the operator's default
    names = sorted(d["metadata"]["name"] for d in kube_api.list("DaemonSet", namespace="gpu-operator"))
    assert names == ["gpu-feature-discovery", "nvidia-device-plugin-daemonset", "nvidia-mig-manager"]
    pods = [p["metadata"]["labels"]["app"] for p in kube_api.list("Pod", namespace="gpu-operator")]
    assert "nvidia-device-plugin-daemonset" not in pods and "nvidia-mig-manager" in pods
    operator.wait_idle(kube_api)

    kube_api.patch("ClusterPolicy", "cluster-policy", {"spec": {"migManager": {"enabled": False}}})
    names = sorted(d["metadata"]["name"] for d in kube_api.list("DaemonSet", namespace="gpu-operator"))
    assert names == ["gpu-feature-discovery", "nvidia-device-plugin-daemonset"]
    kube_api.delete("ClusterPolicy", "cluster-policy")
    assert kube_api.list("DaemonSet", namespace="gpu-operator") == []


def test_mig_manager_applies_a_label_change_with_its_protocol(kube_api, tmp_path):
    path = gpu_node(kube_api, tmp_path)
    kube_api.seed(*seed.gpu_operator(mig_strategy="mixed"))
    assert wait_for(lambda: labels(kube_api).get(STATE) == "success")   # all-disabled: already in place
    seen = []
    kube_api.on("modified", lambda e: seen.append((e.obj["metadata"]["labels"].get(STATE),
                                                   e.obj["metadata"]["labels"].get(DEPLOY + "device-plugin"))),
                kind="Node")
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {CONFIG: "all-3g.40gb", STATE: None}}})
    assert wait_for(lambda: labels(kube_api).get(STATE) in ("success", "failed"))
    operator.wait_idle(kube_api)
    assert labels(kube_api)[STATE] == "success", operator.describe(kube_api, "gpu-1")
    assert devices(path) == [9, 9]
    assert ("pending", "paused-for-mig-change") in seen
    assert labels(kube_api)[DEPLOY + "device-plugin"] == "true"
    assert kube_api.get("Node", "gpu-1")["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"

    # The same value again does nothing; an unknown name fails.
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {STATE: None}}})
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {CONFIG: "all-3g.40gb"}}})
    time.sleep(1)
    assert STATE not in labels(kube_api)
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {CONFIG: "no-such-config"}}})
    assert wait_for(lambda: labels(kube_api).get(STATE) == "failed")
    operator.wait_idle(kube_api)


def test_mig_manager_wedges_once_and_a_new_pod_recovers(kube_api, tmp_path):
    path = gpu_node(kube_api, tmp_path)
    kube_api.seed(*seed.gpu_operator(mig_strategy="mixed"))
    assert wait_for(lambda: labels(kube_api).get(STATE) == "success")
    kube_api.patch("Node", "gpu-1", {"metadata": {"annotations": {operator.WEDGE: "once"}}})
    kube_api.patch("Node", "gpu-1", {"metadata": {"labels": {CONFIG: "all-1g.10gb"}}})
    time.sleep(1.5)
    operator.wait_idle(kube_api)
    assert labels(kube_api)[STATE] == "pending" and labels(kube_api)[DEPLOY + "device-plugin"] == operator.PAUSED
    assert devices(path) == []
    pod = kube_api.list("Pod", namespace="gpu-operator", label_selector="app=nvidia-mig-manager")[0]
    kube_api.delete("Pod", pod["metadata"]["name"], "gpu-operator")
    assert wait_for(lambda: labels(kube_api).get(STATE) == "success")
    operator.wait_idle(kube_api)
    assert devices(path) == [19] * 7 and labels(kube_api)[DEPLOY + "device-plugin"] == "true"


def test_dra_plugin_publishes_at_start_and_dynamic_mig_destroys(kube_api, tmp_path):
    path = gpu_node(kube_api, tmp_path, gpus="2xH100-SXM5-80GB")
    kube_api.seed(*seed.dra_driver())
    slices = kube_api.list("ResourceSlice")
    assert [d["attributes"]["type"]["string"] for d in slices[0]["spec"]["devices"]] == ["gpu", "gpu"]
    from tests.support.simhost import nvml_on
    with nvml_on(path) as nvml:
        nvml.set_mig_mode(0, 1)
        gi = nvml.create_gpu_instance(0, 9, 0, 4)
        nvml.create_compute_instance(0, gi, 2, 0)
    assert len(kube_api.list("ResourceSlice")[0]["spec"]["devices"]) == 2      # read only at start
    pod = kube_api.list("Pod", label_selector="app.kubernetes.io/name=dra-driver-nvidia-gpu")[0]
    kube_api.delete("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
    found = kube_api.list("ResourceSlice", field_selector="spec.nodeName=gpu-1")[0]["spec"]
    assert found["pool"]["generation"] == 2
    kinds = sorted((d["attributes"]["type"]["string"], d["attributes"].get("profile", {}).get("string"))
                   for d in found["devices"])
    assert kinds == [("gpu", None), ("mig", "3g.40gb")]

    kube_api.seed(*seed.dra_driver(dynamic_mig=True))          # the template changes: pods restart
    assert devices(path) == []
