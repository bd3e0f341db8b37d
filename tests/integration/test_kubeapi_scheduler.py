"""The emulator's scheduler for extended resources and its timed pods (tests/support/kubeapi/scheduler.py)."""

import time

from tests.support.kubeapi import Cluster, seed
from tests.support.kubeapi.scheduler import RUN_SECONDS_ANNOTATION

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


def node_of(cluster, name):
    return (cluster.get("Pod", name).get("spec") or {}).get("nodeName")


def test_a_pending_pod_goes_to_a_node_with_room_and_waits_when_none_has_any():
    cluster = Cluster()
    cluster.seed(seed.node("gpu-a", allocatable={MIG_1G: "2"}), seed.node("gpu-b", allocatable={MIG_3G: "1"}))
    cluster.seed(seed.pod("small", limits={MIG_1G: 2}), seed.pod("big", limits={MIG_3G: 1}),
                 seed.pod("more", limits={MIG_1G: 1}), seed.pod("plain"))
    assert node_of(cluster, "small") == "gpu-a" and node_of(cluster, "big") == "gpu-b"
    assert cluster.get("Pod", "small")["status"]["phase"] == "Running"
    assert node_of(cluster, "more") is None and cluster.get("Pod", "more")["status"]["phase"] == "Pending"
    assert node_of(cluster, "plain") is None          # asks for no extended resource: left alone
    # The node advertises more (a new MIG layout): the waiting pod is bound.
    status = cluster.get("Node", "gpu-a")["status"]
    cluster.set_status("Node", "gpu-a", dict(status, allocatable=dict(status["allocatable"], **{MIG_1G: "3"})))
    assert node_of(cluster, "more") == "gpu-a"


def test_cordon_taints_and_node_selector_are_honoured():
    cluster = Cluster()
    cluster.seed(seed.node("cordoned", allocatable={MIG_1G: "4"}, unschedulable=True),
                 seed.node("tainted", allocatable={MIG_1G: "4"},
                           taints=[{"key": "gpu", "value": "ml", "effect": "NoSchedule"}]),
                 seed.node("labelled", {"pool": "infer"}, allocatable={MIG_1G: "1"}))
    tolerant = seed.pod("tolerant", limits={MIG_1G: 2})
    tolerant["spec"]["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    picky = seed.pod("picky", limits={MIG_1G: 1})
    picky["spec"]["nodeSelector"] = {"pool": "infer"}
    cluster.seed(tolerant, picky, seed.pod("intolerant", limits={MIG_1G: 2}))
    assert node_of(cluster, "tolerant") == "tainted"
    assert node_of(cluster, "picky") == "labelled"
    assert node_of(cluster, "intolerant") is None   # the cordoned and the tainted node refuse it, labelled is full
    cluster.patch("Node", "cordoned", {"spec": {"unschedulable": None}})
    assert node_of(cluster, "intolerant") == "cordoned"


def test_least_allocated_node_wins():
    cluster = Cluster()
    cluster.seed(seed.node("gpu-a", allocatable={MIG_1G: "7"}), seed.node("gpu-b", allocatable={MIG_1G: "7"}))
    cluster.seed(seed.pod("first", node="gpu-a", limits={MIG_1G: 3}, phase="Running"))
    cluster.seed(seed.pod("next", limits={MIG_1G: 1}))
    assert node_of(cluster, "next") == "gpu-b"


def test_a_timed_pod_finishes_and_frees_its_devices_for_the_next():
    cluster = Cluster()
    cluster.seed(seed.node("gpu-a", allocatable={MIG_3G: "1"}))
    first = seed.pod("first", limits={MIG_3G: 1})
    first["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: "0.3"}
    cluster.seed(first)
    cluster.seed(seed.pod("second", limits={MIG_3G: 1}))
    assert node_of(cluster, "first") == "gpu-a" and node_of(cluster, "second") is None
    deadline = time.time() + 10
    while node_of(cluster, "second") is None and time.time() < deadline:
        time.sleep(0.05)
    assert cluster.get("Pod", "first")["status"]["phase"] == "Succeeded"
    assert node_of(cluster, "second") == "gpu-a"
    assert not cluster.errors
