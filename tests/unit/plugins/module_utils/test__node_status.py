"""The guarded JSON patch that removes zero-count resources from a Node's status (module_utils/_node_status.py)."""

from ansible_collections.gpuops.mig.plugins.module_utils._node_status import removal_patch

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


def node(capacity, allocatable):
    return {"status": {"capacity": dict(capacity), "allocatable": dict(allocatable)}}


def test_each_zero_resource_is_tested_then_removed_in_both_fields():
    ops, removed, kept = removal_patch(node({MIG_1G: "0", MIG_3G: "2"}, {MIG_1G: "0", MIG_3G: "2"}), [MIG_1G])
    assert removed == [MIG_1G] and kept == []
    assert ops == [{"op": "test", "path": "/status/capacity/nvidia.com~1mig-1g.10gb", "value": "0"},
                   {"op": "remove", "path": "/status/capacity/nvidia.com~1mig-1g.10gb"},
                   {"op": "test", "path": "/status/allocatable/nvidia.com~1mig-1g.10gb", "value": "0"},
                   {"op": "remove", "path": "/status/allocatable/nvidia.com~1mig-1g.10gb"}]


def test_a_resource_advertised_again_is_kept_and_an_absent_one_ignored():
    ops, removed, kept = removal_patch(node({MIG_1G: "0", MIG_3G: "1"}, {MIG_1G: "0", MIG_3G: "0"}),
                                       [MIG_3G, "nvidia.com/mig-7g.80gb"])
    assert (ops, removed, kept) == ([], [], [MIG_3G])


def test_a_name_in_one_field_only_is_removed_there():
    ops, removed, _kept = removal_patch(node({MIG_1G: "0"}, {}), [MIG_1G])
    assert removed == [MIG_1G] and [op["path"] for op in ops] == ["/status/capacity/nvidia.com~1mig-1g.10gb"] * 2
    assert removal_patch({}, [MIG_1G]) == ([], [], [])
