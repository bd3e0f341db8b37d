"""Live reconfiguration (mig_node_drain=devices) on a node NVIDIA's DRA driver serves: which pod holds which MIG
device comes from the ResourceClaims' allocation results and the node's ResourceSlices (module_utils/_dra_claims.py),
read on the controller by mig_cluster_info. Pods holding three MIG devices through claims; a change that keeps two
of them evicts exactly the one pod whose device goes, the other two keep their UID, claim, device and UUID through
the DRA kubelet plugin's restart and validation; a re-run changes nothing. A claim the slices cannot explain falls
back to the whole-node drain, saying why. On the real test cluster: the DRA plugin's stand-in publishes the
slices and allocates the claims of the pods bound to the node (tests/support/kubeapi/dra.py), as the
scheduler's DRA plugin leaves them; the kubelet's PodResources API is served too (it lists the pods, without
device plugin devices)."""

import pytest

from tests.support.kubeapi import seed
from tests.support.podresources_server import PodResourcesServer, node_source

from test_roles import Fleet, STATE

pytestmark = pytest.mark.playbook

NODE = "node-a"
THREE = [{"gpus": "all", "devices": {"2g.20gb": 3}}]
# 3g.40gb takes memory slices 4-7 of an H100-80GB: the 2g.20gb device at 4 goes, those at 0 and 2 stay.
KEEP_TWO = [{"gpus": "all", "devices": {"2g.20gb": 2, "3g.40gb": 1}}]
# The DRA driver advertises the GPUs: no device plugin beside it.
RUN = {"mig_node_validate_delay": "1", "gpuops_mig_deploy_device_plugin": False}


def pods_by_name(cluster):
    return dict((p["metadata"]["name"], p) for p in cluster.list("Pod", "ml"))


def claimed(cluster):
    """{pod: (claim uid, device name, device UUID)} from the claims and the node's current ResourceSlice."""
    uuids = dict((d["name"], d["attributes"]["uuid"]["string"]) for s in cluster.list("ResourceSlice")
                 for d in s["spec"]["devices"])
    out = {}
    for claim in cluster.list("ResourceClaim", "ml"):
        status = claim.get("status") or {}
        for consumer in status.get("reservedFor") or []:
            device = status["allocation"]["devices"]["results"][0]["device"]
            out[consumer["name"]] = (claim["metadata"]["uid"], device, uuids.get(device))
    return out


@pytest.fixture
def dra_node(cluster, cluster_env, tmp_path):
    """node-a (H100) served by NVIDIA's DRA driver, at three 2g.20gb devices, then three ReplicaSet pods each
    using a ResourceClaim for one 2g.20gb device. Yields the fleet, with the PodResources server running."""
    sock = str(tmp_path / "kubelet.sock")
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add(NODE, "1xH100-SXM5-80GB", pod_resources=sock, mig_node_layouts=THREE,
              mig_node_pod_resources_socket=sock)
    cluster.seed(*seed.dra_driver())
    with PodResourcesServer(sock, node_source(cluster.stand_ins.view, NODE)):
        first = fleet.run("playbooks/site.yml", RUN)
        assert first.returncode == 0, first.stdout[-4000:]
        # A ReplicaSet each (real, made for them), whose replacement asks for the same claim.
        cluster.seed(*[seed.resource_claim("train-%d" % i, namespace="ml", profile="2g.20gb") for i in range(3)],
                     *[seed.pod("train-%d" % i, node=NODE, namespace="ml", labels={"app": "train"},
                                owner=("ReplicaSet", "train-%d" % i), claims=["train-%d" % i])
                       for i in range(3)])
        cluster.wait_for(lambda: len(claimed(cluster)) == 3, "the three claims allocated")
        yield fleet


def test_only_the_pod_whose_claimed_device_goes_is_evicted(dra_node, cluster):
    fleet = dra_node
    before, held = pods_by_name(cluster), claimed(cluster)
    assert sorted(held) == ["train-0", "train-1", "train-2"] and all(uuid for _u, _d, uuid in held.values())
    assert all(p["status"]["phase"] == "Running" for p in before.values())
    doomed = [pod for pod, (_uid, device, _uuid) in held.items() if device.endswith("-4")]
    assert len(doomed) == 1

    fleet.hosts[NODE]["mig_node_layouts"] = KEEP_TWO
    proc = fleet.run("playbooks/site.yml", RUN)
    assert proc.returncode == 0, proc.stdout[-6000:]

    after = pods_by_name(cluster)
    assert sorted(set(before) - set(after)) == doomed, proc.stdout[-4000:]
    assert "evicts 1 pod(s): ml/%s (device destroyed)" % doomed[0] in proc.stdout
    assert "%s: evicting ml/%s (device destroyed); every other pod runs on with its devices" % (NODE, doomed[0]) \
        in proc.stdout
    now = claimed(cluster)
    for name in sorted(set(before) - set(doomed)):
        assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert after[name]["status"]["phase"] == "Running", after[name]["status"]
        assert now[name] == held[name]            # same claim, device name and MIG device UUID
    node = cluster.get("Node", NODE)
    assert node["metadata"]["labels"][STATE] == "success" and not node["spec"].get("unschedulable")
    profiles = sorted(d["attributes"]["profile"]["string"] for s in cluster.list("ResourceSlice")
                      for d in s["spec"]["devices"])
    assert profiles == ["2g.20gb", "2g.20gb", "3g.40gb"]

    again = fleet.run("playbooks/site.yml", RUN)
    assert again.returncode == 0 and again.recap[NODE]["changed"] == 0, again.stdout[-4000:]
    assert set(pods_by_name(cluster)) == set(after) and claimed(cluster) == now


def test_a_claim_no_slice_explains_drains_the_whole_node_and_says_why(dra_node, cluster):
    fleet = dra_node
    before = pods_by_name(cluster)
    # A claim whose device the node's slice no longer publishes (as while the driver replaces its slice): an
    # allocation cannot be rewritten, so the slice loses the device.
    device = claimed(cluster)["train-0"][1]
    [slice_] = cluster.list("ResourceSlice", field_selector="spec.nodeName=" + NODE)
    kept = [d for d in slice_["spec"]["devices"] if d["name"] != device]
    cluster.patch("ResourceSlice", slice_["metadata"]["name"], {"spec": {"devices": kept}})
    fleet.hosts[NODE]["mig_node_layouts"] = KEEP_TWO
    proc = fleet.run("playbooks/site.yml", RUN)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert ("the whole node is drained (which pod holds which MIG device is unknown (the DRA driver's ResourceClaims "
            "cannot be mapped to MIG devices: node-a: ResourceClaim ml/train-0: request gpu is allocated device "
            "%s of pool node-a, which no ResourceSlice of gpu.nvidia.com for the node publishes" % device) \
        in proc.stdout
    # Every pod was evicted (and gone) before any device was destroyed; their replacements are new pods.
    cluster.stand_ins.sync()  # a pod whose device went is failed by the DRA stand-in's next pass
    after = pods_by_name(cluster)
    assert not set(before) & set(after), sorted(after)
    assert all(p["status"].get("reason") != "DeviceDestroyed" for p in after.values())
