"""The fleet planner refuses odd demand, policy, options, pods and facts with a message naming them
(PlanInputError), and plans from anything else; never another exception."""

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as plan_demand
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_output as plan_output
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.tests.unit.plugins.action.odd_input import ODD, odd_variant
from ansible_collections.gpuops.mig.tests.unit.plugins.hypothesis_budget import BUDGET
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts, node_facts

FLEET = {"a": node_facts([facts(0, "H100-80GB", [(1, "3g.40gb", 4, (4242,))]),
                          facts(1, "A100-40GB", mig_enabled=False)]),
         "b": node_facts([facts(0, "A30", [])])}
GROUPS = {"inference": ["a"], "all": ["a", "b"]}


def plan(demand=None, **kw):
    kw.setdefault("node_groups", GROUPS)
    return fp.plan_fleet(FLEET, demand or {}, **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(exact_limit=-1), "exact_limit must be a non-negative integer (0: the heuristic at once), got -1"),
    (dict(exact_limit=True), "exact_limit must be a non-negative integer (0: the heuristic at once), got True"),
    (dict(exact_limit="5"), "exact_limit must be a non-negative integer (0: the heuristic at once), got '5'"),
    (dict(config_label_prefix=""), "config_label_prefix must be 1 to 52 letters, digits, '-', '_' or '.', "
                                   "starting with a letter or digit (it begins a Kubernetes label value), got ''"),
    (dict(config_label_prefix="-x"), "config_label_prefix must be 1 to 52"),
    (dict(config_label_prefix="a b"), "got 'a b'"),
    (dict(config_label_prefix="x" * 53), "config_label_prefix must be 1 to 52"),
    (dict(policy="nodes"), "policy must be a mapping (nodes, spare, whole_gpus, skip_unreachable), got 'nodes'"),
    (dict(policy={3: 1}), "policy: unknown key(s) 3"),
    (dict(policy={"skip_unreachable": "false"}), "policy skip_unreachable must be true or false, got 'false'"),
    (dict(policy={"nodes": "a"}), "policy nodes must be a list of node names, got 'a'"),
    (dict(policy={"nodes": [["a"]]}), "policy nodes must be a list of node names, got [['a']]"),
    (dict(policy={"whole_gpus": -2}), "policy whole_gpus: count must be a non-negative integer, got -2"),
    (dict(policy={"spare": {"1g.10gb": "²"}}), "policy spare 1g.10gb: count must be a non-negative integer, got '²'"),
    (dict(policy={"spare": {5: 1}}), "policy spare: keys must be MIG profile names, got 5"),
    (dict(node_groups="all"), "node_groups must be a mapping of group name to a list of hosts, got 'all'"),
    (dict(node_groups={"g": "ab"}), "node_groups['g'] must be a list of host names, got 'ab'"),
    (dict(whole_pending=-1), "pending whole-GPU requests: count must be a non-negative integer, got -1"),
])
def test_odd_options_are_refused_naming_them(kw, message):
    with pytest.raises(plan_demand.PlanInputError) as raised:
        plan({"1g.10gb": 1}, **kw)
    assert message in str(raised.value)


def test_exact_limit_zero_goes_to_the_heuristic_at_once():
    assert plan({"1g.10gb": 1}, exact_limit=0)["report"]["method"] == "greedy"
    assert plan({"1g.10gb": 1})["report"]["method"] == "exact"


@pytest.mark.parametrize("demand, message", [
    (5, "demand must be a mapping of MIG profile to count, or a list of items; got 5"),
    ([5], "demand[0]: an item must be a mapping, got 5"),
    ({"1g.10gb": "1.5"}, "count must be a non-negative integer, got '1.5'"),
    ({"1g.10gb": "9" * 5000}, "count must be a non-negative integer, got '999"),
    ({5: 1}, "demand[0]: profile must be a MIG profile name such as 1g.10gb, got 5"),
    ([{"memory_gib": float("nan")}], "memory_gib must be a number above 0 and at most 1048576, got nan"),
    ([{"memory_gib": float("inf")}], "got inf"),
    ([{"memory_gib": 10 ** 300}], "memory_gib must be a number above 0 and at most 1048576"),
    ([{"memory_gib": 5, "compute_slices": 10 ** 20}], "compute_slices must be an integer from 1 to 64"),
    ([{"profile": "1g.10gb", "group": ["all"]}], "demand[0]: unknown node group ['all']"),
    ([{"profile": "1g.10gb", "nodes": "a"}], "demand[0]: nodes must be a list of node names, got 'a'"),
    ([{"profile": "1g.10gb", "strict": "no"}], "demand[0]: strict must be true or false, got 'no'"),
    ([{"profile": "1g.10gb", "spare": 1}], "demand[0]: spare must be true or false, got 1"),
    ([{"profile": "1g.10gb", "source": {"a": 1}}], "demand[0]: source must be a string"),
    ([{"profile": "1g.10gb", 7: 1}], "demand[0]: unknown key(s) 7"),
    ({"\x1b[2J": 1}, "'\\x1b[2J'"),
])
def test_odd_demand_is_refused_naming_the_item(demand, message):
    with pytest.raises(plan_demand.PlanInputError) as raised:
        plan(demand)
    assert message in str(raised.value)
    assert "\x1b" not in str(raised.value)


