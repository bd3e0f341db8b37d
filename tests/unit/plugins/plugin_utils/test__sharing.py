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


# -- the device plugin's per-node config ------------------------------------------------

PLANNED = [{"index": 0, "name": A100, "mig_enabled": True, "devices": {"1g.5gb": 7}}]
NO_OPERATOR = {"present": False}
NODE = {"metadata": {"name": "gpu-1", "labels": {}}}
SETTINGS = {"sharing": TS4, "entry": "", "configmap": "nvidia/plugin-configs"}


def configmap(data, name="plugin-configs", namespace="nvidia"):
    return {namespace: [{"metadata": {"name": name, "namespace": namespace}, "data": data}]}


def plan(settings=None, planned=None, strategy="mixed", operator=None, node=None, configmaps=None):
    return s.node_plan("gpu-1", dict(SETTINGS, **(settings or {})), PLANNED if planned is None else planned, strategy,
                       "mig_node_layouts", NO_OPERATOR if operator is None else operator, NODE if node is None else node,
                       configmaps if configmaps is not None else configmap({"default": "version: v1\n"}))


def test_unmanaged_without_sharing_or_an_entry():
    assert plan({"sharing": {}}) == {"managed": False, "policy": {}}


def test_declared_sharing_is_written_under_a_name_from_its_content():
    found = plan()
    content = found["data"][found["entry"]]
    assert found["entry"].startswith("gpuops-mig-") and found["label"] == found["entry"]
    assert (found["configmap"], found["namespace"]) == ("plugin-configs", "nvidia")
    assert found["policy"] == s.policy(TS4)
    import yaml
    assert yaml.safe_load(content) == {"version": "v1", "flags": {"migStrategy": "mixed"}, "sharing": {"timeSlicing": {
        "renameByDefault": False, "failRequestsGreaterThanOne": False,
        "resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 4}]}}}
    # Written and labelled already: nothing to do.
    again = plan(node={"metadata": {"labels": {s.CONFIG_LABEL: found["entry"]}}},
                 configmaps=configmap({found["entry"]: content}))
    assert again["data"] == {} and again["label"] is None
    # Under single the resource is nvidia.com/gpu; "none" writes a config without sharing.
    assert "name: nvidia.com/gpu\n" in plan(strategy="single")["data"].popitem()[1]
    assert "sharing" not in plan({"sharing": "none"})["data"].popitem()[1]


def test_a_named_existing_entry_gives_the_policy():
    text = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
            "    - {name: nvidia.com/mig-1g.5gb, replicas: 3}\n    - {name: nvidia.com/gpu, replicas: 2}\n")
    found = plan({"sharing": {}, "entry": "ts3"}, configmaps=configmap({"ts3": text}))
    assert found["data"] == {} and found["label"] == "ts3"
    assert found["policy"] == {"1g.5gb": {"replicas": 3, "rename": True, "fail_requests_greater_than_one": False}}


@pytest.mark.parametrize("settings, kw, message", [
    ({"sharing": {}, "entry": "ts9"}, {}, "gpu-1: entry 'ts9' of the device plugin's ConfigMap nvidia/plugin-configs "
                                          "does not exist .it has default."),
    ({"sharing": {}, "entry": "ts9"}, {"configmaps": {}}, "does not exist .the ConfigMap was not found"),
    ({"sharing": {}, "entry": "mps"}, {"configmaps": configmap({"mps": "sharing:\n  mps:\n    resources: []\n"})},
     "entry 'mps' .* shares with MPS: the NVIDIA device plugin refuses MPS for MIG devices"),
    ({"entry": "default"}, {}, "entry 'default' .* already holds another config"),
    ({"entry": "-bad"}, {}, "mig_node_device_plugin_config_name must be 1 to 63"),
    ({"configmap": ""}, {}, "gpu-1: mig_node_sharing needs mig_node_device_plugin_config_map"),
    ({"sharing": {"3g.20gb": {"replicas": 2}}}, {}, "gpu-1: mig_node_sharing shares 3g.20gb, which the layout from "
                                                    "mig_node_layouts does not create"),
    ({"sharing": {"1g.5gb": {"strategy": "mps", "replicas": 2}}}, {}, "gpu-1: mig_node_sharing, profile 1g.5gb: MPS"),
    ({}, {"operator": {"present": True, "device_plugin": True, "device_plugin_config": "", "namespace": "gpu-operator"}},
     "names no config ConfigMap .devicePlugin.config.name."),
    ({}, {"operator": {"present": True, "device_plugin": True, "device_plugin_config": "dp", "namespace": "gpu-operator"}},
     "mig_node_device_plugin_config_map is nvidia/plugin-configs, but the GPU Operator's device plugin "
     "reads gpu-operator/dp"),
    ({"configmap": "other/dp"},
     {"operator": {"present": True, "device_plugin": True, "device_plugin_config": "dp",
                   "namespace": "gpu-operator"}},
     "config_map is other/dp, but the GPU Operator's device plugin reads gpu-operator/dp"),
    ({"configmap": "a/b/c"}, {}, "gpu-1: mig_node_device_plugin_config_map must be a ConfigMap name or "
                                 "namespace/name .* got 'a/b/c'"),
])
def test_node_plan_refuses_naming_host_profile_and_source(settings, kw, message):
    with pytest.raises(s.SharingError, match=message):
        plan(settings, **kw)


def test_the_operators_config_map():
    operator = {"present": True, "device_plugin": True, "device_plugin_config": "dp", "namespace": "gpu-operator"}
    for named in ("", "dp", "gpu-operator/dp"):
        found = plan({"configmap": named}, operator=operator, configmaps=configmap({}, "dp", "gpu-operator"))
        assert (found["configmap"], found["namespace"]) == ("dp", "gpu-operator") and found["data"]


@pytest.mark.parametrize("value, ref", [
    ("plugin-configs", ("", "plugin-configs")),
    ("nvidia/plugin-configs", ("nvidia", "plugin-configs")),
    ("nvidia/dp.configs", ("nvidia", "dp.configs")),
    ("", ("", "")),
    (None, ("", "")),
])
def test_the_config_map_is_namespace_slash_name(value, ref):
    assert s.config_map_ref("gpu-1", value) == ref


@pytest.mark.parametrize("value", ["a/b/c", "/dp", "nvidia/", "Nvidia/dp", "nv.idia/dp", "dp-", 7, ["dp"],
                                   "x" * 254])
def test_a_config_map_of_another_form_is_refused(value):
    with pytest.raises(s.SharingError, match="gpu-1: mig_node_device_plugin_config_map must be a ConfigMap "
                                             "name or namespace/name"):
        s.config_map_ref("gpu-1", value)
