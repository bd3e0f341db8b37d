"""Which zero-count MIG resources a Node keeps after a layout change (plugin_utils/_stale_resources.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils._stale_resources import (
    StaleResourcesError, stale_resources)


def node(capacity, allocatable=None):
    return {"metadata": {"name": "gpu-1"},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity if allocatable is None else allocatable)}}


def expect(resources=None):
    return {"resources": dict(resources or {}), "labels": {}}


def test_zero_mig_resources_the_layout_does_not_promise_are_stale():
    found = node({"cpu": "16", "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "0",
                  "nvidia.com/mig-1g.10gb.shared": "0", "nvidia.com/mig-3g.40gb": "2"})
    assert stale_resources(found, expect({"nvidia.com/mig-3g.40gb": "2"})) == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.shared"]


def test_nothing_is_stale_on_a_node_that_lists_only_what_it_has():
    assert stale_resources(node({"cpu": "16", "nvidia.com/mig-3g.40gb": "2"}), expect({"nvidia.com/mig-3g.40gb": "2"})) == []
    assert stale_resources({"metadata": {"name": "gpu-1"}}, expect()) == []     # no status yet


def test_a_resource_with_devices_left_in_either_field_is_kept():
    # An unhealthy device: allocatable drops to 0, capacity stays.
    assert stale_resources(node({"nvidia.com/mig-1g.10gb": "2"}, {"nvidia.com/mig-1g.10gb": "0"}), expect()) == []
    assert stale_resources(node({"nvidia.com/mig-1g.10gb": "0"}, {"nvidia.com/mig-1g.10gb": "1"}), expect()) == []
    # Listed in one field only, at 0: stale.
    assert stale_resources(node({"nvidia.com/mig-1g.10gb": "0"}, {}), expect()) == ["nvidia.com/mig-1g.10gb"]


def test_a_promised_resource_is_never_stale_and_only_mig_resources_are_looked_at():
    assert stale_resources(node({"nvidia.com/mig-2g.20gb": "0"}), expect({"nvidia.com/mig-2g.20gb": "1"})) == []
    assert stale_resources(node({"nvidia.com/gpu": "0", "example.com/fpga": "0"}), expect()) == []
    assert stale_resources(node({"nvidia.com/mig-1g.10gb": "1k"}), expect()) == []   # not a plain count: kept


@pytest.mark.parametrize("found, expected, message", [
    ([], expect(), "expects a Node object"),
    (node({}), {"labels": {}}, "expects the result of mig_expected_advertisement"),
])
def test_bad_input_is_refused(found, expected, message):
    with pytest.raises(StaleResourcesError, match=message):
        stale_resources(found, expected)
