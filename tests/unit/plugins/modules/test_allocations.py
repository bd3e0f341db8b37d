"""mig_config and mig_node_info with the kubelet's PodResources API (a real gRPC server in tmp_path):
a MIG device a pod holds is busy like one with processes."""

import pytest

from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_node_info
from tests.support.podresources_server import PodResourcesServer

SEVEN = [{"gpus": "all", "devices": {"1g.5gb": 7}}]
TWO = [{"gpus": "all", "devices": {"3g.20gb": 2}}]


def mig_uuids(result):
    return [ci["uuid"] for gi in result["gpus"][0]["devices"] for ci in gi["compute_instances"]]


def holding(*pairs):
    """Pods for the server: (namespace/pod/container, [device IDs]) pairs."""
    pods = []
    for name, ids in pairs:
        namespace, pod, container = name.split("/")
        pods.append({"namespace": namespace, "name": pod, "containers": [
            {"name": container, "devices": [{"resource_name": "nvidia.com/mig-3g.20gb", "device_ids": ids}]}]})
    return pods


@pytest.fixture
def two_devices(sim_host, run_module):
    """A100-40GB with two 3g.20gb devices; returns (state path, their UUIDs)."""
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    return state, mig_uuids(run_module(mig_config, {"layouts": TWO}))


def test_a_device_a_pod_holds_is_not_destroyed_and_the_message_names_the_pod(
        two_devices, run_module, file_digest, tmp_path):
    state, (first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    before = file_digest(state)
    with PodResourcesServer(sock, lambda: holding(("ml/train-0/main", [second]))):
        result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": sock})
    assert result["failed"] is True
    assert result["msg"].startswith("Nothing was changed.")
    assert "GPU 0 (NVIDIA A100-SXM4-40GB" in result["msg"] and second in result["msg"]
    assert "allocated to pod ml/train-0 (container main)" in result["msg"]
    assert first not in result["msg"]                       # an idle device is no obstacle
    assert result["allocations_source"] == "podresources"
    assert file_digest(state) == before


def test_with_force_an_allocated_device_goes(two_devices, run_module, tmp_path):
    _state, (_first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    with PodResourcesServer(sock, lambda: holding(("ml/train-0/main", [second + "::1"]))):
        result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": sock, "force": True})
    assert result["changed"] is True and result["gpus"][0]["mig_devices"] == {"1g.5gb": 7}


def test_an_allocated_device_the_layout_can_keep_is_kept(two_devices, run_module, tmp_path):
    _state, (first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    with PodResourcesServer(sock, lambda: holding(("ml/infer-0/main", [first]))):
        result = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.20gb": 1, "1g.5gb": 3}}],
                                         "pod_resources_socket": sock})
    assert result["changed"] is True
    assert first in mig_uuids(result) and second not in mig_uuids(result)


def test_a_whole_gpu_allocation_holds_every_device_on_it(two_devices, run_module, tmp_path):
    state, (first, _second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    facts = run_module(mig_node_info, {"read_allocations": False})["facts"]
    gpu_uuid = facts["gpus"][0]["uuid"]
    with PodResourcesServer(sock, lambda: holding(("ml/big-0/main", [gpu_uuid]))):
        result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": sock})
    assert result["failed"] is True and first in result["msg"] and "pod ml/big-0 (container main)" in result["msg"]


def test_without_the_socket_only_processes_count_and_the_result_says_so(two_devices, run_module, tmp_path):
    sock = str(tmp_path / "no-kubelet.sock")
    result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": sock})
    assert result["changed"] is True
    assert result["allocations"] is None and result["allocations_source"] is None
    assert sock in result["allocations_error"]


def test_read_allocations_false_does_not_ask(two_devices, run_module, tmp_path):
    _state, (_first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    with PodResourcesServer(sock, lambda: holding(("ml/train-0/main", [second]))) as server:
        result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": sock, "read_allocations": False})
    assert server.calls == 0 and result["changed"] is True
    assert result["allocations_error"] == "not read (read_allocations is false)"


def test_mig_node_info_returns_the_allocations_and_names_holders_beside_each_device(
        two_devices, run_module, tmp_path):
    _state, (first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    pods = holding(("ml/train-0/main", [second + "::0", second + "::1"]), ("ml/train-1/main", [second + "::2"]))
    with PodResourcesServer(sock, lambda: pods):
        # The plan may destroy what pods hold: it names them in evictions, and the rollout evicts them first.
        info = run_module(mig_node_info, {"layouts": SEVEN, "pod_resources_socket": sock})
        kept = run_module(mig_node_info, {"layouts": [{"gpus": "all", "devices": {"3g.20gb": 1, "1g.5gb": 3}}],
                                          "pod_resources_socket": sock})
    assert "failed" not in info or info["failed"] is False, info.get("msg")
    assert info["allocations_source"] == "podresources" and info["allocations_error"] is None
    assert [(a["device_uuid"], a["pod"]) for a in info["allocations"]] == [
        (second, "train-0"), (second, "train-0"), (second, "train-1")]
    assert info["allocations"][0] == {"device_uuid": second, "namespace": "ml", "pod": "train-0",
                                      "container": "main", "resource": "nvidia.com/mig-3g.20gb"}
    gpu = info["facts"]["gpus"][0]
    pods_of = dict((ci["mig_device_uuid"], ci["pods"]) for gi in gpu["gpu_instances"] for ci in gi["compute_instances"])
    assert pods_of == {first: [], second: ["ml/train-0/main", "ml/train-1/main"]}
    assert gpu["pods"] == []
    assert info["change"]["geometry"] is True
    evicted = info["evictions"]
    assert [p["pod"] for p in evicted["pods"]] == ["ml/train-0", "ml/train-1"] and not evicted["drain_node"]
    assert {r["reason"] for p in evicted["pods"] for r in p["reasons"]} == {"device destroyed"}
    assert evicted["pods"][0]["reasons"][0]["uuid"] == second
    # A layout that can keep the pods' device keeps it (the idle one goes): nobody is evicted.
    assert kept["change"]["geometry"] is True and kept["evictions"]["evicts_nothing"] is True


def test_mig_node_info_without_the_socket_knows_no_holders(two_devices, run_module, tmp_path):
    info = run_module(mig_node_info, {"pod_resources_socket": str(tmp_path / "none.sock")})
    planned = run_module(mig_node_info, {"layouts": SEVEN, "pod_resources_socket": str(tmp_path / "none.sock")})
    assert planned["evictions"] is None and planned["change"]["geometry"] is True
    gpu = info["facts"]["gpus"][0]
    assert info["allocations"] is None and "none.sock" in info["allocations_error"]
    assert gpu["pods"] is None and all(ci["pods"] is None for gi in gpu["gpu_instances"]
                                       for ci in gi["compute_instances"])
