"""The fleet planner: examples, bad input, and property tests against an independent oracle."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as plan_demand
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import validate_target
from ansible_collections.gpuops.mig.plugins.module_utils._migparted import entries_from_layouts, load_config
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import (
    FLEET_MODELS,
    facts,
    node_facts,
    nos_greedy,
    oracle,
    random_demand,
    random_fleet,
)

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def disruption(plan):
    r = plan["report"]
    return r["unmet_devices"], r["nodes_touched_count"], r["devices_destroyed"]


def check_invariants(fleet, plan, demand=None):
    """Legal layouts, busy devices kept, untouched nodes unchanged, demand met or reported."""
    supplied = {}
    for node, data in plan["nodes"].items():
        entries_from_layouts(data["layouts"])                       # the roles accept the layouts
        config = load_config(plan["mig_parted"][node]).select(data["config_label"])
        assert len(config) == len(data["layouts"])
        gpus = dict((g["index"], g) for g in fleet[node]["gpus"])
        changed = False
        for info in data["gpus"]:
            gpu = gpus[info["index"]]
            model = [m for m in FLEET_MODELS if facts(0, m)["pci_device_id"] == gpu["pci_device_id"]][0]
            geometry = FLEET_MODELS[model]
            if info["mig_enabled"]:
                validate_target(geometry, info["after"])             # legal for its model
            busy = {}
            for gi in gpu["gpu_instances"]:
                for ci in gi["compute_instances"]:
                    if ci["processes"]:
                        busy[ci["profile"]] = busy.get(ci["profile"], 0) + 1
            for name, count in busy.items():
                assert info["after"].get(name, 0) >= count, (node, info)
            if not info["changed"]:
                assert info["after"] == info["before"]
            changed = changed or info["changed"]
            for name, count in info["after"].items():
                supplied[name] = supplied.get(name, 0) + count - busy.get(name, 0)
        assert data["touched"] == changed
    report = plan["report"]
    for row in report["demand"]:
        assert row["met"] + row["unmet"] == row["requested"]
        if not row["request"].startswith(">="):
            assert row["met"] <= supplied.get(row["request"].split(" on ")[0], 0)
        if demand is not None and row["unmet"]:
            assert "reason" in row
    assert report["demand_met"] == (report["unmet_devices"] == 0)
    assert set(report["nodes_touched"]) == set(n for n, d in plan["nodes"].items() if d["touched"])


# -- examples -------------------------------------------------------------------------------------

def h100_with_busy_3g():
    return facts(0, "H100-80GB", [(1, "3g.40gb", 4, (4242,))])


def test_demand_that_fits_on_one_node_touches_one_node_and_keeps_the_busy_device():
    fleet = {"a": node_facts([h100_with_busy_3g()]), "b": node_facts([h100_with_busy_3g()])}
    plan = fp.plan_fleet(fleet, {"1g.10gb": 3})
    check_invariants(fleet, plan)
    assert disruption(plan) == (0, 1, 0)
    touched = plan["report"]["nodes_touched"][0]
    assert plan["nodes"][touched]["layouts"] == [{"gpus": [0], "mig_enabled": True,
                                                  "devices": {"1g.10gb": 3, "3g.40gb": 1}}]
    assert [d["pids"] for d in plan["report"]["busy_devices_kept"]] == [[4242], [4242]]


def test_free_devices_that_exist_already_serve_the_demand_without_touching_anything():
    fleet = {"a": node_facts([facts(0, "H100-80GB", [(1, "1g.10gb", 0, ()), (2, "1g.10gb", 1, ())])])}
    plan = fp.plan_fleet(fleet, {"1g.10gb": 2})
    assert disruption(plan) == (0, 0, 0)
    assert plan["nodes"]["a"]["touched"] is False


def test_fewest_nodes_before_fewest_destroyed_devices():
    # Node a has room without destroying anything for 2 of the 4; node b can give all 4 by destroying one.
    a = node_facts([facts(0, "H100-80GB", [(1, "4g.40gb", 0, (1,)), (2, "1g.10gb", 4, ()), (3, "1g.10gb", 5, ())])])
    b = node_facts([facts(0, "H100-80GB", [(1, "3g.40gb", 0, ())])])
    fleet = {"a": a, "b": b}
    plan = fp.plan_fleet(fleet, {"2g.20gb": 2})
    check_invariants(fleet, plan)
    assert plan["report"]["nodes_touched_count"] == 1
    assert oracle(fleet, {"2g.20gb": 2}) == disruption(plan)


def test_unmeetable_demand_plans_what_fits_and_reports_the_rest():
    fleet = {"a": node_facts([facts(0, "A30", [])])}
    plan = fp.plan_fleet(fleet, {"1g.6gb": 6})
    check_invariants(fleet, plan, {"1g.6gb": 6})
    row = plan["report"]["demand"][0]
    assert (row["met"], row["unmet"]) == (4, 2) and "no room" in row["reason"]
    assert plan["report"]["demand_met"] is False


def test_size_demand_maps_to_the_smallest_fitting_profile_per_model():
    fleet = {"a": node_facts([facts(0, "A30", [])]), "h": node_facts([facts(0, "H100-80GB", [])])}
    plan = fp.plan_fleet(fleet, [{"memory_gib": 10, "compute_slices": 1, "count": 5}])
    check_invariants(fleet, plan)
    # A30: 2g.12gb (no 1g has 10 GiB); H100: 1g.10gb.
    after = dict((n, d["gpus"][0]["after"]) for n, d in plan["nodes"].items())
    assert set(after["a"]) <= {"2g.12gb"} and set(after["h"]) <= {"1g.10gb"}
    assert plan["report"]["demand"][0]["met"] == 5


def test_group_demand_only_uses_the_group_nodes():
    fleet = {"a": node_facts([facts(0, "H100-80GB", [])]), "b": node_facts([facts(0, "H100-80GB", [])])}
    plan = fp.plan_fleet(fleet, [{"profile": "3g.40gb", "count": 1, "group": "inference"}],
                         node_groups={"inference": ["b"]})
    assert plan["report"]["nodes_touched"] == ["b"]


def test_policy_nodes_spare_and_whole_gpus():
    fleet = {"a": node_facts([facts(0, "H100-80GB", mig_enabled=False), facts(1, "H100-80GB", mig_enabled=False)]),
             "b": node_facts([facts(0, "H100-80GB", [])])}
    plan = fp.plan_fleet(fleet, {"3g.40gb": 2}, policy={"nodes": ["a"], "whole_gpus": 1, "spare": {"1g.10gb": 1}})
    check_invariants(fleet, plan)
    assert plan["nodes"]["b"]["touched"] is False
    whole = plan["report"]["gpus_left_whole"]
    assert len(whole) == 1 and whole[0]["node"] == "a"
    assert plan["report"]["demand"][0]["met"] == 2
    spare = [r for r in plan["report"]["demand"] if r["request"] == "1g.10gb"][0]
    assert spare["requested"] == 0 and spare["spare"] == 1 and spare["spare_met"] == 0
    assert plan["report"]["spare_unmet_devices"] == 1


def test_kubernetes_in_use_floor_keeps_the_devices_of_that_profile():
    fleet = {"a": node_facts([facts(0, "H100-80GB", [(1, "3g.40gb", 0, ()), (2, "3g.40gb", 4, ())])])}
    plan = fp.plan_fleet(fleet, {"7g.80gb": 1}, in_use={"a": {"3g.40gb": 1}})
    assert plan["nodes"]["a"]["gpus"][0]["after"] == {"3g.40gb": 2}
    assert plan["report"]["unmet_devices"] == 1


def test_disabled_gpu_is_enabled_and_counts_as_touched():
    fleet = {"a": node_facts([facts(0, "A100-40GB", mig_enabled=False)])}
    plan = fp.plan_fleet(fleet, {"3g.20gb": 2})
    assert plan["nodes"]["a"]["layouts"] == [{"gpus": [0], "mig_enabled": True, "devices": {"3g.20gb": 2}}]
    assert plan["report"]["nodes_touched"] == ["a"]


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("demand, message", [
    ({"9g.99gb": 1}, "no GPU in the fleet offers MIG profile 9g.99gb"),
    ({"1g.10gb": -1}, "must be a non-negative integer, got -1"),
    ({"1g.10gb": 1.5}, "must be a non-negative integer, got 1.5"),
    ({"1g.10gb": True}, "must be a non-negative integer, got True"),
    ([{"memory_gib": 500, "count": 1}], "no MIG profile of any GPU in the fleet has 500 GiB"),
    ([{"profile": "1g.10gb", "memory_gib": 5}], "not both"),
    ([{"count": 1}], "needs a profile"),
    ([{"profile": "1g.10gb", "group": "nope"}], "unknown node group 'nope'"),
    ("1g.10gb", "demand must be a mapping"),
])
def test_bad_demand_is_refused_with_a_clear_message(demand, message):
    fleet = {"a": node_facts([facts(0, "H100-80GB", [])])}
    with pytest.raises(plan_demand.PlanInputError, match=message.replace(".", r"\.").replace("(", r"\(")):
        fp.plan_fleet(fleet, demand)


def test_empty_fleet_and_unreachable_nodes():
    with pytest.raises(plan_demand.PlanInputError, match="the fleet is empty"):
        fp.plan_fleet({}, {"1g.10gb": 1})
    fleet = {"a": node_facts([facts(0, "H100-80GB", [])]), "down": None}
    with pytest.raises(plan_demand.PlanInputError, match="no MIG facts from down"):
        fp.plan_fleet(fleet, {"1g.10gb": 1})
    plan = fp.plan_fleet(fleet, {"1g.10gb": 1}, policy={"skip_unreachable": True})
    assert plan["report"]["skipped_nodes"][0]["node"] == "down" and "down" not in plan["nodes"]
    with pytest.raises(plan_demand.PlanInputError, match="policy: unknown key"):
        fp.plan_fleet(fleet, {}, policy={"nodez": []})
    with pytest.raises(plan_demand.PlanInputError, match="policy nodes names ghost"):
        fp.plan_fleet(fleet, {}, policy={"nodes": ["ghost"], "skip_unreachable": True})


# -- properties -----------------------------------------------------------------------------------

@PROPERTY
@given(seed=st.integers(0, 10 ** 6))
def test_property_exact_plan_is_safe_legal_and_as_good_as_the_oracle(seed):
    rng = random.Random(seed)
    fleet = random_fleet(rng, nodes=(1, 3), gpus=(1, 3))
    demand = random_demand(rng, fleet, most=4)
    plan = fp.plan_fleet(fleet, demand)
    check_invariants(fleet, plan, demand)
    assert plan["report"]["method"] == "exact"
    assert disruption(plan) == oracle(fleet, demand)


@PROPERTY
@given(seed=st.integers(0, 10 ** 6))
def test_property_greedy_plan_is_safe_and_legal(seed):
    rng = random.Random(seed)
    fleet = random_fleet(rng, nodes=(1, 4), gpus=(1, 4))
    demand = random_demand(rng, fleet)
    plan = fp.plan_fleet(fleet, demand, exact_limit=0)
    check_invariants(fleet, plan, demand)
    assert plan["report"]["method"] == "greedy"
    best = oracle(fleet, demand)
    assert disruption(plan)[0] >= best[0]
    assert plan["report"]["nodes_touched_lower_bound"] <= max(best[1], plan["report"]["nodes_touched_count"])


def test_nos_greedy_baseline_is_never_better_than_the_oracle():
    for seed in range(5):
        rng = random.Random(seed)
        fleet = random_fleet(rng, nodes=(1, 3), gpus=(1, 3))
        demand = random_demand(rng, fleet, most=4)
        assert nos_greedy(fleet, demand) >= oracle(fleet, demand)
