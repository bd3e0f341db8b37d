"""Live reconfiguration (mig_node_drain=devices): a node whose pods hold three MIG devices changes to a layout
that keeps two of them. Exactly the pod on the device that goes is evicted; the other two run on with the same
pod UID and device UUID through the device-plugin restart and validation; the node advertises the new layout;
a re-run changes nothing. On the real test cluster: the evicted pod terminates as the API server
and kwok make it, its ReplicaSet replaces it, and the NVIDIA stand-ins give the pods devices,
served over the kubelet's PodResources gRPC API (tests/support/kubeapi/allocations.py,
tests/support/podresources_server.py)."""

import pytest

from tests.support.kubeapi import allocations, seed
from tests.support.kubeapi.allocations import pod_ready
from tests.support.podresources_server import PodResourcesServer, node_source

from test_roles import Fleet, STATE

pytestmark = pytest.mark.playbook

NODE = "node-a"
MIG_2G = "nvidia.com/mig-2g.20gb"
THREE = [{"gpus": "all", "devices": {"2g.20gb": 3}}]
# 3g.40gb takes memory slices 4-7 of an H100-80GB: the 2g.20gb device at 4 goes, those at 0 and 2 stay.
KEEP_TWO = [{"gpus": "all", "devices": {"2g.20gb": 2, "3g.40gb": 1}}]
FAST = {"mig_node_validate_delay": "1"}


def pods_by_name(cluster):
    return dict((p["metadata"]["name"], p) for p in cluster.list("Pod", "ml"))


def assigned(cluster):
    """(namespace, pod) -> the devices the node's kubelet gave it, once the stand-ins caught up."""
    cluster.stand_ins.sync()
    return allocations.assigned(cluster.stand_ins.view, NODE)


@pytest.fixture
def busy_node(cluster, cluster_env, tmp_path):
    """node-a (H100) at three 2g.20gb devices (the first rollout deploys the device plugin), then three
    pods of one ReplicaSet holding one device each. Yields the fleet with the PodResources server
    running."""
    sock = str(tmp_path / "kubelet.sock")
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add(NODE, "1xH100-SXM5-80GB", pod_resources=sock, mig_node_layouts=THREE,
              mig_node_pod_resources_socket=sock)
    with PodResourcesServer(sock, node_source(cluster.stand_ins.view, NODE)):
        first = fleet.run("playbooks/site.yml", FAST)
        assert first.returncode == 0, first.stdout[-4000:]
        pods = [seed.pod("train-%d" % i, node=NODE, namespace="ml", labels={"app": "train"},
                         owner=("ReplicaSet", "train-rs"), limits={MIG_2G: 1}) for i in range(3)]
        # train-2 is the one a scale-down deletes. Set at creation, its deletion cost is in the
        # ReplicaSet controller's cache before the controller adopts the pods: a later patch
        # could race the scale-down.
        pods[2]["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "-100"}
        cluster.seed(*pods)
        cluster.wait_for(lambda: len(assigned(cluster)) == 3, "three pods holding a device")
        # Readiness ranks before the deletion cost: a pod not ready yet would be deleted first.
        cluster.wait_for(lambda: all(pod_ready(p) for p in cluster.list("Pod", "ml")),
                         "three pods ready")
        yield fleet


def test_only_the_pod_whose_device_goes_is_evicted(busy_node, cluster):
    fleet = busy_node
    before = pods_by_name(cluster)
    held = assigned(cluster)
    assert len(held) == 3 and all(p["status"]["phase"] == "Running" for p in before.values())

    fleet.hosts[NODE]["mig_node_layouts"] = KEEP_TWO
    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode == 0, proc.stdout[-6000:]

    after = pods_by_name(cluster)
    gone = sorted(set(before) - set(after))
    assert len(gone) == 1, (gone, proc.stdout[-4000:])
    assert "%s: evicting ml/%s (device destroyed); every other pod runs on with its devices" % (NODE, gone[0]) \
        in proc.stdout
    now = assigned(cluster)
    for name in sorted(set(before) & set(after)):
        assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert after[name]["status"]["phase"] == "Running"
        assert now[("ml", name)] == held[("ml", name)]
    # Its ReplicaSet's replacement waits: the node has no 2g.20gb device left for it.
    (replacement,) = sorted(set(after) - set(before))
    assert after[replacement]["status"]["phase"] == "Pending"
    node = cluster.get("Node", NODE)
    assert node["metadata"]["labels"][STATE] == "success" and not node["spec"].get("unschedulable")
    allocatable = node["status"]["allocatable"]
    assert allocatable[MIG_2G] == "2" and allocatable["nvidia.com/mig-3g.40gb"] == "1"
    assert "evicts 1 pod(s): ml/%s (device destroyed)" % gone[0] in proc.stdout
    assert "%s evicted ml/%s (device destroyed)" % (NODE, gone[0]) in proc.stdout

    again = fleet.run("playbooks/site.yml", FAST)
    assert again.returncode == 0 and again.recap[NODE]["changed"] == 0, again.stdout[-4000:]
    assert set(pods_by_name(cluster)) == set(after)


def test_a_change_that_destroys_only_idle_devices_evicts_nothing(busy_node, cluster):
    fleet = busy_node
    # The ReplicaSet scales down and deletes train-2 (the cheapest to delete): its device is idle.
    cluster.patch("ReplicaSet", "train-rs", {"spec": {"replicas": 2}}, "ml")
    cluster.wait_for(lambda: cluster.find("Pod", "train-2", "ml") is None, "train-2 deleted")
    cluster.wait_for(lambda: len(assigned(cluster)) == 2, "two pods holding a device")
    idle = sorted(pods_by_name(cluster))
    fleet.hosts[NODE]["mig_node_layouts"] = KEEP_TWO
    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode == 0, proc.stdout[-6000:]
    # The planner keeps the two held devices: the idle one makes room for the 3g.40gb.
    assert "%s: no pod holds a MIG device that goes: nothing is evicted" % NODE in proc.stdout
    assert sorted(pods_by_name(cluster)) == idle
