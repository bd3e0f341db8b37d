"""Which zero-count MIG resources a Node keeps after a layout change, and the guarded patch that
removes them (module_utils/_stale_resources.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils._stale_resources import (
    StaleResourcesError, promised, removal_patch, stale_resources)

MIG_1G, MIG_3G = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def node(capacity, allocatable=None):
    return {"metadata": {"name": "gpu-1"},
            "status": {"capacity": dict(capacity),
                       "allocatable": dict(capacity if allocatable is None else allocatable)}}


def expect(resources=None):
    return {"resources": dict(resources or {}), "labels": {}}


def test_zero_mig_resources_the_layout_does_not_promise_are_stale():
    found = node({"cpu": "16", "nvidia.com/gpu": "0", MIG_1G: "0", MIG_1G + ".shared": "0",
                  MIG_3G: "2"})
    assert stale_resources(found, expect({MIG_3G: "2"})) == [MIG_1G, MIG_1G + ".shared"]


def test_nothing_is_stale_on_a_node_that_lists_only_what_it_has():
    assert stale_resources(node({"cpu": "16", MIG_3G: "2"}), expect({MIG_3G: "2"})) == []
    assert stale_resources({"metadata": {"name": "gpu-1"}}, expect()) == []     # no status yet


def test_a_resource_with_devices_left_in_either_field_is_kept():
    # An unhealthy device: allocatable drops to 0, capacity stays.
    assert stale_resources(node({MIG_1G: "2"}, {MIG_1G: "0"}), expect()) == []
    assert stale_resources(node({MIG_1G: "0"}, {MIG_1G: "1"}), expect()) == []
    # Listed in one field only, at 0: stale.
    assert stale_resources(node({MIG_1G: "0"}, {}), expect()) == [MIG_1G]


def test_a_promised_resource_is_never_stale_and_only_mig_resources_are_looked_at():
    assert stale_resources(node({"nvidia.com/mig-2g.20gb": "0"}),
                           expect({"nvidia.com/mig-2g.20gb": "1"})) == []
    assert stale_resources(node({"nvidia.com/gpu": "0", "example.com/fpga": "0"}), expect()) == []
    assert stale_resources(node({MIG_1G: "1k"}), expect()) == []   # not a plain count: kept


@pytest.mark.parametrize("found, expected, message", [
    ([], expect(), "a Node object was expected, not list"),
    (node({}), {"labels": {}}, "expected must be the result of mig_expected_advertisement"),
])
def test_bad_input_is_refused(found, expected, message):
    with pytest.raises(StaleResourcesError, match=message):
        stale_resources(found, expected)


@pytest.mark.parametrize("expected", [None, [], {"labels": {}}, {"resources": [MIG_1G]}])
def test_an_expected_advertisement_without_its_resources_is_refused(expected):
    # The module refuses it before it reads the Node.
    with pytest.raises(StaleResourcesError, match="with its resources"):
        promised(expected)


def test_promised_returns_the_resources_of_the_advertisement():
    assert promised(expect({MIG_3G: "2"})) == {MIG_3G: "2"}


def test_each_stale_resource_is_tested_then_removed_in_every_field_that_lists_it():
    found = node({MIG_1G: "0", MIG_3G: "2"})
    ops, removed = removal_patch(found, expect({MIG_3G: "2"}))
    assert removed == [MIG_1G]
    capacity = "/status/capacity/nvidia.com~1mig-1g.10gb"
    allocatable = "/status/allocatable/nvidia.com~1mig-1g.10gb"
    assert ops == [{"op": "test", "path": capacity, "value": "0"},
                   {"op": "remove", "path": capacity},
                   {"op": "test", "path": allocatable, "value": "0"},
                   {"op": "remove", "path": allocatable}]


def test_the_patch_touches_only_the_fields_that_list_the_resource_and_keeps_devices():
    ops, removed = removal_patch(node({MIG_1G: "0"}, {}), expect())
    assert removed == [MIG_1G]
    assert [op["path"] for op in ops] == ["/status/capacity/nvidia.com~1mig-1g.10gb"] * 2
    assert removal_patch(node({MIG_1G: "0"}, {MIG_1G: "1"}), expect()) == ([], [])
    assert removal_patch({"metadata": {"name": "gpu-1"}}, expect()) == ([], [])
