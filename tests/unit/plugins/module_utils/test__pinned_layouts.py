"""Pinned placements: the list form of inline layouts (_migparted) and the planner (_gpu_layout)."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
    LayoutError,
    PinnedGi,
    device_counts,
    plan_gpu,
    resolve_pins,
)
from ansible_collections.gpuops.mig.plugins.module_utils._migparted import entries_from_layouts
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import MODELS, make_gi

H100 = MODELS["H100-80GB"]


def places(plan):
    """The result as (GI name, start, ((CI profile id, start), ...)), ids left out."""
    return sorted((H100.gi_profile(gi.profile_id).name, gi.start,
                   tuple(sorted((ci.profile_id, ci.start) for ci in gi.compute_instances)))
                  for gi in plan.result)


# -- parsing -----------------------------------------------------------------

def test_list_form_gives_counts_and_pins():
    entry, = entries_from_layouts([{"gpus": [0], "devices": [
        {"profile": "3g.40gb", "placement": {"start": 4, "size": 4},
         "compute_instances": [{"profile": "1c.3g.40gb", "placement": {"start": 2}},
                               {"profile": "2c.3g.40gb"}]},
        {"profile": "1g.10gb", "placement": {"start": 0}},
        {"profile": "1g.10gb"},
    ]}])
    assert entry.mig_devices == {"1c.3g.40gb": 1, "2c.3g.40gb": 1, "1g.10gb": 2}
    assert entry.pinned == (
        PinnedGi("3g.40gb", 4, 4, (("1c.3g.40gb", 2), ("2c.3g.40gb", None)), "devices[0]"),
        PinnedGi("1g.10gb", 0, None, (), "devices[1]"),
    )


def test_mapping_form_has_no_pins():
    entry, = entries_from_layouts([{"gpus": "all", "devices": {"3g.40gb": 2}}])
    assert entry.pinned == () and entry.mig_devices == {"3g.40gb": 2}


@pytest.mark.parametrize("item, message", [
    ("3g.40gb", "devices[0] must be a mapping with 'profile'"),
    ({"placement": {"start": 0}}, "devices[0] needs 'profile'"),
    ({"profile": "3g.40gb", "where": 0}, "devices[0] has unknown key(s) 'where'"),
    ({"profile": "1c.3g.40gb"}, "devices[0] profile '1c.3g.40gb' is a compute-instance profile"),
    ({"profile": "3g.40gb", "placement": 4}, "devices[0] placement must be a mapping with 'start'"),
    ({"profile": "3g.40gb", "placement": {"start": -1}}, "devices[0] placement start must be a non-negative"),
    ({"profile": "3g.40gb", "placement": {"start": 0, "size": 0}}, "placement size must be a positive"),
    ({"profile": "3g.40gb", "placement": {"start": 0, "end": 4}}, "devices[0] placement has unknown key(s) 'end'"),
    ({"profile": "3g.40gb", "compute_instances": []}, "compute_instances must be a non-empty list"),
    ({"profile": "3g.40gb", "compute_instances": [{"profile": "1c.3g.40gb", "placement": {"start": 0}}]},
     "has a placement, but its GPU instance has none"),
])
def test_list_form_errors_name_the_item(item, message):
    with pytest.raises(ConfigError) as err:
        entries_from_layouts([{"gpus": [0], "devices": [item]}])
    assert "layouts[0] (gpus: [0])" in str(err.value) and message in str(err.value)


def test_list_form_must_be_empty_when_mig_is_disabled():
    assert entries_from_layouts([{"gpus": [0], "mig_enabled": False, "devices": []}])[0].mig_devices == {}
    with pytest.raises(ConfigError, match="must be absent or empty when MIG is disabled"):
        entries_from_layouts([{"gpus": [0], "mig_enabled": False, "devices": [{"profile": "3g.40gb"}]}])


# -- planning ----------------------------------------------------------------

def test_pins_on_an_empty_gpu_are_created_where_asked():
    pins = (PinnedGi("1g.10gb", 1), PinnedGi("1g.10gb", 3), PinnedGi("3g.40gb", 4))
    plan = plan_gpu(H100, (), {"1g.10gb": 2, "3g.40gb": 1}, pinned=pins)
    assert [(gi.start, H100.gi_profile(gi.profile_id).name) for gi in plan.create] == [
        (1, "1g.10gb"), (3, "1g.10gb"), (4, "3g.40gb")]


def test_an_existing_gi_that_is_the_pin_is_kept_and_others_in_the_way_go():
    existing = (make_gi(H100, 1, "3g.40gb", 4), make_gi(H100, 2, "2g.20gb", 0), make_gi(H100, 3, "1g.10gb", 2))
    pins = (PinnedGi("3g.40gb", 4), PinnedGi("1g.20gb", 0))
    plan = plan_gpu(H100, existing, {"3g.40gb": 1, "1g.20gb": 1, "1g.10gb": 1}, pinned=pins)
    assert {gi.gi_id for gi in plan.keep} == {1, 3}        # the 1g.10gb at 2 is clear of every pin
    assert [gi.gi_id for gi in plan.destroy] == [2]        # the 2g.20gb sits where 1g.20gb is pinned
    assert [p[:2] for p in places(plan)] == [("1g.10gb", 2), ("1g.20gb", 0), ("3g.40gb", 4)]


def test_compute_instances_of_a_kept_pin_are_changed_in_place():
    existing = (make_gi(H100, 1, "3g.40gb", 0, cis=[("1c.3g.40gb", 0, ()), ("1c.3g.40gb", 2, ())]),)
    pin = PinnedGi("3g.40gb", 0, compute_instances=(("2c.3g.40gb", 0), ("1c.3g.40gb", 2)))
    plan = plan_gpu(H100, existing, {"1c.3g.40gb": 1, "2c.3g.40gb": 1}, pinned=(pin,))
    assert not plan.destroy and not plan.create and len(plan.change) == 1
    change = plan.change[0]
    assert [ci.start for ci in change.destroy] == [0] and [ci.start for ci in change.create] == [0]
    assert change.gi.compute_instances[1] in plan.result[0].compute_instances   # 1c at 2 kept
    assert device_counts(H100, plan.result) == {"1c.3g.40gb": 1, "2c.3g.40gb": 1}


def test_unpinned_devices_are_placed_around_the_pins():
    plan = plan_gpu(H100, (), {"1g.10gb": 3, "3g.40gb": 1}, pinned=(PinnedGi("3g.40gb", 0),))
    starts = sorted(gi.start for gi in plan.result if H100.gi_profile(gi.profile_id).name == "1g.10gb")
    assert all(s >= 4 for s in starts) and len(starts) == 3


def test_busy_devices_in_the_way_of_a_pin_need_force():
    existing = (make_gi(H100, 1, "1g.10gb", 4, cis=[("1g.10gb", 0, (4242,))]),)
    with pytest.raises(LayoutError, match="in use: GI 1 .*4242"):
        plan_gpu(H100, existing, {"3g.40gb": 1}, pinned=(PinnedGi("3g.40gb", 4),))
    assert plan_gpu(H100, existing, {"3g.40gb": 1}, pinned=(PinnedGi("3g.40gb", 4),), force=True).destroy


@pytest.mark.parametrize("pins, target, message", [
    ((PinnedGi("3g.40gb", 2, label="devices[0]"),), {"3g.40gb": 1},
     "devices[0]: this GPU cannot hold 3g.40gb at placement 2:4 (its placements: 0:4,4:4)"),
    ((PinnedGi("4g.40gb", 0), PinnedGi("3g.40gb", 4), PinnedGi("1g.10gb", 3, label="devices[2]")),
     {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, "devices[2]: placement 3:1 overlaps another pinned"),
    ((PinnedGi("1g.10gb+me", 0), PinnedGi("1g.10gb+me", 1)), {"1g.10gb+me": 2},
     "the pinned GPU instances together: more than 1 GPU instances of 1g.10gb+me"),
    ((PinnedGi("3g.40gb", 0),), {"3g.40gb": 0}, "the pinned GPU instances hold 3g.40gb x1, but the target asks for 0"),
    ((PinnedGi("7g.80gb", 0),), {"7g.80gb": 1, "1g.10gb": 1}, "plus 7 for the pinned GPU instances"),
])
def test_impossible_pins_are_refused(pins, target, message):
    with pytest.raises(LayoutError) as err:
        plan_gpu(H100, (), target, pinned=pins)
    assert message in str(err.value)


def test_resolve_pins_fills_missing_compute_instance_starts():
    gi, = resolve_pins(H100, (PinnedGi("3g.40gb", 0, compute_instances=(("1c.3g.40gb", None),) * 3),))
    assert [ci.start for ci in gi.compute_instances] == [0, 1, 2]
