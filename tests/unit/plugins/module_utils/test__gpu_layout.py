# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
    CiProfile,
    ComputeInstance,
    GiProfile,
    GpuGeometry,
    GpuInstance,
    GpuPlan,
    LayoutError,
    PinnedGi,
    check_plan,
    describe_layout,
    device_counts,
    largest_free_range,
    layout_as_list,
    normalize_target,
    plan_as_dict,
    plan_gpu,
    validate_layout,
    validate_target,
)

from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import (
    A30,
    A100_40GB,
    B200,
    GB200,
    H100_80GB,
    MODELS,
    assert_plan_valid,
    counts_of,
    exhaustive_best,
    exhaustive_best_evictions,
    free_run,
    layouts,
    make_gi,
    profile_by_name,
    targets,
)

A100 = A100_40GB
BALANCED = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def starts(geometry, gpu_instances):
    return sorted((geometry.gi_profile(g.profile_id).name, g.start) for g in gpu_instances)


def all_1g(geometry=A100, name="1g.5gb"):
    return [make_gi(geometry, i + 1, name, i) for i in range(7)]


# --------------------------------------------------------------------------
# Examples that matter (mig-facts.md §0, §2.3, §7)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("order", [
    ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],   # -cgi 19,19,14,9: Insufficient Resources in mig-parted
    ["3g.20gb", "1g.5gb", "2g.10gb", "1g.5gb"],
    ["2g.10gb", "1g.5gb", "3g.20gb", "1g.5gb"],
])
def test_creation_orders_that_trip_mig_parted_all_plan(order):
    target = {}
    for name in order:
        target[name] = target.get(name, 0) + 1
    plan = plan_gpu(A100, [], target)
    assert_plan_valid(A100, [], target, plan)
    # The 3g must sit at 4 so the small ones fit at 0..3; every placement is explicit.
    assert ("3g.20gb", 4) in starts(A100, plan.create)
    assert plan.destroyed_devices == 0 and plan.created_devices == 4


def test_driver_placed_small_instances_first_are_kept():
    # What `-cgi 19,19` leaves behind (1g at 0 and 1): add 2g and 3g around them.
    existing = [make_gi(A100, 7, "1g.5gb", 0), make_gi(A100, 8, "1g.5gb", 1)]
    plan = plan_gpu(A100, existing, BALANCED)
    assert_plan_valid(A100, existing, BALANCED, plan)
    assert [g.gi_id for g in plan.keep] == [7, 8]
    assert starts(A100, plan.create) == [("2g.10gb", 2), ("3g.20gb", 4)]


def test_all_1g_to_balanced_keeps_two_1g_devices():
    existing = all_1g()
    plan = plan_gpu(A100, existing, BALANCED)
    assert_plan_valid(A100, existing, BALANCED, plan)
    assert plan.destroyed_devices == 5 and plan.created_devices == 2
    assert len(plan.keep) == 2
    assert exhaustive_best(A100, existing, BALANCED) == (0, 5, 0)
    # Deterministic tie-break: the lowest-placed GIs stay.
    assert [g.gi_id for g in plan.keep] == [1, 2]


def test_busy_3g_is_kept_when_the_new_layout_has_a_3g():
    existing = [make_gi(A100, 1, "1g.5gb", 0), make_gi(A100, 2, "1g.5gb", 1), make_gi(A100, 3, "2g.10gb", 2),
                make_gi(A100, 4, "3g.20gb", 4, [("3g.20gb", 0, (4242,))])]
    target = {"3g.20gb": 1, "2g.10gb": 2}
    plan = plan_gpu(A100, existing, target)
    assert_plan_valid(A100, existing, target, plan)
    assert [g.gi_id for g in plan.keep] == [3, 4]
    assert sorted(g.gi_id for g in plan.destroy) == [1, 2]
    assert starts(A100, plan.create) == [("2g.10gb", 0)]


