"""Which pod holds which device on a node NVIDIA's DRA driver serves, from its ResourceSlices and the
ResourceClaims (plugins/module_utils/_dra_claims.py), and how that map joins the kubelet's."""

import copy

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _dra_claims as dra

NODE = "gpu-1"
MIG_A = "MIG-11111111-1111-5111-8111-111111111111"
MIG_B = "MIG-22222222-2222-5222-8222-222222222222"
GPU_2 = "GPU-33333333-3333-5333-8333-333333333333"


def device(name, uuid=None, kind="mig"):
    attributes = {"type": {"string": kind}}
    if uuid:
        attributes["uuid"] = {"string": uuid}
    return {"name": name, "attributes": attributes}


def resource_slice(node=NODE, devices=(), generation=1, driver=dra.DRIVER, name=None):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or "%s-%s" % (node, driver)},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                                  "resourceSliceCount": 1},
                     "devices": list(devices)}}


def claim(name, results, pods=(), namespace="ml"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": "uid-" + name},
            "status": {"allocation": {"devices": {"results": [
                {"request": request, "driver": driver, "pool": pool, "device": dev}
                for request, driver, pool, dev in results]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": "pod-uid-" + pod} for pod in pods]}}


SLICES = [resource_slice(devices=[device("gpu-0-mig-2g20gb-14-0", MIG_A), device("gpu-0-mig-2g20gb-14-2", MIG_B),
                                  device("gpu-2", GPU_2, kind="gpu")])]


def test_each_claimed_device_maps_to_the_pods_the_claim_is_reserved_for():
    claims = [
        claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")], pods=["train-0"]),
        claim("shared", [("gpu", dra.DRIVER, NODE, "gpu-2")], pods=["a", "b"]),
        claim("nic", [("nic", "nic.example.com", NODE, "eth1")], pods=["net-0"]),           # another driver
        claim("elsewhere", [("mig", dra.DRIVER, "gpu-9", "gpu-0-mig-1g10gb-19-0")], pods=["far-0"]),   # another node
        claim("idle", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-2")]),                # reserved for nobody
        claim("pending", []),
    ]
    got = dra.node_allocations(NODE, SLICES, claims)
    assert got["allocations_source"] == "dra" and got["allocations_error"] is None
    assert [(a["device_uuid"], a["namespace"], a["pod"], a["pod_uid"], a["claim"], a["request"], a["device"])
            for a in got["allocations"]] == [
        (MIG_A, "ml", "train-0", "pod-uid-train-0", "train", "mig", "gpu-0-mig-2g20gb-14-0"),
        (GPU_2, "ml", "a", "pod-uid-a", "shared", "gpu", "gpu-2"),
        (GPU_2, "ml", "b", "pod-uid-b", "shared", "gpu", "gpu-2")]
    assert all(a["container"] == "" and a["resource"] == dra.DRIVER for a in got["allocations"])


def test_a_node_the_driver_does_not_serve_has_no_dra_map():
    other = [resource_slice(node="gpu-9", devices=[device("gpu-0", GPU_2, "gpu")]),
             resource_slice(devices=[device("eth1")], driver="nic.example.com")]
    assert dra.node_allocations(NODE, other, [claim("nic", [("nic", "nic.example.com", NODE, "eth1")], ["p"])]) is None
    assert dra.node_allocations(NODE, [], []) is None


def test_only_the_newest_generation_of_a_pool_counts():
    old = resource_slice(devices=[device("gpu-0-mig-2g20gb-14-4", MIG_A)], generation=1, name="old")
    new = resource_slice(devices=[device("gpu-0-mig-2g20gb-14-0", MIG_A)], generation=2, name="new")
    stale = claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-4")], pods=["train-0"])
    got = dra.node_allocations(NODE, [old, new], [stale])
    assert got["allocations"] is None and "gpu-0-mig-2g20gb-14-4" in got["allocations_error"]


@pytest.mark.parametrize("slices, claims, words", [
    # A result naming a device no slice of the node's pool publishes.
    (SLICES, [claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-3g40gb-9-4")], ["train-0"])],
     ["gpu-1: ResourceClaim ml/train", "request mig", "device gpu-0-mig-3g40gb-9-4 of pool gpu-1",
      "no ResourceSlice of gpu.nvidia.com"]),
    # The slices are gone (the plugin stopped) while a claim still holds a device of the node's pool.
    ([], [claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")], ["train-0"])],
     ["ResourceClaim ml/train", "device gpu-0-mig-2g20gb-14-0 of pool gpu-1"]),
    # A device without its uuid attribute (DynamicMIG publishes devices before they exist).
    ([resource_slice(devices=[device("gpu-0-mig-2g20gb-14-0")])],
     [claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")], ["train-0"])],
     ["ResourceClaim ml/train", "gpu-0-mig-2g20gb-14-0", "no uuid attribute"]),
    # Reserved for something that is not a pod: who holds it is unknown.
    (SLICES, [dict(claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")]),
                   status={"allocation": {"devices": {"results": [{"driver": dra.DRIVER, "pool": NODE,
                                                                   "device": "gpu-0-mig-2g20gb-14-0"}]}},
                           "reservedFor": [{"apiGroup": "batch", "resource": "jobs", "name": "j"}]})],
     ["ResourceClaim ml/train", "reserved for jobs j, not a pod", "gpu-0-mig-2g20gb-14-0"]),
    # Garbage.
    (SLICES, ["not a claim"], ["gpu-1: a ResourceClaim without a name"]),
    (SLICES, [dict(claim("train", []), status={"allocation": {"devices": {"results": "x"}}})],
     ["ResourceClaim ml/train", "must be lists"]),
    ([dict(resource_slice(), spec=dict(resource_slice()["spec"], pool={"generation": "one"}))], [],
     ["gpu-1: the ResourceSlice gpu-1-gpu.nvidia.com of gpu.nvidia.com is malformed"]),
    ([resource_slice(devices=[{"attributes": {}}])], [], ["gpu-1: a ResourceSlice", "device without a name"]),
])
def test_what_cannot_be_mapped_makes_the_map_unknown_and_says_where(slices, claims, words):
    got = dra.node_allocations(NODE, slices, claims)
    assert got["allocations"] is None and got["allocations_source"] is None
    assert got["allocations_error"].startswith("the DRA driver's ResourceClaims cannot be mapped to MIG devices: ")
    for word in words:
        assert word in got["allocations_error"], (word, got["allocations_error"])


KUBELET = {"allocations": [{"device_uuid": MIG_B, "namespace": "web", "pod": "infer-0", "container": "main",
                            "resource": "nvidia.com/mig-2g.20gb"}],
           "allocations_source": "podresources", "allocations_error": None}
UNREAD = {"allocations": None, "allocations_source": None,
          "allocations_error": "the kubelet's PodResources socket /x cannot be used: No such file or directory"}


def test_merge_joins_the_claims_to_the_kubelets_map():
    claims = dra.node_allocations(NODE, SLICES, [claim("train", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")],
                                                       ["train-0"])])
    assert dra.merge(KUBELET, None) == KUBELET
    both = dra.merge(KUBELET, claims)
    assert both["allocations_source"] == "podresources+dra" and both["allocations_error"] is None
    assert [a["pod"] for a in both["allocations"]] == ["infer-0", "train-0"]
    # The kubelet unreadable: the claims alone (the GPU pods they miss are evicted as devices unknown).
    alone = dra.merge(UNREAD, claims)
    assert alone["allocations_source"] == "dra" and [a["pod"] for a in alone["allocations"]] == ["train-0"]


def test_merge_of_an_unreadable_claim_map_is_unknown_whatever_the_kubelet_says():
    bad = dra.node_allocations(NODE, SLICES, [claim("train", [("mig", dra.DRIVER, NODE, "gone")], ["train-0"])])
    merged = dra.merge(KUBELET, bad)
    assert merged["allocations"] is None and merged["allocations_source"] is None
    assert "ResourceClaim ml/train" in merged["allocations_error"]
    neither = dra.merge(UNREAD, bad)
    assert "ResourceClaim ml/train" in neither["allocations_error"] and "PodResources socket /x" in neither["allocations_error"]
    api = dra.merge(KUBELET, dra.unreadable(NODE, "Forbidden"))
    assert api["allocations"] is None and api["allocations_error"].startswith(
        "gpu-1: the ResourceSlices and ResourceClaims of NVIDIA's DRA driver (resource.k8s.io/v1) cannot be read: "
        "Forbidden")


@pytest.mark.parametrize("given", [
    "garbage", {"allocations": "x"}, {"allocations": [{"device_uuid": MIG_A, "namespace": "ml"}]},
    {"allocations": [{"device_uuid": 7, "namespace": "ml", "pod": "p"}]}])
def test_a_malformed_map_given_to_a_module_is_unknown_not_trusted(given):
    merged = dra.merge(KUBELET, given)
    assert merged["allocations"] is None and merged["allocations_error"].startswith(
        "the DRA allocations given are malformed: ")


def test_the_input_is_not_changed():
    slices, claims = copy.deepcopy(SLICES), [claim("t", [("mig", dra.DRIVER, NODE, "gpu-0-mig-2g20gb-14-0")], ["p"])]
    before = copy.deepcopy((slices, claims))
    dra.node_allocations(NODE, slices, claims)
    assert (slices, claims) == before
