"""Sharing MIG devices through the device plugin (plugins/plugin_utils/_sharing.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as s

A100 = "NVIDIA A100-SXM4-40GB"
MIXED_GPUS = [{"name": A100, "uuid": "GPU-a", "mig_enabled": True, "mig_devices": {"1g.5gb": 7}},
              {"name": A100, "uuid": "GPU-b", "mig_enabled": True, "mig_devices": {"3g.20gb": 2}}]
ONE_TYPE = [{"name": A100, "uuid": "GPU-a", "mig_enabled": True, "mig_devices": {"1g.5gb": 7}}]
TS4 = {"1g.5gb": {"strategy": "time-slicing", "replicas": 4}}


def test_policy_normalises_and_drops_none():
    assert s.policy(None) == s.policy({}) == s.policy("none") == s.policy("") == {}
    assert s.policy({"1g.5gb": {"replicas": "4"}, "3g.20gb": "none", "2g.10gb": {"strategy": "none"}}) == {
        "1g.5gb": {"replicas": 4, "rename": False, "fail_requests_greater_than_one": False}}


@pytest.mark.parametrize("sharing, message", [
    ({"1g.5gb": {"replicas": 1}}, "1g.5gb: replicas must be a whole number of 2 or more"),
    ({"1g.5gb": {"replicas": True}}, "replicas must be a whole number"),
    ({"1g.5gb": {"replicas": -3}}, "replicas must be a whole number"),
    ({"1g.5gb": {"strategy": "time-slicing"}}, "time-slicing needs replicas"),
    ({"1g.5gb": {"strategy": "mps", "replicas": 2}}, "MPS cannot share MIG devices: the NVIDIA device plugin refuses"),
    ({"1g.5gb": {"strategy": "spread", "replicas": 2}}, "strategy must be time-slicing or none"),
    ({"1g.5gb": {"replicas": 2, "renmae": True}}, "unknown key.*'renmae'"),
    ({"1g.5gb": {"replicas": 2, "rename": "yes"}}, "rename must be true or false"),
    ({"1g.5gb": 4}, "must be 'none' or a mapping"),
    (["1g.5gb"], "must be 'none' or a mapping of MIG profile"),
    ({"1g.5gb": {"replicas": 2, "rename": True}, "3g.20gb": {"replicas": 2}},
     "rename differs between profiles .3g.20gb: false, 1g.5gb: true|rename differs between profiles"),
])
def test_policy_refuses_bad_input_naming_the_source(sharing, message):
    with pytest.raises(s.SharingError, match=message) as caught:
        s.policy(sharing, "gpu-1: mig_node_sharing")
    assert str(caught.value).startswith("gpu-1: mig_node_sharing")


def test_check_for_layout():
    shared = s.policy(TS4)
    s.check_for_layout(shared, {"1g.5gb": 7}, "mixed", "gpu-1", "mig_node_layouts")
    with pytest.raises(s.SharingError, match="gpu-1: mig_node_sharing shares 1g.5gb, which the layout from "
                                             "mig_node_layouts does not create on this node .it creates 3g.20gb."):
        s.check_for_layout(shared, {"3g.20gb": 2}, "mixed", "gpu-1", "mig_node_layouts")
    with pytest.raises(s.SharingError, match="under the MIG strategy none"):
        s.check_for_layout(shared, {"1g.5gb": 7}, "none", "gpu-1", "mig_node_layouts")


def test_mixed_time_slicing_multiplies_and_labels():
    expected = s.expected_advertisement(MIXED_GPUS, "mixed", True, TS4)
    assert expected["resources"] == {"nvidia.com/mig-1g.5gb": "28", "nvidia.com/mig-3g.20gb": "2"}
    labels = expected["labels"]
    assert labels["nvidia.com/mig-1g.5gb.count"] == "7"           # GFD counts devices, not replicas
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert "nvidia.com/mig-3g.20gb.replicas" not in labels


def test_renamed_resources_are_shared_names_without_the_product_suffix():
    renamed = {"1g.5gb": dict(TS4["1g.5gb"], rename=True)}
    expected = s.expected_advertisement(MIXED_GPUS, "mixed", True, renamed)
    assert expected["resources"] == {"nvidia.com/mig-1g.5gb.shared": "28", "nvidia.com/mig-3g.20gb": "2"}
    assert expected["labels"]["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    single = s.expected_advertisement(ONE_TYPE, "single", True, renamed)
    assert single["resources"] == {"nvidia.com/gpu.shared": "28"}
    assert single["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


def test_single_time_slicing():
    expected = s.expected_advertisement(ONE_TYPE, "single", True, TS4)
    assert expected == {
        "resources": {"nvidia.com/gpu": "28"},
        "labels": {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "7",
                   "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
                   "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}}
    assert s.expected_advertisement(ONE_TYPE, "single", False, TS4)["labels"] == {}


def test_no_sharing_is_what_the_node_decision_says():
    from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as d
    for strategy in ("none", "single", "mixed"):
        assert s.expected_advertisement(MIXED_GPUS, strategy, True, "none") == d.expected_advertisement(
            MIXED_GPUS, strategy)
    # Under none MIG devices are not advertised: nothing to multiply.
    assert s.expected_advertisement(MIXED_GPUS, "none", True, TS4)["resources"] == {"nvidia.com/gpu": "2"}


def test_advertised_keeps_shared_whole_gpu_resources():
    from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as d
    node = {"metadata": {"labels": {}}, "status": {"allocatable": {"nvidia.com/gpu.shared": "28", "cpu": "4"}}}
    assert d.advertised(node, {"resources": {}, "labels": {}})["resources"] == {"nvidia.com/gpu.shared": "28"}
