"""The nodes' pod maps in the fleet plan and the demand round (_demand_allocations.py): a device a pod holds is
kept, a change that keeps every held device evicts nobody and is applied, and a node whose map is unknown is
held as before."""

import copy

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand_allocations as da
from ansible_collections.gpuops.mig.plugins.plugin_utils import _rounds as r
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts, node_facts

MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_1G = "nvidia.com/mig-1g.10gb"
# fleet_helpers names a MIG device MIG-<model>-<GPU index>-<GI id>.
HELD = "MIG-H100-80GB-0-1"
IDLE = "MIG-H100-80GB-0-2"


def two_3g(index=0, uuid="GPU-aaaa"):
    """An H100 with two 3g.40gb devices, no process on either."""
    return dict(facts(index, "H100-80GB", [(1, "3g.40gb", 0, ()), (2, "3g.40gb", 4, ())]), uuid=uuid)


def pod(name, node, resources, phase="Running"):
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"nodeName": node, "containers": [
        {"name": "main", "resources": {"limits": resources}}]}, "status": {"phase": phase}}


def held_by(name, uuid, resource=MIG_3G):
    return {"device_uuid": uuid, "namespace": "ml", "pod": name, "container": "main", "resource": resource}


def read(*allocations):
    """mig_node_info's result on a node whose kubelet answered."""
    return {"allocations": list(allocations), "allocations_source": "podresources", "allocations_error": None}


UNREAD = {"allocations": None, "allocations_source": None,
          "allocations_error": "no PodResources socket at /var/lib/kubelet/pod-resources/kubelet.sock"}


def plan_round(fleet, demand, pods, results, max_nodes=5):
    """What mig_plan does with pods and allocations, then the round's selection."""
    maps = da.pod_maps(results, sorted(fleet))
    marked = da.with_holders(fleet, maps)
    dummy_items, in_use, dummy_whole, dummy_unresolved = _plan_demand.demand_from_pods(pods, fleet=fleet)
    plan = fp.plan_fleet(marked, demand, in_use=in_use)
    da.add_evictions(plan, marked, maps, pods)
    return plan, r.select(plan, pods, settings={"max_nodes": max_nodes})


def test_a_node_running_a_pod_on_a_kept_device_is_applied_and_the_idle_device_gives_way():
    fleet = {"gpu-a": node_facts([two_3g()])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1})]
    plan, selection = plan_round(fleet, {"1g.10gb": 3}, pods, {"gpu-a": read(held_by("train", HELD))})
    gpu = plan["nodes"]["gpu-a"]["gpus"][0]
    # The pod's 3g.40gb stays; the idle one becomes three 1g.10gb.
    assert gpu["after"] == {"1g.10gb": 3, "3g.40gb": 1} and gpu["destroyed"] == 1
    assert plan["nodes"]["gpu-a"]["evicted_pods"] == [] and plan["nodes"]["gpu-a"]["evictions"] == []
    assert plan["report"]["busy_devices_kept"][0]["pods"] == ["ml/train/main"]
    assert selection["apply"] == ["gpu-a"] and selection["held"] == []
    decision = selection["nodes"]["gpu-a"]
    assert decision["evicts"] == [] and decision["reasons"] == [] and decision["drain"] == "none"


def test_allocated_devices_are_never_reshaped_even_when_demand_needs_their_slices():
    fleet = {"gpu-a": node_facts([two_3g()])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1}), pod("infer", "gpu-a", {MIG_3G: 1})]
    plan, selection = plan_round(fleet, {"1g.10gb": 4}, pods,
                                 {"gpu-a": read(held_by("train", HELD), held_by("infer", IDLE))})
    assert plan["nodes"]["gpu-a"]["touched"] is False and plan["report"]["unmet_devices"] == 4
    assert selection["planned"] == []


