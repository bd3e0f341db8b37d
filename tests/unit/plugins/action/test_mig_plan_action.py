"""gpuops.mig.mig_plan's action: arguments as a playbook gives them (tagged by ansible-core 2.19) plan, and
odd ones are refused with a message naming the option; never a traceback."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.action.mig_plan import ActionModule
from ansible_collections.gpuops.mig.tests.unit.plugins.action.odd_input import (
    ODD,
    assert_refused,
    odd_variant,
    run_action,
    tagged,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.hypothesis_budget import BUDGET
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.test__fleet_plan_input import (
    FLEET,
    GOOD_DEMAND,
    GOOD_PODS,
    GOOD_POLICY,
    GROUPS,
    assert_valid_plan,
)

REFUSED = "MIG plan refused, nothing planned"


def test_tagged_arguments_plan_and_the_result_dumps_as_yaml():
    result = run_action(ActionModule, tagged({"demand": {"1g.10gb": 2}, "fleet": FLEET, "node_groups": GROUPS,
                                              "policy": GOOD_POLICY, "pods": GOOD_PODS}))
    assert not result.get("failed"), result
    assert_valid_plan(result["plan"])
    assert yaml.safe_load(yaml.safe_dump(result["vars"])) == result["vars"]


def test_shared_pods_plan_devices_from_their_replicas():
    pods = [{"metadata": {"name": "p%d" % i, "namespace": "ml"}, "status": {"phase": "Pending"},
             "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb.shared": 1}}}]}}
            for i in range(5)]
    result = run_action(ActionModule, tagged({"fleet": FLEET, "node_groups": GROUPS, "pods": pods,
                                              "sharing": {"1g.10gb": {"replicas": 4, "rename": True}}}))
    assert not result.get("failed"), result
    assert result["plan"]["report"]["unresolved"] == []
    assert [(d["request"], d["requested"]) for d in result["plan"]["report"]["demand"]] == [("1g.10gb", 2)]


WORKLOADS = [
    {"metadata": {"name": "train", "namespace": "ml"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending"}]},
     "spec": {"podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": [
         {"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}]}}}]}},
    {"metadata": {"name": "broken", "namespace": "ml"},
     "spec": {"podSets": [{"name": "main", "count": "two", "template": {"spec": {"containers": []}}}]}},
]


def test_workloads_waiting_for_admission_are_demand_and_a_broken_one_a_warning():
    result = run_action(ActionModule, tagged({"fleet": FLEET, "node_groups": GROUPS, "workloads": WORKLOADS,
                                              "pods": GOOD_PODS[1:]}))
    assert not result.get("failed"), result
    assert [(d["request"], d["requested"]) for d in result["report"]["demand"]] == [("1g.10gb", 2)]
    warning = ("Kueue Workload ml/broken skipped, its demand is not counted: pod set main: count must be a whole "
               "number from 0 to 2147483647, got 'two'")
    assert result["warnings"] == [warning] and result["table"][-1] == "warning: " + warning
    # Without pods (pods not read) the Workloads are still demand.
    alone = run_action(ActionModule, tagged({"fleet": FLEET, "node_groups": GROUPS, "workloads": WORKLOADS[:1]}))
    assert [(d["request"], d["requested"]) for d in alone["report"]["demand"]] == [("1g.10gb", 2)]
    assert "warnings" not in alone


def test_pod_maps_say_whom_each_nodes_change_evicts():
    # a's 3g.40gb runs pod q (mig_node_info's allocations); b's kubelet could not be read.
    allocations = {"a": {"allocations": [{"device_uuid": "MIG-H100-80GB-0-1", "namespace": "default", "pod": "q",
                                          "container": "c", "resource": "nvidia.com/mig-3g.40gb"}],
                         "allocations_error": None},
                   "b": {"allocations": None, "allocations_error": "no socket"}}
    result = run_action(ActionModule, tagged({"fleet": FLEET, "node_groups": GROUPS, "pods": GOOD_PODS,
                                              "allocations": allocations}))
    assert not result.get("failed"), result
    nodes = result["plan"]["nodes"]
    assert nodes["a"]["evicted_pods"] == [] and nodes["b"]["pod_map_unknown"] == "no socket"
    assert result["report"]["busy_devices_kept"][0]["pods"] == ["default/q/c"]


def test_facts_and_groups_from_the_inventory():
    hostvars = tagged(dict((host, {"ansible_facts": {"gpuops_mig": facts}}) for host, facts in FLEET.items()))
    task_vars = {"hostvars": hostvars, "ansible_play_hosts_all": ["a", "b"], "groups": tagged(GROUPS)}
    result = run_action(ActionModule, tagged({"demand": GOOD_DEMAND}), task_vars)
    assert not result.get("failed"), result
    assert result["report"]["demand_met"] is True


@pytest.mark.parametrize("args, fragment", [
    ({"demand": 5}, "demand must be a mapping of MIG profile to count, or a list of items; got 5"),
    ({"demand": "1g.10gb"}, "demand must be a mapping of MIG profile to count, or a list of items; got '1g.10gb'"),
    ({"demand": {"1g.10gb": 1}, "pods": "p"}, "pods must be a list of pod manifests"),
    ({"demand": {"1g.10gb": 1}, "pods": [5]}, "pods[0] must be a mapping, got 5"),
    ({"demand": {"1g.10gb": 1}, "workloads": {"a": 1}}, "workloads must be a list of Kueue Workload manifests"),
    ({"demand": {"1g.10gb": 1}, "policy": "nodes=a"}, "policy must be a mapping (nodes, spare, whole_gpus, "
                                                      "skip_unreachable), got 'nodes=a'"),
    ({"demand": {"1g.10gb": 1}, "hosts": "a,b"}, "hosts must be a list of inventory host names, got 'a,b'"),
    ({"demand": {"1g.10gb": 1}, "node_groups": {"g": "a"}}, "node_groups['g'] must be a list, got 'a'"),
    ({"demand": {"1g.10gb": 1}, "k8s_node_names": {"k": 5}}, "k8s_node_names['k'] must be a non-empty string, got 5"),
    ({"demand": {"1g.10gb": 1}, "single_profile": 5}, "single_profile must be a string, got 5"),
    ({"demand": {"1g.10gb": 1}, "config_label_prefix": ""}, "config_label_prefix must be 1 to 52 letters"),
    ({"demand": {"1g.10gb": 1}, "exact_limit": -1}, "exact_limit must be a non-negative integer"),
    ({"demand": {"1g.10gb": -1}}, "count must be a non-negative integer, got -1"),
    ({"demand": {"1g.10gb": 1}, "allocations": ["a"]},
     "allocations must be a mapping of host to gpuops.mig.mig_node_info's result, got ['a']"),
    ({"demand": {"1g.10gb": 1}, "allocations": {"a": {"allocations": [{"pod": "q"}]}}},
     "allocations[a].allocations[0] must have device_uuid, namespace, pod, container as strings"),
    ({"pods": [], "sharing": {"1g.10gb": {"strategy": "mps", "replicas": 2}}},
     "sharing, profile 1g.10gb: MPS cannot share MIG devices"),
])
def test_odd_arguments_are_refused_naming_the_option(args, fragment):
    args = dict({"fleet": FLEET, "node_groups": GROUPS}, **args)
    assert_refused(run_action(ActionModule, tagged(args)), REFUSED, fragment)


def assert_plan_or_refusal(outcome):
    if outcome.get("failed"):
        # Ansible's own argument check (an unknown option, "x" for an int...) raises AnsibleActionFail.
        assert_refused(outcome, *(() if outcome.get("raised") else (REFUSED,)))
        return
    assert_valid_plan(outcome["plan"])
    yaml.safe_dump(outcome["vars"])


ARGS = {"demand": GOOD_DEMAND, "fleet": FLEET, "node_groups": GROUPS, "policy": GOOD_POLICY, "pods": GOOD_PODS,
        "workloads": WORKLOADS,
        "strategy": "mixed", "exact_limit": 1000, "config_label_prefix": "gpuops-plan", "k8s_node_names": {},
        "allocations": {"a": {"allocations": [], "allocations_error": None}}}


@BUDGET
@given(args=st.one_of(odd_variant(ARGS), odd_variant(dict(ARGS, strategy="single", single_profile="1g.10gb")),
                      st.dictionaries(st.sampled_from(sorted(ARGS)), ODD, max_size=4)),
       as_tagged=st.booleans())
def test_any_arguments_give_a_valid_plan_or_a_refusal(args, as_tagged):
    if not isinstance(args, dict):
        args = {"demand": args}
    if "fleet" not in args and "hosts" not in args:
        args["fleet"] = FLEET
    assert_plan_or_refusal(run_action(ActionModule, tagged(args) if as_tagged else args))
