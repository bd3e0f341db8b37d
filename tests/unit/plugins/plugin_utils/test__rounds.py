"""One round of the demand loop: the gate, which planned nodes change now and which are held (_rounds.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _rounds as r
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts, node_facts

MIG_3G = "nvidia.com/mig-3g.40gb"


def gpu(index=0, before=True, after=True, destroyed=0, created=1):
    return {"index": index, "mig_enabled_before": before, "mig_enabled": after, "changed": True,
            "destroyed": destroyed, "created": created}


def node(*gpus, touched=True, label="gpuops-plan-0000000001", supplies=None, **extra):
    return dict({"touched": touched, "config_label": label, "gpus": list(gpus), "supplies": supplies or {}}, **extra)


def running(name, on, resources):
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"nodeName": on, "containers": [
        {"name": "c", "resources": {"limits": resources}}]}, "status": {"phase": "Running"}}


PODS = [running("train", "busy", {MIG_3G: "1"}), running("web", "idle", {"cpu": "1"}),
        running("done", "idle", {MIG_3G: "1"})]
PODS[2]["status"]["phase"] = "Succeeded"


def plan(**nodes):
    return {"nodes": nodes, "report": {"demand": [{"request": "1g.10gb", "requested": 2, "met": 2, "unmet": 0}]}}


def test_safe_nodes_apply_and_evicting_or_mode_changing_ones_are_held():
    the_plan = plan(idle=node(gpu()), busy=node(gpu()), off=node(gpu(before=False)), same=node(gpu(), touched=False))
    out = r.select(the_plan, PODS, settings={"max_nodes": 5})
    assert out["apply"] == ["idle"] and out["held"] == ["busy", "off"] and out["planned"] == ["busy", "idle", "off"]
    assert out["nodes"]["idle"]["decision"] == "apply" and out["nodes"]["idle"]["evicts"] == []
    busy = out["nodes"]["busy"]
    assert busy["evicts"] == ["ml/train"]
    assert busy["reasons"][0] == ("evicts 1 running pod(s) (the node's GPU pods (the node is drained)): ml/train")
    assert out["nodes"]["off"]["mode_changes"] == [0]
    assert "a MIG mode change" in out["nodes"]["off"]["reasons"][0]
    assert out["approval_request"] == {"busy": "gpuops-plan-0000000001", "off": "gpuops-plan-0000000001"}
    assert out["asked"] == [{"request": "1g.10gb", "requested": 2, "met": 2, "unmet": 0}]


def test_the_plans_own_evicted_pods_list_wins_over_the_node_drain():
    the_plan = plan(busy=node(gpu(), evicted_pods=[]), idle=node(gpu(), evicted_pods=["ml/other"]))
    out = r.select(the_plan, PODS, settings={"max_nodes": 5})
    assert out["apply"] == ["busy"] and out["held"] == ["idle"]
    assert out["nodes"]["idle"]["reasons"][0] == "evicts 1 running pod(s) (the plan): ml/other"


def test_an_approval_for_the_same_layout_lets_a_held_node_change():
    the_plan = plan(busy=node(gpu(), label="gpuops-plan-aaaa"), off=node(gpu(before=False), label="gpuops-plan-bbbb"))
    out = r.select(the_plan, PODS, settings={"max_nodes": 5},
                   approvals={"approved": {"busy": "gpuops-plan-aaaa", "off": "gpuops-plan-older"}})
    assert out["apply"] == ["busy"] and out["held"] == ["off"]
    assert out["nodes"]["busy"]["reasons"][-1] == "approved by a person (config_label gpuops-plan-aaaa)"
    assert out["approval_request"] == {"off": "gpuops-plan-bbbb"}


def test_max_nodes_bounds_the_approved_changes_and_never_the_fast_ones():
    # a, b and c evict nobody (fast): all change at once, whatever max_nodes says.
    the_plan = plan(a=node(gpu(), supplies={"1g.10gb": 1}), b=node(gpu(), supplies={"1g.10gb": 3}),
                    c=node(gpu(), supplies={"1g.10gb": 2}))
    out = r.select(the_plan, [], settings={"max_nodes": 0, "serial": 1})
    assert out["apply"] == out["fast"] == ["a", "b", "c"] and out["held"] == []
    assert out["serial"] == 3   # nodes that evict nobody change together
    # Approved changes that evict pods: those that supply most first, at most max_nodes.
    busy = [running("p-%s" % n, n, {MIG_3G: "1"}) for n in "xyz"]
    the_plan = plan(x=node(gpu(), label="LX", supplies={"1g.10gb": 1}),
                    y=node(gpu(), label="LY", supplies={"1g.10gb": 3}),
                    z=node(gpu(), label="LZ", supplies={"1g.10gb": 2}), a=node(gpu()))
    out = r.select(the_plan, busy, settings={"max_nodes": 2, "serial": 1},
                   approvals={"x": "LX", "y": "LY", "z": "LZ"})
    assert out["apply"] == ["a", "y", "z"] and out["fast"] == ["a"] and out["held"] == ["x"]
    assert out["serial"] == 1   # approved nodes change serial at a time
    assert "over this round's limit of 2 change(s) that evict pods" in out["nodes"]["x"]["reasons"][-1]
    assert r.select(the_plan, busy, settings={"max_nodes": 0},
                    approvals={"x": "LX", "y": "LY", "z": "LZ"})["apply"] == ["a"]


def test_the_cooldown_holds_approved_changes_only():
    busy = [running("p-x", "x", {MIG_3G: "1"})]
    the_plan = plan(x=node(gpu(), label="LX"), a=node(gpu()))
    state = {"last_change": "2026-11-25T08:00:00Z"}
    out = r.select(the_plan, busy, settings={"max_nodes": 5, "cooldown": 300}, approvals={"x": "LX"},
                   state=state, now="2026-11-25T08:01:40Z")
    assert out["apply"] == ["a"] and out["held"] == ["x"] and out["cooldown"]["wait_seconds"] == 200
    assert out["nodes"]["x"]["reasons"][-1].startswith(
        "the cooldown holds changes that evict pods or change a MIG mode for 200 s more")
    later = r.select(the_plan, busy, settings={"max_nodes": 5, "cooldown": 300}, approvals={"x": "LX"},
                     state=state, now="2026-11-25T08:05:00Z")
    assert later["apply"] == ["a", "x"] and later["fast"] == ["a"]


def test_dry_run_applies_nothing_and_says_what_it_would_do():
    out = r.select(plan(idle=node(gpu()), busy=node(gpu())), PODS, settings={"max_nodes": 5, "dry_run": True})
    assert out["apply"] == [] and out["would_apply"] == ["idle"] and out["held"] == ["busy"]
    assert out["nodes"]["idle"]["decision"] == "dry-run"
    assert r.outcome_lines(out)[-1] == "round: 2 planned, 1 applied (dry run: none changed), 1 held"


def test_failed_and_unfinished_nodes_stay_held_even_when_approved():
    nodes = [{"metadata": {"name": "k8s-idle", "labels": {"nvidia.com/mig.config.state": "failed"}}}]
    the_plan = plan(idle=node(gpu(), label="L1"), other=node(gpu(), label="L2"))
    out = r.select(the_plan, [], nodes, settings={"max_nodes": 5, "k8s_node_names": {"idle": "k8s-idle"}},
                   approvals={"idle": "L1", "other": "L2"}, state={"unfinished": {"other": "round-7"}})
    assert out["apply"] == [] and out["held"] == ["idle", "other"]
    assert "nvidia.com/mig.config.state=failed" in out["nodes"]["idle"]["reasons"][0]
    assert out["nodes"]["other"]["reasons"][0].startswith("round round-7 did not finish changing this node")


def test_record_marks_nodes_unfinished_before_the_apply_and_clears_them_after():
    selection = {"apply": ["a", "b"], "nodes": {"a": {"fast": False}, "b": {"fast": True}}}
    before = r.record({"unfinished": {"z": "round-1"}}, "round-2", selection, False, now="2026-11-25T08:00:00Z")
    assert before == {"unfinished": {"z": "round-1", "a": "round-2", "b": "round-2"}, "last_round": "round-2",
                      "last_round_at": "2026-11-25T08:00:00Z", "last_change": "2026-11-25T08:00:00Z"}
    after = r.record(before, "round-2", selection, True, now="2026-11-25T08:05:00Z")
    assert after["unfinished"] == {"z": "round-1"} and after["last_change"] == "2026-11-25T08:05:00Z"
    quiet = r.record(after, "round-3", {"apply": []}, True, now="2026-11-25T09:00:00Z")
    assert quiet["last_change"] == "2026-11-25T08:05:00Z" and quiet["last_round"] == "round-3"
    # demand_round.yml's closing play records from the state the round read at its start: the
    # change counts.
    closing = r.record({"unfinished": {}}, "round-4", selection, True, now="2026-11-25T10:00:00Z")
    assert closing["last_change"] == "2026-11-25T10:00:00Z" and closing["unfinished"] == {}
    # Fast nodes alone (they destroyed only free devices) start no cooldown.
    fast = r.record({}, "round-5", {"apply": ["b"], "nodes": {"b": {"fast": True}}}, True,
                    now="2026-11-25T11:00:00Z")
    assert "last_change" not in fast and fast["unfinished"] == {}


def test_gate_waits_out_the_cooldown_after_a_change():
    state = {"last_change": "2026-11-25T08:00:00Z"}
    assert r.gate(state, 300, now="2026-11-25T08:01:40Z")["wait_seconds"] == 200
    assert r.gate(state, 300, now="2026-11-25T08:06:00Z")["wait_seconds"] == 0
    assert r.gate({}, 300)["wait_seconds"] == 0
    assert r.gate(state, 0, now="2026-11-25T08:00:01Z")["wait_seconds"] == 0


@pytest.mark.parametrize("call, message", [
    (lambda: r.gate({}, -1), "gpuops_mig_round_cooldown must not be negative, got -1"),
    (lambda: r.gate({}, "soon"), "gpuops_mig_round_cooldown must be a whole number of seconds, got 'soon'"),
    (lambda: r.select(plan(), settings={"max_nodes": True}), "gpuops_mig_round_max_nodes must be a whole number"),
    (lambda: r.select(plan(), settings={"dry_run": "yes"}), "gpuops_mig_round_dry_run must be true or false"),
    (lambda: r.select(plan(), approvals={"a": 3}), "approved[a] must be the config_label of the plan approved"),
    (lambda: r.select([1]), "the plan must be a mapping"),
])
def test_bad_round_input_is_refused_with_its_name(call, message):
    with pytest.raises(r.RoundError) as err:
        call()
    assert str(err.value).startswith(message)


# ----- the planner's side of "give back what is idle"
# --------------------------------------------------------

def h100(*gis, mig_enabled=True):
    return facts(0, "H100-80GB", list(gis), mig_enabled=mig_enabled)


def test_idle_devices_are_kept_while_no_demand_needs_their_slices():
    # gpu-a holds an idle 3g.40gb; gpu-b is empty. 1g.10gb demand fits on gpu-b: gpu-a is not
    # reshaped.
    fleet = {"gpu-a": node_facts([h100((1, "3g.40gb", 0, ()), (2, "3g.40gb", 4, ()))]),
             "gpu-b": node_facts([h100()])}
    the_plan = fp.plan_fleet(fleet, {"1g.10gb": 2})
    assert the_plan["nodes"]["gpu-a"]["touched"] is False
    assert the_plan["report"]["devices_destroyed"] == 0
    assert r.select(the_plan, [], settings={"max_nodes": 5})["apply"] == ["gpu-b"]


def test_idle_devices_are_reshaped_when_demand_needs_their_slices_but_allocated_ones_never():
    # One 3g.40gb runs a process (a pod holds it), the other is idle: the idle one becomes 3 x
    # 1g.10gb.
    fleet = {"gpu-a": node_facts([h100((1, "3g.40gb", 0, (4242,)), (2, "3g.40gb", 4, ()))])}
    the_plan = fp.plan_fleet(fleet, {"1g.10gb": 3}, in_use={"gpu-a": {"3g.40gb": 1}})
    gpu_a = the_plan["nodes"]["gpu-a"]["gpus"][0]
    assert gpu_a["after"] == {"1g.10gb": 3, "3g.40gb": 1} and gpu_a["destroyed"] == 1
    # Pods hold both (the second one allocated without a process yet): nothing goes, the demand is
    # unmet.
    held = fp.plan_fleet(fleet, {"1g.10gb": 4}, in_use={"gpu-a": {"3g.40gb": 2}})
    assert held["nodes"]["gpu-a"]["touched"] is False and held["report"]["unmet_devices"] == 4
    # More pods than processes: the planner cannot tell which device is free, so it keeps every
    # one.
    unsure = {"gpu-a": node_facts([h100((1, "3g.40gb", 0, ()), (2, "3g.40gb", 4, ()))])}
    kept = fp.plan_fleet(unsure, {"1g.10gb": 4}, in_use={"gpu-a": {"3g.40gb": 1}})
    assert kept["nodes"]["gpu-a"]["touched"] is False


def test_settings_take_every_documented_variable_and_their_defaults():
    """Issue 33: each gpuops_mig_round_* setting of docs/dynamic.md reaches the round as set (the
    rulebook renders its variables as text), the others keep their defaults."""
    assert r.settings({}) == {"max_nodes": 1, "cooldown": 300, "dry_run": False, "serial": 1,
                              "lease_duration": 900, "lease_wait": 0, "lease_namespace": "default",
                              "deploy_device_plugin": False}
    got = r.settings({"gpuops_mig_round_max_nodes": "4", "gpuops_mig_round_cooldown": "0",
                      "gpuops_mig_round_dry_run": "True", "gpuops_mig_round_serial": 4,
                      "gpuops_mig_round_lease_duration": 120, "gpuops_mig_round_lease_wait": "30",
                      "gpuops_mig_round_lease_namespace": "gpu-ops",
                      "gpuops_mig_round_deploy_device_plugin": True,
                      "gpuops_mig_round_dir": "", "gpuops_mig_round_event": {"waiting": 1}})
    assert got == {"max_nodes": 4, "cooldown": 0, "dry_run": True, "serial": 4,
                   "lease_duration": 120, "lease_wait": 30, "lease_namespace": "gpu-ops",
                   "deploy_device_plugin": True}
    assert r.settings({"gpuops_mig_round_serial": "25%"})["serial"] == "25%"
    assert set(r.settings({})) == set(r.SETTINGS)


@pytest.mark.parametrize("variables, message", [
    ({"gpuops_mig_round_cooldown": -5}, "gpuops_mig_round_cooldown must not be negative, got -5"),
    ({"gpuops_mig_round_max_nodes": "two"}, "gpuops_mig_round_max_nodes must be a whole number"),
    ({"gpuops_mig_round_dry_run": "maybe"}, "gpuops_mig_round_dry_run must be true or false"),
    ({"gpuops_mig_round_serial": 0}, "gpuops_mig_round_serial must be a number of nodes"),
    ({"gpuops_mig_round_serial": "150%"}, "gpuops_mig_round_serial must be a number of nodes"),
    ({"gpuops_mig_round_lease_duration": 0}, "gpuops_mig_round_lease_duration must be at least 1"),
    ({"gpuops_mig_round_lease_wait": [1]}, "gpuops_mig_round_lease_wait must be a whole number"),
    ({"gpuops_mig_round_lease_namespace": 5}, "gpuops_mig_round_lease_namespace must be a name"),
    ({"gpuops_mig_round_maxnodes": 2}, "unknown round variable.s. gpuops_mig_round_maxnodes"),
    # Issue 36: ASCII digits only (int() takes all of these).
    ({"gpuops_mig_round_max_nodes": " 4"}, "gpuops_mig_round_max_nodes must be a whole number"),
    ({"gpuops_mig_round_max_nodes": "4\n"}, "gpuops_mig_round_max_nodes must be a whole number"),
    ({"gpuops_mig_round_max_nodes": "\uff14"}, "gpuops_mig_round_max_nodes must be a whole"),
    ({"gpuops_mig_round_cooldown": "\u0663\u0660\u0660"}, "gpuops_mig_round_cooldown must be"),
    ({"gpuops_mig_round_cooldown": "1_000"}, "gpuops_mig_round_cooldown must be a whole number"),
    ({"gpuops_mig_round_lease_wait": "+30"}, "gpuops_mig_round_lease_wait must be a whole number"),
    ({"gpuops_mig_round_lease_duration": 2.5}, "gpuops_mig_round_lease_duration must be a whole"),
])
def test_bad_settings_are_refused_naming_the_variable(variables, message):
    with pytest.raises(r.RoundError, match=message):
        r.settings(variables)


def failed_node(name):
    return {"metadata": {"name": name, "labels": {r.FAILED_STATE_LABEL: "failed"}}}


def test_the_planner_is_not_offered_the_nodes_the_round_would_hold():
    """Issue 33: a node whose last change failed, or that an earlier round left unfinished, is held
    by the selection whatever its plan; the planner must give the demand to another node."""
    state = {"unfinished": {"gpu-c": "round-1"}}
    nodes = [failed_node("gpu-a"), {"metadata": {"name": "gpu-b"}}]
    assert r.plan_policy({}, ["gpu-a", "gpu-b", "gpu-c"], nodes, state) == {"nodes": ["gpu-b"]}
    assert r.plan_policy({"nodes": ["gpu-a", "gpu-b"], "spare": {"1g.10gb": 1}},
                         ["gpu-a", "gpu-b", "gpu-c"], nodes, state) == {
        "nodes": ["gpu-b"], "spare": {"1g.10gb": 1}}
    # nothing held: as given
    assert r.plan_policy({"spare": {}}, ["gpu-b"], [], {}) == {"spare": {}}
    both = r.blocked([failed_node("gpu-c")], state)["gpu-c"]
    assert [why.split(" ")[0] for why in both] == ["the", "round"]


def test_a_failed_round_leaves_unfinished_only_the_nodes_that_failed():
    """Issue 33: the apply goes on past a failed node; the round's closing record keeps that node
    unfinished, takes out the nodes it changed and the ones it never reached, and says so."""
    selection = {"apply": ["gpu-a", "gpu-b", "gpu-c"], "planned": ["gpu-a", "gpu-b", "gpu-c"],
                 "held": [], "nodes": dict((n, {"decision": "apply", "destroyed": 0, "created": 1,
                                                "reasons": []})
                                           for n in ("gpu-a", "gpu-b", "gpu-c"))}
    before = r.record({}, "round-2", selection, False, now="2026-11-25T10:00:00Z")
    assert sorted(before["unfinished"]) == ["gpu-a", "gpu-b", "gpu-c"]
    after = r.record({}, "round-2", selection, True, now="2026-11-25T10:05:00Z", failed=["gpu-b"])
    assert after["unfinished"] == {"gpu-b": "round-2"}
    assert after["last_change"] == "2026-11-25T10:05:00Z"
    lines = r.outcome_lines(selection, {"gpu-b": "gpu-b: the layout step failed"})
    assert lines[1].startswith("gpu-b                failed   destroys 0, creates 1: gpu-b: the "
                               "layout")
    assert lines[-1] == ("round: 3 planned, 2 applied, 0 held, 1 failed (gpu-b): held until a "
                         "person clears them")


def test_demand_no_gpu_can_meet_is_reported_naming_who_asks():
    selection = r.select({"nodes": {}, "report": {"unresolved": [
        {"request": "9g.900gb", "count": 1, "reason": "no GPU of the fleet offers 9g.900gb",
         "sources": ["ml/wants-huge"]}]}})
    assert selection["apply"] == [] and selection["planned"] == []
    assert r.outcome_lines(selection)[0] == ("not planned: 9g.900gb x1, no GPU of the fleet "
                                             "offers 9g.900gb; asked by ml/wants-huge")


def _refused(*reasons, **extra):
    """mig_config's failed result: one refusal per reason; allocated ones name a pod's device."""
    refusals = [{"gpu": i, "reason": reason, "message": "...",
                 "devices": [{"uuid": "MIG-%d" % i, "device": "1g.10gb",
                              "pods": ["ml/late-%d/main" % i]}] if reason == "allocated" else []}
                for i, reason in enumerate(reasons)]
    return dict({"failed": True, "changed": False, "msg": "Nothing was changed. ...",
                 "refusals": refusals}, **extra)


def test_a_refusal_only_for_pods_bound_after_the_plan_defers_a_round_node():
    """Issue 33, item 4: in a round (the node in gpuops_mig_round_apply), mig_config's refusal
    whose only obstacle is devices that pods got after the plan, with nothing changed, defers the
    node: its labels go back as they were, the pods are named. Anything else fails it as before."""
    labels = {"nvidia.com/mig.config": "all-1g", "nvidia.com/mig.config.state": "success",
              "x": "y"}
    names = ["nvidia.com/mig.config", "nvidia.com/mig.config.state", "absent"]
    round_groups = ["gpu_nodes", r.APPLY_GROUP, "gpuops_mig_changing"]
    got = r.deferral(_refused("allocated", "allocated"), round_groups, False, labels, names)
    assert got["deferred"] is True and got["pods"] == ["ml/late-0", "ml/late-1"]
    assert got["devices"] == ["MIG-0", "MIG-1"]
    assert got["labels"] == {"nvidia.com/mig.config": "all-1g",
                             "nvidia.com/mig.config.state": "success", "absent": None}
    assert "ml/late-0, ml/late-1" in got["why"] and "next round" in got["why"]
    not_deferred = [
        (_refused("allocated"), ["gpu_nodes", "gpuops_mig_changing"], False),   # a plain rollout
        (_refused("allocated", "other"), round_groups, False),                   # a second cause
        (_refused("allocated"), round_groups, True),                  # a mode change first
        (_refused("allocated", changed=True), round_groups, False),
        (_refused("allocated", failed_part_way=[{"index": 0}]), round_groups, False),
        (_refused(), round_groups, False),                                       # no refusals
        ({"failed": True, "msg": "the device plugin did not come back"}, round_groups, False),
        (None, round_groups, False),
    ]
    for result, groups, changed in not_deferred:
        got = r.deferral(result, groups, changed, labels, names)
        assert got["deferred"] is False and got["why"] == "", (result, groups, changed)


def test_a_deferred_node_is_reported_finished_and_not_a_change():
    """Issue 33, item 4: the round reads the deferred nodes from the rollout's rows, reports them
    with the pods, records them finished (the next round plans them) and no change for the
    cooldown."""
    why = "pod(s) default/late got MIG device(s) MIG-0 after the plan"
    rows = {"gpu-a": {"outcome": "changed"}, "gpu-c": None,
            "gpu-b": {"outcome": "deferred", "deferred": {"pods": ["default/late"], "why": why}}}
    deferred = r.deferred_nodes(rows)
    assert deferred == {"gpu-b": {"pods": ["default/late"], "why": why}}
    selection = {"planned": ["gpu-b"], "apply": ["gpu-b"], "held": [],
                 "nodes": {"gpu-b": {"decision": "apply", "destroyed": 1, "created": 1,
                                     "reasons": []}}}
    # demand_round.yml's closing: one call, the deferred nodes read from the reports it is given.
    closing = r.round_record({}, "round-3", selection, True, {}, rows, now="2026-11-25T10:05:00Z")
    assert closing["deferred"] == deferred
    state = closing["state"]
    assert state["unfinished"] == {} and "last_change" not in state
    lines = closing["lines"]
    assert lines == r.outcome_lines(selection, {}, deferred)
    assert lines[0].startswith("gpu-b                deferred destroys 1, creates 1: pod(s) "
                               "default/late")
    assert lines[-1] == ("round: 1 planned, 0 applied, 0 held, 1 deferred (gpu-b): planned again "
                         "next round")


def test_round_record_opens_and_closes_a_round_as_record_and_outcome_lines_do():
    """demand_round.yml calls mig_round_record once at its opening and once at its closing: the
    state, lines and deferred nodes are those of record, outcome_lines and deferred_nodes."""
    selection = {"apply": ["gpu-a", "gpu-b", "gpu-c"], "planned": ["gpu-a", "gpu-b", "gpu-c"],
                 "held": [], "nodes": dict((n, {"decision": "apply", "destroyed": 0, "created": 1,
                                                "reasons": [], "fast": n == "gpu-c"})
                                           for n in ("gpu-a", "gpu-b", "gpu-c"))}
    start = {"unfinished": {"z": "round-1"}, "last_change": "2026-11-25T08:00:00Z"}
    opening = r.round_record(start, "round-2", selection, False, now="2026-11-25T10:00:00Z")
    assert opening == {
        "state": r.record(start, "round-2", selection, False, now="2026-11-25T10:00:00Z"),
        "lines": r.outcome_lines(selection), "deferred": {}}
    failed = {"gpu-b": "gpu-b: the layout step failed"}
    rows = {"gpu-a": {"outcome": "deferred", "deferred": {"pods": ["ml/late"], "why": "late"}},
            "gpu-b": None, "gpu-c": {"outcome": "changed"}}
    closing = r.round_record(start, "round-2", selection, True, failed, rows,
                             now="2026-11-25T10:05:00Z")
    deferred = {"gpu-a": {"pods": ["ml/late"], "why": "late"}}
    assert closing == {
        "state": r.record(start, "round-2", selection, True, now="2026-11-25T10:05:00Z",
                          failed=["gpu-b"], deferred=["gpu-a"]),
        "lines": r.outcome_lines(selection, failed, deferred), "deferred": deferred}
    # gpu-b failed: still unfinished, a change for the cooldown; gpu-a deferred, gpu-c done.
    assert closing["state"]["unfinished"] == {"z": "round-1", "gpu-b": "round-2"}
    assert closing["state"]["last_change"] == "2026-11-25T10:05:00Z"
    assert closing["lines"][-1] == ("round: 3 planned, 1 applied, 0 held, 1 failed (gpu-b): held "
                                    "until a person clears them, 1 deferred (gpu-a): planned "
                                    "again next round")
    with pytest.raises(r.RoundError, match="the failed nodes must be a mapping"):
        r.round_record(start, "round-2", selection, True, ["gpu-b"])