def test_huge_counts_are_planned_as_unmet_not_refused():
    report = plan({"1g.10gb": 10 ** 30}, policy={"whole_gpus": 10 ** 20})["report"]
    assert report["demand_met"] is False and report["unmet_devices"] > 10 ** 29


def gpu_a(change):
    gpus = copy.deepcopy(FLEET["a"]["gpus"])
    change(gpus[0])
    return dict(FLEET, a=node_facts(gpus))


@pytest.mark.parametrize("fleet, message", [
    ("a", "the fleet is empty"),
    ({5: FLEET["a"]}, "fleet: node names must be non-empty printable strings, got 5"),
    (dict(FLEET, a={"gpus": [5]}), "a gpus[0] must be a mapping (a GPU of gpuops.mig.mig_facts), got 5"),
    (dict(FLEET, a={"gpus": [], "driver": "x"}), "a: driver in the facts must be a mapping, got 'x'"),
    (gpu_a(lambda g: g.update(index="0")), "a gpus[0]: index must be a non-negative integer, got '0'"),
    (gpu_a(lambda g: g.update(mig_enabled="yes")), "a GPU 0: mig_enabled must be true or false, got 'yes'"),
    (gpu_a(lambda g: g.update(pci_device_id="0xZZ")), "a GPU 0: pci_device_id must be a PCI device ID"),
    (gpu_a(lambda g: g.update(supported_profiles="bad")), "a GPU 0: supported_profiles must be a list"),
    (gpu_a(lambda g: g.update(gpu_instances={"x": 1})), "a GPU 0: gpu_instances must be a list, got {'x': 1}"),
    (gpu_a(lambda g: g.update(gpu_instances=[{"id": 1}])),
     "a GPU 0 gpu_instances[0]: profile_id must be a non-negative integer, got None"),
    (gpu_a(lambda g: g.update(gpu_instances=[dict(g["gpu_instances"][0], placement={"start": 3})])),
     "a GPU 0: its MIG layout in the facts is not one this GPU can have: GI 1 (3g.40gb @3:4): start 3 is not a "
     "legal placement"),
    (gpu_a(lambda g: g["gpu_instances"][0]["compute_instances"][0].update(processes=[{"pid": "x"}])),
     "compute_instances[0]: processes must be a list of {pid: integer}"),
    (gpu_a(lambda g: g.update(mig_devices=[1])), "a GPU 0: mig_devices must be a mapping"),
])
def test_odd_facts_are_refused_naming_node_and_gpu(fleet, message):
    with pytest.raises(plan_demand.PlanInputError) as raised:
        fp.plan_fleet(fleet, {"1g.10gb": 1})
    assert message in str(raised.value)


@pytest.mark.parametrize("pods, kw, message", [
    ("x", {}, "pods must be a list of pod manifests, got 'x'"),
    ([{"spec": "x"}], {}, "pod default/?: spec must be a mapping, got 'x'"),
    ([{"metadata": {"name": "p"}, "spec": {"containers": {"a": 1}}}], {}, "pod default/p: spec.containers must be a list"),
    ([{"spec": {"containers": [5]}}], {}, "each container must be a mapping, got 5"),
    ([{"spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1.5"}}}]}}], {},
     "asks for nvidia.com/mig-1g.10gb '1.5', which is not a whole number"),
    ([{"spec": {"nodeName": ["a"], "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}], {},
     "spec.nodeName must be a string, got ['a']"),
    ([], {"node_names": {"k": 5}}, "k8s_node_names must be a mapping of Kubernetes node name to inventory host"),
    ([], {"single_profile": ""}, "single_profile must be a MIG profile name such as 1g.10gb, got ''"),
    ([], {"strategy": ["mixed"]}, "strategy must be mixed or single, got ['mixed']"),
])
def test_odd_pods_are_refused_naming_the_pod(pods, kw, message):
    with pytest.raises(plan_demand.PlanInputError) as raised:
        plan_demand.demand_from_pods(pods, fleet=FLEET, **kw)
    assert message in str(raised.value)


GOOD_DEMAND = [{"profile": "1g.10gb", "count": 2, "group": "inference"}, {"memory_gib": 20, "compute_slices": 2},
               {"profile": "1g.6gb", "count": 1, "nodes": ["b"]}]
GOOD_POLICY = {"nodes": ["a", "b"], "spare": {"1g.10gb": 1}, "whole_gpus": 0, "skip_unreachable": False}
GOOD_PODS = [{"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Pending"},
              "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-MIG-1g.10gb"},
                       "containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/gpu": "1"}}}]}},
             {"metadata": {"name": "q"}, "status": {"phase": "Running"},
              "spec": {"nodeName": "a", "containers": [{"resources": {"requests": {"nvidia.com/mig-3g.40gb": 1}}}]}}]


