"""The fleet planner's demand from the cluster: pending pods (both strategies, time-sliced resources) and what
running pods hold. Demand items and their refusals: test__fleet_plan.py, test__fleet_plan_input.py."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as plan_demand
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts, node_facts


def pod(name, resources, node=None, phase="Pending", selector=None):
    spec = {"containers": [{"name": "c", "resources": {"limits": resources}}]}
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}


def test_pods_mixed_strategy():
    pods = [pod("p1", {"nvidia.com/mig-1g.10gb": "2"}), pod("p2", {"nvidia.com/mig-1g.5gb.me": 1}),
            pod("run", {"nvidia.com/mig-3g.40gb": 1}, node="a", phase="Running"),
            pod("done", {"nvidia.com/mig-3g.40gb": 1}, phase="Succeeded"),
            pod("whole", {"nvidia.com/gpu": 1}), pod("cpu", {"cpu": 1})]
    items, in_use, whole, unresolved = plan_demand.demand_from_pods(pods)
    assert [(i["profile"], i["count"]) for i in items] == [("1g.10gb", 2), ("1g.5gb+me", 1)]
    assert in_use == {"a": {"3g.40gb": 1}} and whole == 1 and unresolved == []
    fleet = {"a": node_facts([facts(0, "H100-80GB", [(1, "3g.40gb", 0, ())])])}
    plan = fp.plan_fleet(fleet, items, in_use=in_use, whole_pending=whole)
    # 1g.5gb+me is not on an H100: reported, never dropped.
    assert [u["request"] for u in plan["report"]["unresolved"]] == ["1g.5gb+me"]
    assert plan["report"]["unresolved"][0]["sources"] == ["ml/p2"]
    assert plan["report"]["unmet_devices"] == 1


def test_pods_single_strategy():
    pods = [pod("p1", {"nvidia.com/gpu": 2}, selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}),
            pod("p2", {"nvidia.com/gpu": 1})]
    items, in_use, whole, unresolved = plan_demand.demand_from_pods(pods, strategy="single")
    assert [(i["profile"], i["count"]) for i in items] == [("1g.5gb", 2)]
    assert unresolved[0]["sources"] == ["ml/p2"] and whole == 0
    items, dummy, dummy, unresolved = plan_demand.demand_from_pods(pods, strategy="single", single_profile="3g.20gb")
    assert sorted((i["profile"], i["count"]) for i in items) == [("1g.5gb", 2), ("3g.20gb", 1)]
    with pytest.raises(plan_demand.PlanInputError, match="strategy must be mixed or single"):
        plan_demand.demand_from_pods(pods, strategy="none")


def test_shared_resource_names_are_their_profiles():
    assert plan_demand.profile_from_resource("nvidia.com/mig-1g.10gb.shared") == "1g.10gb"
    assert plan_demand.profile_from_resource("nvidia.com/mig-1g.5gb.me.shared") == "1g.5gb+me"
    assert plan_demand.profile_from_resource("nvidia.com/mig-1g.5gb.me") == "1g.5gb+me"


def test_pods_time_sliced_replicas_become_devices():
    pods = [pod("p%d" % i, {"nvidia.com/mig-1g.10gb.shared": 1}) for i in range(5)] + [
        pod("plain", {"nvidia.com/mig-1g.10gb": 2}),            # not renamed, the same profile: replicas too
        pod("r1", {"nvidia.com/mig-1g.10gb.shared": 1}, node="a", phase="Running"),
        pod("r2", {"nvidia.com/mig-1g.10gb.shared": 2}, node="a", phase="Running"),
        pod("big", {"nvidia.com/mig-3g.40gb": 1})]
    fleet = {"a": node_facts([facts(0, "H100-80GB", [(1, "1g.10gb", 0, ()), (2, "1g.10gb", 1, ())])])}
    items, in_use, whole, unresolved = plan_demand.demand_from_pods(pods, fleet=fleet, replicas={"1g.10gb": 4})
    # 7 pending replicas at 4 per device: 2 devices; 3 running replicas spread over at most the node's 2 devices.
    assert [(i["profile"], i["count"]) for i in items] == [("1g.10gb", 2), ("3g.40gb", 1)]
    assert in_use == {"a": {"1g.10gb": 2}} and unresolved == [] and whole == 0
    assert "ml/p0" in items[0]["source"] and "ml/plain" in items[0]["source"]


def test_pods_shared_without_replicas_are_unresolved():
    pods = [pod("p", {"nvidia.com/mig-1g.10gb.shared": 3}), pod("w", {"nvidia.com/gpu.shared": 1})]
    items, in_use, whole, unresolved = plan_demand.demand_from_pods(pods)
    assert items == [] and whole == 0
    assert [(u["request"], u["count"]) for u in unresolved] == [
        ("nvidia.com/mig-1g.10gb.shared", 3), ("nvidia.com/gpu.shared", 1)]
    assert "replicas" in unresolved[0]["reason"] and "whole GPUs" in unresolved[1]["reason"]
    with pytest.raises(plan_demand.PlanInputError, match="sharing 1g.10gb: replicas must be a whole number"):
        plan_demand.demand_from_pods(pods, replicas={"1g.10gb": True})


def test_pods_single_strategy_shared():
    pods = [pod("p%d" % i, {"nvidia.com/gpu.shared": 1},
                selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}) for i in range(3)]
    items, dummy, dummy, unresolved = plan_demand.demand_from_pods(pods, strategy="single", replicas={"1g.5gb": 2})
    assert [(i["profile"], i["count"]) for i in items] == [("1g.5gb", 2)] and unresolved == []