def test_busy_device_that_must_go_is_named():
    existing = [make_gi(A100, 5, "3g.20gb", 4, [("3g.20gb", 0, (1234, 5678))]), make_gi(A100, 6, "3g.20gb", 0)]
    with pytest.raises(LayoutError) as err:
        plan_gpu(A100, existing, {"7g.40gb": 1})
    text = str(err.value)
    for part in ("GI 5", "3g.20gb @4:4", "CI 0", "1234", "5678", "force"):
        assert part in text
    assert "GI 6" not in text   # idle devices are not blamed
    plan = plan_gpu(A100, existing, {"7g.40gb": 1}, force=True)
    assert_plan_valid(A100, existing, {"7g.40gb": 1}, plan, force=True)
    assert plan.destroyed_devices == 2


def test_force_still_spares_busy_devices_when_it_can():
    existing = [make_gi(A100, 1, "3g.20gb", 0, [("3g.20gb", 0, (99,))]), make_gi(A100, 2, "3g.20gb", 4)]
    plan = plan_gpu(A100, existing, {"3g.20gb": 1, "1g.5gb": 3}, force=True)
    assert [g.gi_id for g in plan.keep] == [1]
    assert [g.gi_id for g in plan.destroy] == [2]


@pytest.mark.parametrize("target, words", [
    ({"4g.20gb": 2}, ["4g.20gb x2", "at most 1"]),
    ({"3g.20gb": 2, "1g.5gb": 1}, ["no placement can hold", "3g.20gb x2", "1g.5gb x1"]),
    ({"4g.20gb": 1, "2g.10gb": 2}, ["8 SM slices", "has 7"]),
    ({"1c.3g.20gb": 7}, ["1c.3g.20gb x7", "3 GPU instances of 3g.20gb", "at most 2"]),
    ({"7g.40gb": 1, "1g.5gb+me": 1}, ["8 SM slices"]),
])
def test_impossible_targets_are_rejected_with_a_clear_message(target, words):
    with pytest.raises(LayoutError) as err:
        plan_gpu(A100, [], target)
    for word in words:
        assert word in str(err.value)


def test_unknown_profile_lists_the_valid_ones():
    with pytest.raises(LayoutError) as err:
        plan_gpu(A100, [], {"3g.40gb": 1})
    text = str(err.value)
    assert "'3g.40gb'" in text
    for name in A100.device_names():
        assert name in text
    assert "1c.3g.20gb" in text and "7g.40gb" in text


@pytest.mark.parametrize("name", ["1G.5GB", "1g.5gb ", "MIG 1g.5gb", "1g.5gb+ME", "3c.3g.20gb"])
def test_names_are_exact(name):
    with pytest.raises(LayoutError):
        normalize_target(A100, {name: 1})


def test_aliases_resolve_to_the_canonical_name():
    target = {"1g.24gb": 2, "1g.23gb": 1, "1c.3g.95gb": 2, "7g.189gb": 0}
    assert normalize_target(GB200, target) == {"1g.23gb": 3, "1c.3g.93gb": 2}
    existing = [make_gi(GB200, 1, "1g.23gb", 0)]
    plan = plan_gpu(GB200, existing, target)
    assert [g.gi_id for g in plan.keep] == [1]
    assert device_counts(GB200, plan.result) == {"1g.23gb": 3, "1c.3g.93gb": 2}


@pytest.mark.parametrize("count", [-1, 1.0, "2", True, None])
def test_bad_counts(count):
    with pytest.raises(LayoutError, match="non-negative integer"):
        plan_gpu(A100, [], {"1g.5gb": count})


def test_target_must_be_a_mapping():
    with pytest.raises(LayoutError, match="mapping"):
        plan_gpu(A100, [], [("1g.5gb", 1)])