def assert_valid_plan(result):
    """Every node's layouts are inline layouts mig_config's parser takes; the report adds up."""
    for node, data in result["nodes"].items():
        migparted.entries_from_layouts(data["layouts"], origin=node)
        assert data["config_label"].startswith(data["config_label"].split("-")[0])
    report = result["report"]
    assert report["unmet_devices"] == sum(row["unmet"] for row in report["demand"]) + sum(
        item["count"] for item in report["unresolved"])
    plan_output.plan_table(result)
    plan_output.vars_file_data(result)


def plan_or_refusal(demand, policy, exact_limit, prefix, pods, strategy, single_profile):
    try:
        items, in_use, whole_pending, unresolved = plan_demand.demand_from_pods(pods, strategy, {}, single_profile, FLEET)
        result = fp.plan_fleet(FLEET, plan_demand.demand_items(demand) + items, policy=policy, in_use=in_use,
                               node_groups=GROUPS, exact_limit=exact_limit, unresolved=unresolved,
                               whole_pending=whole_pending, config_label_prefix=prefix)
    except plan_demand.PlanInputError as e:
        assert str(e)
        return None
    assert_valid_plan(result)
    return result


@BUDGET
@given(demand=st.one_of(odd_variant(GOOD_DEMAND), odd_variant({"1g.10gb": 2, "3g.40gb": 1}), ODD),
       policy=st.one_of(odd_variant(GOOD_POLICY), ODD),
       exact_limit=st.one_of(st.integers(min_value=-5, max_value=10 ** 6), ODD),
       prefix=st.one_of(st.just("gpuops-plan"), st.from_regex(r"\A[A-Za-z0-9][-_.a-z0-9]{0,60}\Z"), ODD),
       pods=st.one_of(odd_variant(GOOD_PODS), ODD),
       strategy=st.sampled_from(["mixed", "single", "other", None, 5]),
       single_profile=st.one_of(st.none(), st.just("1g.10gb"), ODD))
def test_any_demand_and_policy_give_a_valid_plan_or_a_refusal(demand, policy, exact_limit, prefix, pods, strategy,
                                                              single_profile):
    plan_or_refusal(demand, policy, exact_limit, prefix, pods, strategy, single_profile)


@BUDGET
@given(fleet=odd_variant(FLEET))
def test_any_fleet_facts_give_a_valid_plan_or_a_refusal(fleet):
    try:
        result = fp.plan_fleet(fleet, GOOD_DEMAND, node_groups=GROUPS)
    except plan_demand.PlanInputError as e:
        assert str(e)
        return
    assert_valid_plan(result)


def claim(name, profile=None, count=1, allocated=False, version="v1", device_class="mig.nvidia.com", mode=None):
    body = {"deviceClassName": device_class}
    if profile:
        body["selectors"] = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '%s'" % profile}}]
    if count is not None:
        body["count"] = count
    if mode:
        body["allocationMode"] = mode
    request = dict(name="mig", **({"exactly": body} if version == "v1" else body))
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"devices": {"requests": [request]}},
            "status": {"allocation": {"devices": {"results": []}}} if allocated else {}}


def test_pending_claims_of_nvidia_mig_device_class_are_demand():
    items, unresolved = plan_demand.demand_from_claims([
        claim("a", "1g.10gb", 2), claim("b", "1g.10gb", version="v1beta1"), claim("c", "3g.40gb"),
        claim("done", "1g.10gb", allocated=True), claim("whole", device_class="gpu.nvidia.com"),
        claim("any"), claim("all", "1g.10gb", count=None, mode="All")])
    assert items == [{"profile": "1g.10gb", "count": 3, "strict": False, "source": "claim ml/a, claim ml/b"},
                     {"profile": "3g.40gb", "count": 1, "strict": False, "source": "claim ml/c"}]
    assert [u["sources"] for u in unresolved] == [["claim ml/any"], ["claim ml/all"]]
    with pytest.raises(plan_demand.PlanInputError, match="claim ml/x: spec must be a mapping"):
        plan_demand.demand_from_claims([{"metadata": {"name": "x", "namespace": "ml"}, "spec": []}])