def test_without_a_pod_map_the_node_is_planned_from_counts_and_held_saying_why():
    fleet = {"gpu-a": node_facts([two_3g()]), "gpu-b": node_facts([dict(facts(0, "H100-80GB"), uuid="GPU-b")])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1})]
    plan, selection = plan_round(fleet, {"1g.10gb": 10}, pods, {"gpu-a": UNREAD, "gpu-b": read()})
    entry = plan["nodes"]["gpu-a"]
    assert "evicted_pods" not in entry and entry["pod_map_unknown"] == UNREAD["allocations_error"]
    # One pod, no process: which 3g.40gb it holds is unknown, so both stay (the counts' floor).
    assert entry["touched"] is False
    assert selection["apply"] == ["gpu-b"]
    # Had the plan touched gpu-a, the round would hold it, naming the unknown map.
    entry["touched"] = True
    held = r.select(plan, pods, settings={"max_nodes": 5})["nodes"]["gpu-a"]
    assert held["decision"] == "held" and held["drain"] is None
    assert held["reasons"][0] == ("evicts 1 running pod(s) (the node's GPU pods: the node is drained, since which "
                                  "pod holds which MIG device is unknown: %s): ml/train" % UNREAD["allocations_error"])


def test_a_gpu_pod_the_kubelet_lists_no_device_for_yet_is_an_eviction_and_holds_the_node():
    fleet = {"gpu-a": node_facts([two_3g()])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1}), pod("starting", "gpu-a", {MIG_1G: 1}, phase="Pending")]
    plan, selection = plan_round(fleet, {"1g.10gb": 3}, pods, {"gpu-a": read(held_by("train", HELD))})
    assert plan["nodes"]["gpu-a"]["evicted_pods"] == ["ml/starting"]
    assert plan["nodes"]["gpu-a"]["evictions"][0]["reason"] == da.DEVICE_UNKNOWN
    assert selection["held"] == ["gpu-a"]
    assert selection["nodes"]["gpu-a"]["reasons"][0] == \
        "evicts 1 running pod(s) (the plan: device unknown): ml/starting"


def test_a_mode_change_evicts_the_pods_on_that_gpu_only_and_is_held_for_it():
    off = dict(facts(1, "H100-80GB", mig_enabled=False), uuid="GPU-off")
    fleet = {"gpu-a": node_facts([two_3g(), off])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1}), pod("infer", "gpu-a", {MIG_3G: 1})]
    plan, selection = plan_round(fleet, {"1g.10gb": 7}, pods,
                                 {"gpu-a": read(held_by("train", HELD), held_by("infer", IDLE))})
    gpus = plan["nodes"]["gpu-a"]["gpus"]
    assert gpus[1]["mig_enabled"] and not gpus[1]["mig_enabled_before"]
    assert plan["nodes"]["gpu-a"]["evicted_pods"] == []     # the pods are on GPU 0, which keeps its mode
    decision = selection["nodes"]["gpu-a"]
    assert decision["decision"] == "held" and decision["mode_changes"] == [1] and decision["evicts"] == []


def test_a_whole_gpu_pod_keeps_its_gpu_whole_and_a_mode_change_would_name_it():
    off = dict(facts(0, "H100-80GB", mig_enabled=False), uuid="GPU-off")
    fleet = {"gpu-a": node_facts([off])}
    pods = [pod("whole", "gpu-a", {"nvidia.com/gpu": 1})]
    results = {"gpu-a": read(held_by("whole", "GPU-off", "nvidia.com/gpu"))}
    plan, selection = plan_round(fleet, {"1g.10gb": 1}, pods, results)
    assert plan["nodes"]["gpu-a"]["touched"] is False and selection["planned"] == []
    # The decision itself: a plan that turned MIG on there evicts the pod (GPU mode change).
    entry = {"touched": True, "gpus": [{"index": 0, "mig_enabled": True, "mig_enabled_before": False}]}
    maps = da.pod_maps(results, ["gpu-a"])
    found = da.node_evictions(entry, fleet["gpu-a"], maps["gpu-a"], pods, "gpu-a")
    assert found == [{"pod": "ml/whole", "reason": "GPU mode change", "detail": "GPU 0: its MIG mode changes"}]