def test_same_layout_is_not_changed():
    existing = [make_gi(A100, 3, "3g.20gb", 0, [("1c.3g.20gb", 0, ()), ("2c.3g.20gb", 1, (7,))]),
                make_gi(A100, 4, "2g.10gb", 4), make_gi(A100, 9, "1g.5gb", 6)]
    target = {"1c.3g.20gb": 1, "2c.3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}
    # A mixed GI cannot be created (one compute profile per new GI), so this target
    # is not reachable from an empty GPU ...
    with pytest.raises(LayoutError):
        plan_gpu(A100, [], target)
    # ... but it still rules out this one.
    target = {"2g.10gb": 1, "1g.5gb": 1, "1c.3g.20gb": 2}
    plan = plan_gpu(A100, existing[1:], target)
    assert plan.changed
    target = device_counts(A100, existing[1:])
    plan = plan_gpu(A100, existing[1:], target)
    assert not plan.changed and plan.result == tuple(existing[1:])


def test_compute_instance_forms_pack_into_full_gpu_instances():
    plan = plan_gpu(A100, [], {"1c.3g.20gb": 4})
    sizes = sorted(len(g.compute_instances) for g in plan.create)
    assert sizes == [1, 3]
    plan = plan_gpu(A100, [], {"2c.7g.40gb": 3})
    assert [[ci.start for ci in g.compute_instances] for g in plan.create] == [[0, 2, 4]]


def test_compute_instances_are_reshaped_inside_a_kept_gi():
    cis = [("1c.3g.20gb", 0, ()), ("1c.3g.20gb", 1, (77,)), ("1c.3g.20gb", 2, ())]
    existing = [make_gi(A100, 2, "3g.20gb", 4, cis)]
    plan = plan_gpu(A100, existing, {"1c.3g.20gb": 2})
    assert_plan_valid(A100, existing, {"1c.3g.20gb": 2}, plan)
    assert plan.destroyed_devices == 1 and not plan.destroy and not plan.create
    (change,) = plan.change
    assert not change.destroy[0].pids
    # Growing it back fills the free SM slice instead of making a new GI.
    grown = plan_gpu(A100, [plan.result[0]], {"1c.3g.20gb": 3})
    assert grown.created_devices == 1 and not grown.create


def test_half_made_gi_is_filled_or_removed():
    empty_3g = GpuInstance(4, profile_by_name(A100, "3g.20gb").id, 4, ())
    plan = plan_gpu(A100, [empty_3g], {"3g.20gb": 1})
    assert_plan_valid(A100, [empty_3g], {"3g.20gb": 1}, plan)
    assert [c.gi.gi_id for c in plan.change] == [4] and plan.destroyed_devices == 0
    plan = plan_gpu(A100, [empty_3g], {"1g.5gb": 1})
    assert [g.gi_id for g in plan.destroy] == [4]
    assert all(g.compute_instances for g in plan.result)


def test_free_range_tie_break_keeps_room_for_a_big_profile():
    plan = plan_gpu(A100, [], {"1g.5gb": 2})
    assert largest_free_range(A100, plan.result) == 6
    existing = [make_gi(A100, 1, "1g.5gb", 3), make_gi(A100, 2, "1g.5gb", 4)]
    # Two devices must go either way; keep the one that leaves 4..7 free for a 3g.
    plan = plan_gpu(A100, existing, {"1g.5gb": 1})
    assert [g.gi_id for g in plan.keep] == [1]
    assert largest_free_range(A100, plan.result) == 4


def test_a30_and_emptying_a_gpu():
    existing = [make_gi(A30, 1, "2g.12gb", 0), make_gi(A30, 2, "1g.6gb", 2), make_gi(A30, 3, "1g.6gb", 3)]
    plan = plan_gpu(A30, existing, {"2g.12gb": 2})
    assert [g.gi_id for g in plan.keep] == [1] and starts(A30, plan.create) == [("2g.12gb", 2)]
    plan = plan_gpu(A30, existing, {})
    assert not plan.result and plan.destroyed_devices == 3


def test_existing_layout_is_checked():
    overlapping = [make_gi(A100, 1, "3g.20gb", 0), make_gi(A100, 2, "2g.10gb", 2)]
    with pytest.raises(LayoutError, match="overlaps"):
        plan_gpu(A100, overlapping, {})
    with pytest.raises(LayoutError, match="ids"):
        plan_gpu(A100, [GpuInstance(None, 9, 0, ())], {})
    with pytest.raises(LayoutError, match="profile ID 77"):
        plan_gpu(A100, [GpuInstance(1, 77, 0, ())], {})
    with pytest.raises(LayoutError, match="not a legal placement"):
        plan_gpu(A100, [GpuInstance(1, 9, 2, ((0, 2, 0, ()),))], {})
    with pytest.raises(LayoutError, match="unique"):
        plan_gpu(A100, [make_gi(A100, 1, "1g.5gb", 0), make_gi(A100, 1, "1g.5gb", 1)], {})


def test_compute_profile_without_placements_is_rejected():
    gi = GiProfile(9, "3g.20gb", 4, 3, 2, (0, 4), (CiProfile(2, 3, 1, (0,), "3g.20gb"),
                                                   CiProfile(0, 1, 3, (), "1c.3g.20gb")))
    geometry = GpuGeometry(8, 7, (gi,))
    with pytest.raises(LayoutError, match="no usable placement"):
        plan_gpu(geometry, [], {"1c.3g.20gb": 1})
    assert plan_gpu(geometry, [], {"3g.20gb": 2}).created_devices == 2


def test_plain_tuples_are_accepted_for_compute_instances():
    gi = GpuInstance(1, 9, 0, [(3, 0, 0, [11]), (2, 0, 1, ())])
    assert [ci.ci_id for ci in gi.compute_instances] == [3, 2]
    assert gi.compute_instances[0].busy and not gi.compute_instances[1].busy


def test_views():
    existing = [make_gi(A100, 1, "3g.20gb", 0),
                make_gi(A100, 2, "3g.20gb", 4, [("1c.3g.20gb", 0, (5,)), ("1c.3g.20gb", 2, ())])]
    text = describe_layout(A100, existing)
    assert text == ("GI 1  3g.20gb @0:4  [CI 0 3g.20gb MIG-1-0]\n"
                    "GI 2  3g.20gb @4:4  [CI 0 1c.3g.20gb @0:1 MIG-2-0 (pids 5), CI 1 1c.3g.20gb @2:1 MIG-2-1]\n")
    assert describe_layout(A100, []) == ""
    assert device_counts(A100, existing) == {"3g.20gb": 1, "1c.3g.20gb": 2}
    plan = plan_gpu(A100, existing, {"1c.3g.20gb": 3, "2g.10gb": 1})
    assert "GI new  2g.10gb @0:2  [CI new 2g.10gb]" in describe_layout(A100, plan.result)
    data = plan_as_dict(A100, plan)
    json.dumps(data)
    assert data["destroyed_devices"] == 1 and data["created_devices"] == 2
    assert data["change"][0]["create"][0]["placement"] == {"start": 1, "size": 1}
    assert data["create"][0]["placement"] == {"start": 0, "size": 2}
    assert layout_as_list(A100, plan.result)[1]["compute_instances"][0]["uuid"] == "MIG-2-0"


def test_check_plan_catches_broken_plans():
    # 2g.10gb only goes at 0, 2, 4, so the busy 3g at 4 stays and the idle one at 0 goes.
    existing = [make_gi(A100, 1, "3g.20gb", 0), make_gi(A100, 2, "3g.20gb", 4, [("3g.20gb", 0, (1,))])]
    target = {"3g.20gb": 1, "2g.10gb": 2}
    plan = plan_gpu(A100, existing, target)
    check_plan(A100, existing, target, plan)
    assert [g.gi_id for g in plan.keep] == [2]
    new_2g = plan.create[0]
    assert (new_2g.profile_id, new_2g.start) == (14, 0)
    broken = [
        dataclasses.replace(plan, create=plan.create[:1], result=plan.result[:-1]),             # count short
        dataclasses.replace(plan, create=(dataclasses.replace(new_2g, start=2),) + plan.create[1:],
                            result=tuple(g if g != new_2g else dataclasses.replace(new_2g, start=2)
                                         for g in plan.result)),                                 # overlap
        dataclasses.replace(plan, keep=(), destroy=plan.destroy + plan.keep,
                            create=plan.create + (GpuInstance(None, 9, 4, ((None, 2, 0, ()),)),),
                            result=tuple(g for g in plan.result if g.gi_id is None)
                            + (GpuInstance(None, 9, 4, ((None, 2, 0, ()),)),)),                  # busy destroyed
        dataclasses.replace(plan, destroy=()),                                                    # GI unaccounted
        dataclasses.replace(plan, keep=(dataclasses.replace(plan.keep[0], start=0),)),            # kept GI altered
    ]
    for bad in broken:
        with pytest.raises(LayoutError):
            check_plan(A100, existing, target, bad)
    check_plan(A100, existing, target, broken[2], force=True)


def test_geometry_is_checked():
    ci = CiProfile(0, 1, 1, (0,), "1g.5gb")
    with pytest.raises(LayoutError, match="twice"):
        GpuGeometry(8, 7, (GiProfile(19, "1g.5gb", 1, 1, 7, range(7), (ci,)),
                           GiProfile(19, "1g.6gb", 1, 1, 7, range(7), (ci,))))
    with pytest.raises(LayoutError, match="outside"):
        GpuGeometry(4, 4, (GiProfile(0, "7g.40gb", 8, 4, 1, (0,), ()),))
    with pytest.raises(LayoutError, match="outside"):
        GpuGeometry(8, 7, (GiProfile(19, "1g.5gb", 1, 1, 7, range(7), (CiProfile(0, 1, 1, (1,), "1g.5gb"),)),))
    with pytest.raises(LayoutError, match="two GPU instance profiles"):
        GpuGeometry(8, 7, (GiProfile(19, "1g.5gb", 1, 1, 7, range(7), (ci,)),
                           GiProfile(20, "1g.5gb", 1, 1, 1, range(7), (ci,))))


def test_validate_layout_rejects_empty_gis_only_when_asked():
    empty = [GpuInstance(1, 9, 0, ())]
    validate_layout(A100, empty)
    with pytest.raises(LayoutError, match="no compute instance"):
        validate_layout(A100, empty, allow_empty_gis=False)


def test_planning_does_not_depend_on_input_order():
    rng = random.Random(7)
    existing = all_1g()
    target = {"2g.10gb": 2, "1g.5gb": 3}
    first = plan_gpu(A100, existing, target)
    for dummy in range(5):
        rng.shuffle(existing)
        items = list(target.items())
        rng.shuffle(items)
        assert plan_gpu(A100, existing, dict(items)) == first


# --------------------------------------------------------------------------
# Properties, for every GPU model in mig-facts.md §1
# --------------------------------------------------------------------------

def _with_ids(plan):
    """The result as the GPU would report it after the plan ran (ids assigned)."""
    gis = []
    next_gi = 500
    for g in plan.result:
        cis = []
        for k, ci in enumerate(g.compute_instances):
            cis.append(ci if ci.ci_id is not None else ComputeInstance(100 + k, ci.profile_id, ci.start))
        if g.gi_id is None:
            next_gi += 1
        gis.append(GpuInstance(g.gi_id if g.gi_id is not None else next_gi, g.profile_id, g.start, tuple(cis)))
    return gis


@pytest.mark.parametrize("model", sorted(MODELS))
@PROPERTY
@given(data=st.data())
def test_every_plan_is_valid_and_destroys_no_more_than_the_exhaustive_minimum(model, data):
    geometry = MODELS[model]
    existing = data.draw(layouts(geometry), label="existing")
    target = data.draw(targets(geometry, near=existing), label="target")
    force = data.draw(st.booleans(), label="force")
    try:
        plan = plan_gpu(geometry, existing, target, force=force)
    except LayoutError as err:
        if exhaustive_best(geometry, [], target) is None:
            return   # the target does not fit this GPU model at all
        # Otherwise only busy devices may stop a plan.
        assert not force and "in use" in str(err)
        assert exhaustive_best(geometry, existing, target) is None
        assert exhaustive_best(geometry, existing, target, force=True) is not None
        return
    assert_plan_valid(geometry, existing, target, plan, force=force)
    best = exhaustive_best(geometry, existing, target, force=force)
    busy_destroyed = sum(1 for dummy, ci in plan.destroyed_compute_instances() if ci.pids)
    assert (busy_destroyed, plan.destroyed_devices) == best[:2]
    assert free_run(geometry, plan.result) == best[2]
    kept = sum(counts_of(geometry, existing).values()) - plan.destroyed_devices
    assert plan.created_devices == sum(target.values()) - kept
    # Applying the plan reaches a fixed point.
    again = plan_gpu(geometry, _with_ids(plan), target)
    assert not again.changed


@pytest.mark.parametrize("model", sorted(MODELS))
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_validation_agrees_with_exhaustive_search_from_empty(model, data):
    geometry = MODELS[model]
    target = data.draw(targets(geometry), label="target")
    fits = exhaustive_best(geometry, [], target) is not None
    try:
        validate_target(geometry, target)
    except LayoutError:
        assert not fits
    else:
        assert fits


def test_plan_type_is_plain_data():
    plan = plan_gpu(H100_80GB, [], {"3g.40gb": 1})
    assert isinstance(plan, GpuPlan)
    assert plan.result == plan.create and plan.keep == () and plan.changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.keep = ()
    assert B200.device_type("1c.7g.180gb").ci.sm_slices == 1


# --------------------------------------------------------------------------
# Devices allocated to pods (kubelet PodResources): kept like busy ones, and the fewest pods evicted
# --------------------------------------------------------------------------

def _allocated(geometry, gi_id, name, start, *pods, pids=()):
    """An existing GI with one full CI allocated to pods ("ns/pod/container")."""
    gi = make_gi(geometry, gi_id, name, start, [(name, 0, pids)])
    return dataclasses.replace(gi, compute_instances=(dataclasses.replace(gi.compute_instances[0], pods=pods),))


def test_allocated_devices_are_kept_and_the_plan_evicts_nobody():
    # All-1g to balanced keeps two 1g devices: the two with pods, not the lowest-placed idle ones.
    existing = all_1g()
    existing[2] = _allocated(A100, 3, "1g.5gb", 2, "ml/train/main")
    existing[3] = _allocated(A100, 4, "1g.5gb", 3, "ml/infer/main")
    plan = plan_gpu(A100, existing, BALANCED)
    assert_plan_valid(A100, existing, BALANCED, plan)
    assert [g.gi_id for g in plan.keep] == [3, 4] and plan.evicted_pods == ()
    assert plan.destroyed_devices == 5
    assert plan_as_dict(A100, plan)["evicted_pods"] == []


def test_destroying_an_allocated_device_is_refused_naming_the_pods():
    existing = [_allocated(A100, 5, "3g.20gb", 4, "ml/train/main", "ml/train/side", pids=(77,)),
                make_gi(A100, 6, "3g.20gb", 0)]
    with pytest.raises(LayoutError) as err:
        plan_gpu(A100, existing, {"7g.40gb": 1})
    text = str(err.value)
    for part in ("allocated to pods", "GI 5", "3g.20gb @4:4", "MIG-5-0", "pod ml/train (container main)", "pod ml/train (container side)",
                 "evict_pods"):
        assert part in text
    assert "GI 6" not in text
    # force is for processes; it does not evict pods.
    with pytest.raises(LayoutError, match="allocated to pods"):
        plan_gpu(A100, existing, {"7g.40gb": 1}, force=True)
    # With evict_pods the pod's processes go with it: no force needed.
    plan = plan_gpu(A100, existing, {"7g.40gb": 1}, evict_pods=True)
    assert_plan_valid(A100, existing, {"7g.40gb": 1}, plan, evict_pods=True)
    ((pod, devices),) = plan.evicted_pods
    assert pod == "ml/train" and [(gi.gi_id, ci.uuid) for gi, ci in devices] == [(5, "MIG-5-0")]
    data = plan_as_dict(A100, plan)
    json.dumps(data)
    assert data["evicted_pods"] == [{"pod": "ml/train", "reason": "device destroyed", "devices": [
        {"gi_id": 5, "ci_id": 0, "device": "3g.20gb", "uuid": "MIG-5-0",
         "pods": ["ml/train/main", "ml/train/side"]}]}]
    assert "(pods ml/train/main,ml/train/side)" in describe_layout(A100, existing)
    # check_plan, the last guard, holds the same line.
    with pytest.raises(LayoutError, match="allocated to pods"):
        check_plan(A100, existing, {"7g.40gb": 1}, plan)
    check_plan(A100, existing, {"7g.40gb": 1}, plan, evict_pods=True)


def test_processes_outside_pods_still_need_force_with_evict_pods():
    existing = [make_gi(A100, 1, "3g.20gb", 0, [("3g.20gb", 0, (42,))]), make_gi(A100, 2, "3g.20gb", 4)]
    with pytest.raises(LayoutError, match="in use.*force"):
        plan_gpu(A100, existing, {"7g.40gb": 1}, evict_pods=True)


def test_fewest_pods_beat_fewest_devices():
    # 1g.10gb (2 slices, starts 0, 2, 4, 6) must go in 0..3. Destroying the 1g at 2 and 3 costs 2 devices but
    # evicts the pod on the one at 3; destroying the 1g at 0, the 1g+me at 1 and the 1g at 2 (the +me comes
    # back at 2) costs 3 devices and evicts nobody.
    existing = [make_gi(A100, 1, "3g.20gb", 4), make_gi(A100, 2, "1g.5gb", 0), make_gi(A100, 3, "1g.5gb+me", 1),
                make_gi(A100, 4, "1g.5gb", 2), _allocated(A100, 5, "1g.5gb", 3, "ml/a/main")]
    target = {"1g.5gb+me": 1, "3g.20gb": 1, "1g.10gb": 1, "1g.5gb": 1}
    idle = plan_gpu(A100, [make_gi(A100, 5, "1g.5gb", 3) if g.gi_id == 5 else g for g in existing], target)
    assert idle.destroyed_devices == 2
    plan = plan_gpu(A100, existing, target, evict_pods=True)
    assert_plan_valid(A100, existing, target, plan, evict_pods=True)
    assert plan.evicted_pods == () and plan.destroyed_devices == 3
    assert 5 in [g.gi_id for g in plan.keep]
    assert exhaustive_best_evictions(A100, existing, target, evict_pods=True) == (0, 0, 3, 0)


def test_a_pod_on_two_destroyed_devices_counts_once():
    # Pod x holds both 1g at 0 and 1 (two GIs); pods y and z one 1g each at 2 and 3. A 2g is wanted in 0..3 and
    # two of the four 1g go: the two of pod x (one pod), not one each of y and z (two pods).
    existing = [_allocated(A100, 1, "1g.5gb", 0, "ml/x/one"), _allocated(A100, 2, "1g.5gb", 1, "ml/x/two"),
                _allocated(A100, 3, "1g.5gb", 2, "ml/y/main"), _allocated(A100, 4, "1g.5gb", 3, "ml/z/main"),
                make_gi(A100, 5, "3g.20gb", 4)]
    target = {"2g.10gb": 1, "1g.5gb": 2, "3g.20gb": 1}
    plan = plan_gpu(A100, existing, target, evict_pods=True)
    assert_plan_valid(A100, existing, target, plan, evict_pods=True)
    assert [pod for pod, dummy in plan.evicted_pods] == ["ml/x"]
    assert exhaustive_best_evictions(A100, existing, target, evict_pods=True)[:3] == (1, 0, 2)


def test_time_sliced_device_evicts_every_pod_on_it():
    existing = [_allocated(A100, 1, "7g.40gb", 0, "ml/r0/main", "ml/r1/main", "ml/r2/main")]
    plan = plan_gpu(A100, existing, {"3g.20gb": 2}, evict_pods=True)
    assert [pod for pod, dummy in plan.evicted_pods] == ["ml/r0", "ml/r1", "ml/r2"]


def test_pinned_placements_spare_pods_around_them():
    # The pin takes 0..3, where an idle 3g sits; the pod on the 3g at 4 stays.
    existing = [make_gi(A100, 1, "3g.20gb", 0), _allocated(A100, 2, "3g.20gb", 4, "ml/keep/main")]
    plan = plan_gpu(A100, existing, {"2g.10gb": 1, "3g.20gb": 1}, pinned=(PinnedGi("2g.10gb", 0),))
    assert [g.gi_id for g in plan.keep] == [2] and plan.evicted_pods == ()


@pytest.mark.parametrize("model", sorted(MODELS))
@PROPERTY
@given(data=st.data())
def test_plans_evict_exactly_the_fewest_pods(model, data):
    geometry = MODELS[model]
    existing = data.draw(layouts(geometry, pods=True), label="existing")
    target = data.draw(targets(geometry, near=existing), label="target")
    force = data.draw(st.booleans(), label="force")
    evict_pods = data.draw(st.booleans(), label="evict_pods")
    best = exhaustive_best_evictions(geometry, existing, target, force=force, evict_pods=evict_pods)
    try:
        plan = plan_gpu(geometry, existing, target, force=force, evict_pods=evict_pods)
    except LayoutError as err:
        if exhaustive_best(geometry, [], target) is None:
            return   # the target does not fit this GPU model at all
        assert best is None
        assert "in use" in str(err) or "allocated to pods" in str(err)
        assert exhaustive_best_evictions(geometry, existing, target, force=True, evict_pods=True) is not None
        return
    assert_plan_valid(geometry, existing, target, plan, force=force, evict_pods=evict_pods)
    busy_destroyed = sum(1 for dummy, ci in plan.destroyed_compute_instances() if ci.pids)
    assert (len(plan.evicted_pods), busy_destroyed, plan.destroyed_devices,
            free_run(geometry, plan.result)) == best


def _held_3g(gi_id, start, *pods):
    from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils import layout_helpers
    gi = layout_helpers.make_gi(layout_helpers.H100_80GB, gi_id, "3g.40gb", start)
    ci = dataclasses.replace(gi.compute_instances[0], pods=pods)
    return dataclasses.replace(gi, compute_instances=(ci,))


def test_plan_node_gpus_evicts_a_pod_on_two_gpus_once_whichever_gpu_comes_first():
    """GPU 0's choice is a tie for GPU 0 alone (ml/p's 3g.40gb or ml/q's); GPU 1, planned after
    it, evicts ml/p anyway. The node's plans evict ml/p only; a GPU that cannot be planned gives
    its LayoutError."""
    from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
        evicted_pod_names, plan_node_gpus)
    from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils import layout_helpers
    h100 = layout_helpers.H100_80GB
    pq = (_held_3g(1, 0, "ml/p/main"), _held_3g(2, 4, "ml/q/main"))
    requests = {0: (h100, pq, {"3g.40gb": 1, "2g.20gb": 1}, ()),
                1: (h100, (_held_3g(1, 0, "ml/p/main"), _held_3g(2, 4)), {"7g.80gb": 1}, ())}
    alone = plan_gpu(*requests[0][:3], evict_pods=True)
    assert evicted_pod_names(alone) == {"ml/q"}   # GPU 0 alone breaks the tie the other way
    plans = plan_node_gpus(requests, evict_pods=True)
    assert [evicted_pod_names(plans[i]) for i in (0, 1)] == [{"ml/p"}, {"ml/p"}]
    requests[2] = (h100, (), {"9g.900gb": 1}, ())
    plans = plan_node_gpus(requests, evict_pods=True)
    assert isinstance(plans[2], LayoutError) and evicted_pod_names(plans[0]) == {"ml/p"}
    # Without evict_pods the plans are plan_gpu's: a held device is refused.
    assert isinstance(plan_node_gpus(requests)[0], LayoutError)
