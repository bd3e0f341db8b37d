"""The emulator's DRA kubelet plugin and kubelet (tests/support/kubeapi dra.py, allocations.py) for
pods bound by name with ResourceClaims. The other stand-in tests run on the real control plane in
test_standins_operator.py; this one relies on the emulator allocating the claims of a pod that
names its node (on a real cluster kube-scheduler allocates claims, and only for the pods it
schedules) and dropping an allocation once nothing reserves it."""


import pytest

import gpuops_mig_sim as sim
from tests.support.kubeapi import allocations, migmanager, seed

GPU = {"nvidia.com/gpu.present": "true"}


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