def test_with_holders_marks_devices_and_whole_gpus_and_leaves_the_input_alone():
    fleet = {"gpu-a": {"gpuops_mig": node_facts([two_3g()])}, "gpu-b": node_facts([two_3g(uuid="GPU-b")])}
    before = copy.deepcopy(fleet)
    maps = da.pod_maps({"gpu-a": read(held_by("train", HELD), held_by("train", HELD), held_by("all", "GPU-aaaa")),
                        "gpu-b": UNREAD}, ["gpu-a", "gpu-b"])
    marked = da.with_holders(fleet, maps)
    assert fleet == before
    gpu = marked["gpu-a"]["gpus"][0]
    assert gpu["pods"] == ["ml/all/main"]
    cis = [gi["compute_instances"][0]["pods"] for gi in gpu["gpu_instances"]]
    assert cis == [["ml/train/main", "ml/all/main"], ["ml/all/main"]]
    assert marked["gpu-b"] is fleet["gpu-b"]


@pytest.mark.parametrize("result, why", [
    (None, "the node's pod map was not read (no facts from it)"),
    ({"skipped": True, "skip_reason": "Conditional result was False"},
     "the node's pod map was not read (Conditional result was False)"),
    ({"failed": True, "msg": "pynvml missing"}, "reading the node's pod map failed: pynvml missing"),
    ({"unreachable": True, "msg": "ssh: no route"}, "reading the node's pod map failed: ssh: no route"),
    (UNREAD, UNREAD["allocations_error"]),
])
def test_a_node_without_a_map_says_why(result, why):
    assert da.pod_maps({"gpu-a": result}, ["gpu-a"]) == {"gpu-a": {"allocations": None, "why": why}}


@pytest.mark.parametrize("results, message", [
    ([], "allocations must be a mapping of host to gpuops.mig.mig_node_info's result, got []"),
    ({"gpu-a": "yes"}, "allocations[gpu-a] must be gpuops.mig.mig_node_info's result, got 'yes'"),
    ({"gpu-a": {"allocations": "x"}}, "allocations[gpu-a].allocations must be a list, got 'x'"),
    ({"gpu-a": {"allocations": [{"device_uuid": HELD, "pod": "p"}]}},
     "allocations[gpu-a].allocations[0] must have device_uuid, namespace, pod, container as strings"),
])
def test_bad_pod_maps_are_refused_naming_the_host(results, message):
    with pytest.raises(RefusedError) as err:
        da.pod_maps(results, ["gpu-a"])
    assert str(err.value).startswith(message)


def test_the_planner_refuses_pods_that_are_not_holder_names():
    gpu = two_3g()
    gpu["gpu_instances"][0]["compute_instances"][0]["pods"] = "ml/train"
    with pytest.raises(_plan_demand.PlanInputError) as err:
        fp.plan_fleet({"gpu-a": node_facts([gpu])}, {"1g.10gb": 1})
    assert str(err.value) == ("gpu-a GPU 0 gpu_instances[0] compute_instances[0]: pods must be a list of "
                              "namespace/pod/container names, got 'ml/train'")


def test_an_idle_device_beside_a_held_one_stays_while_the_demand_fits_elsewhere():
    fleet = {"gpu-a": node_facts([two_3g()]), "gpu-b": node_facts([dict(facts(0, "H100-80GB"), uuid="GPU-b")])}
    pods = [pod("train", "gpu-a", {MIG_3G: 1})]
    plan, selection = plan_round(fleet, {"1g.10gb": 3}, pods, {"gpu-a": read(held_by("train", HELD)), "gpu-b": read()})
    assert plan["nodes"]["gpu-a"]["touched"] is False and plan["report"]["devices_destroyed"] == 0
    assert selection["apply"] == ["gpu-b"]
