"""mig_node_info and mig_config on a node NVIDIA's DRA driver serves: the ResourceClaims' map
(dra_allocations, as mig_cluster_info returns it) joins the kubelet's, and a map that cannot be read
falls back to the whole-node drain with the reason (plugins/module_utils/_dra_claims.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _dra_claims as dra
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_node_info
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_pods as node_pods
from tests.support.podresources_server import PodResourcesServer

SEVEN = [{"gpus": "all", "devices": {"1g.5gb": 7}}]
TWO = [{"gpus": "all", "devices": {"3g.20gb": 2}}]
NODE = "gpu-1"


def mig_uuids(result):
    return [ci["uuid"] for gi in result["gpus"][0]["devices"] for ci in gi["compute_instances"]]


def claim(name, device, pod):
    """A ResourceClaim allocated one device of the node's pool, reserved for one pod."""
    result = {"request": "mig", "driver": dra.DRIVER, "pool": NODE, "device": device}
    return {"metadata": {"name": name, "namespace": "ml"},
            "status": {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": pod, "uid": "uid-" + pod}]}}


def claims_map(uuids, pods):
    """What mig_cluster_info returns for the node: its slice publishes the devices, one claim per pod."""
    names = ["gpu-0-mig-3g20gb-2-%d" % (4 * i) for i in range(len(uuids))]
    slices = [{"spec": {"driver": dra.DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
                        "devices": [{"name": n, "attributes": {"type": {"string": "mig"}, "uuid": {"string": u}}}
                                    for n, u in zip(names, uuids)]}}]
    claims = [claim("claim-" + pod, names[index], pod) for pod, index in pods]
    return dra.node_allocations(NODE, slices, claims)


@pytest.fixture
def two_devices(sim_host, run_module):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    return state, mig_uuids(run_module(mig_config, {"layouts": TWO}))


def test_the_claims_join_the_kubelets_map_and_the_plan_keeps_what_they_hold(two_devices, run_module, tmp_path):
    _state, (first, second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    claims = claims_map([first, second], [("train-0", 1)])
    keep_one = [{"gpus": "all", "devices": {"3g.20gb": 1, "1g.5gb": 3}}]
    with PodResourcesServer(sock, lambda: [{"namespace": "ml", "name": "train-0", "containers": [
            {"name": "main", "devices": []}]}]):
        info = run_module(mig_node_info, {"layouts": keep_one, "pod_resources_socket": sock,
                                          "dra_allocations": claims})
        seven = run_module(mig_node_info, {"layouts": SEVEN, "pod_resources_socket": sock, "dra_allocations": claims})
    assert info["allocations_source"] == "podresources+dra" and info["allocations_error"] is None
    assert [(a["device_uuid"], a["pod"], a["claim"]) for a in info["allocations"]] == [(second, "train-0", "claim-train-0")]
    # The planner keeps the claimed device: the idle one makes room, nobody is evicted.
    assert info["evictions"]["evicts_nothing"] is True
    pods_of = dict((ci["mig_device_uuid"], ci["pods"]) for gi in info["facts"]["gpus"][0]["gpu_instances"]
                   for ci in gi["compute_instances"])
    assert pods_of == {first: [], second: ["ml/train-0"]}
    # A layout that cannot keep it names the pod.
    assert [(p["pod"], p["reasons"][0]["uuid"]) for p in seven["evictions"]["pods"]] == [("ml/train-0", second)]


def test_with_the_kubelet_unreadable_the_claims_alone_are_the_map(two_devices, run_module, tmp_path):
    _state, (first, second) = two_devices
    info = run_module(mig_node_info, {"layouts": SEVEN, "pod_resources_socket": str(tmp_path / "none.sock"),
                                      "dra_allocations": claims_map([first, second], [("a", 0), ("b", 1)])})
    assert info["allocations_source"] == "dra"
    assert [p["pod"] for p in info["evictions"]["pods"]] == ["ml/a", "ml/b"]


def test_mig_config_never_destroys_a_claimed_device(two_devices, run_module, file_digest, tmp_path):
    state, (first, second) = two_devices
    before = file_digest(state)
    result = run_module(mig_config, {"layouts": SEVEN, "pod_resources_socket": str(tmp_path / "none.sock"),
                                     "dra_allocations": claims_map([first, second], [("train-0", 0)])})
    assert result["failed"] is True and first in result["msg"] and "allocated to pod ml/train-0" in result["msg"]
    assert "(container" not in result["msg"] and second not in result["msg"]
    assert file_digest(state) == before


def test_claims_that_cannot_be_mapped_fall_back_to_the_whole_node_drain_and_say_why(
        two_devices, run_module, tmp_path):
    _state, (first, _second) = two_devices
    sock = str(tmp_path / "kubelet.sock")
    slices = [{"spec": {"driver": dra.DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
                        "devices": [{"name": "gpu-0-mig-3g20gb-2-0", "attributes": {"uuid": {"string": first}}}]}}]
    bad = dra.node_allocations(NODE, slices, [claim("claim-x", "gpu-0-mig-3g20gb-2-4", "x")])
    with PodResourcesServer(sock, lambda: []):
        info = run_module(mig_node_info, {"layouts": SEVEN, "pod_resources_socket": sock, "dra_allocations": bad})
    assert info["allocations"] is None and info["allocations_source"] is None and info["evictions"] is None
    preview = node_pods.drain_preview("devices", info)
    assert preview["mode"] == "node"
    assert preview["text"] == (
        "the whole node is drained (which pod holds which MIG device is unknown (the DRA driver's ResourceClaims "
        "cannot be mapped to MIG devices: gpu-1: ResourceClaim ml/claim-x: request mig is allocated device "
        "gpu-0-mig-3g20gb-2-4 of pool gpu-1, which no ResourceSlice of gpu.nvidia.com for the node publishes "
        "(a slice being replaced, or one the driver removed)))")
    plan = node_pods.drain_plan([], "devices", info, False, "gpuops.mig/evict")
    assert plan["mode"] == "node" and "ResourceClaim ml/claim-x" in plan["why"]
