"""The mig_device_plugin role's chart values (plugins/plugin_utils/_device_plugin.py)."""

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.plugin_utils import _device_plugin as dp

HOST_DRIVER = {"driver": {"present": True, "root": None}}
CONTAINER_DRIVER = {"driver": {"present": True, "root": "/run/nvidia/driver"}}


def test_only_strategy_and_gfd_by_default():
    assert dp.chart_values({"mig_strategy": "Mixed", "gfd": True, "driver_root": ""}) == {
        "migStrategy": "mixed", "gfd": {"enabled": True}}


def test_typed_settings_then_free_form_values_last():
    values = dp.chart_values({
        "mig_strategy": "mixed", "gfd": "false", "driver_root": "auto",
        "values": {"failOnInitError": False, "deviceListStrategy": "cdi-cri,envvar",
                   "gfd": {"enabled": True}, "tolerations": []}},
        {"a": CONTAINER_DRIVER, "b": CONTAINER_DRIVER, "c": {"driver": {"present": False}}})
    assert values == {"migStrategy": "mixed", "gfd": {"enabled": True}, "failOnInitError": False,
                      "deviceListStrategy": "cdi-cri,envvar",
                      "nvidiaDriverRoot": "/run/nvidia/driver", "tolerations": []}


def test_a_driver_root_in_the_values_wins_over_the_detection():
    mixed = {"a": HOST_DRIVER, "b": CONTAINER_DRIVER}       # auto would refuse these
    values = dp.chart_values({"mig_strategy": "mixed", "driver_root": "auto",
                              "values": {"nvidiaDriverRoot": "/opt/driver"}}, mixed)
    assert values["nvidiaDriverRoot"] == "/opt/driver"
    values = dp.chart_values({"mig_strategy": "mixed", "driver_root": "/run/nvidia/driver",
                              "values": {"nvidiaDriverRoot": "/"}})
    assert values["nvidiaDriverRoot"] == "/"


def test_driver_root():
    assert dp.driver_root("auto", {"a": HOST_DRIVER}) == "/"
    assert dp.driver_root("auto", {}) == ""
    assert dp.driver_root("/opt/driver", {"a": HOST_DRIVER}) == "/opt/driver"
    with pytest.raises(dp.DevicePluginError,
                       match="different roots .*/ on a; /run/nvidia/driver on b"
                             ".* Set nvidiaDriverRoot in mig_device_plugin_values"):
        dp.driver_root("auto", {"a": HOST_DRIVER, "b": CONTAINER_DRIVER})


def test_sharing_configs_and_the_allocation_policy_go_into_config_map():
    values = dp.chart_values({"mig_strategy": "mixed", "driver_root": "",
                              "allocation_policy": "packed",
                              "sharing_configs": {"ts4": {"1g.10gb": {"replicas": 4}}}})
    assert values["config"]["default"] == "default"
    assert sorted(values["config"]["map"]) == ["default", "ts4"]
    ts4 = yaml.safe_load(values["config"]["map"]["ts4"])
    assert ts4["flags"] == {"migStrategy": "mixed",
                            "plugin": {"sharedDevicesAllocationPolicy": "packed"}}
    assert ts4["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]
    assert "sharing" not in yaml.safe_load(values["config"]["map"]["default"])
    # The policy alone: one default config carries it.
    only = dp.chart_values({"mig_strategy": "single", "driver_root": "",
                            "allocation_policy": "distributed"})
    assert list(only["config"]["map"]) == ["default"] and only["config"]["default"] == "default"
    # Nothing to put there: no config at all.
    assert "config" not in dp.chart_values({"mig_strategy": "mixed", "sharing_configs": {}})


def test_a_config_named_default_is_the_one_of_unlabelled_nodes():
    ts4 = {"1g.10gb": {"replicas": 4}}
    values = dp.chart_values({"mig_strategy": "mixed",
                              "sharing_configs": {"ts4": ts4, "default": ts4}})
    assert values["config"]["default"] == "default"
    assert values["config"]["map"]["default"] == values["config"]["map"]["ts4"]
    default = yaml.safe_load(values["config"]["map"]["default"])
    assert default["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]
    # none is the policy that shares nothing, not the config named none
    plain = dp.chart_values({"mig_strategy": "mixed",
                             "sharing_configs": {"none": ts4, "default": "none"}})
    assert "sharing" not in yaml.safe_load(plain["config"]["map"]["default"])


def test_a_config_default_in_the_values_wins_when_it_names_a_config():
    settings = {"mig_strategy": "mixed", "sharing_configs": {"ts4": {"1g.10gb": {"replicas": 4}}}}
    values = dp.chart_values(dict(settings, values={"config": {"default": "ts4"}}))
    assert values["config"]["default"] == "ts4"
    assert sorted(values["config"]["map"]) == ["default", "ts4"]
    # The values' own ConfigMap (config.name): its entries are not known here.
    external = dp.chart_values({"mig_strategy": "mixed",
                                "values": {"config": {"name": "mine", "default": "x"}}})
    assert external["config"] == {"name": "mine", "default": "x"}


TS2 = {"1g.10gb": {"replicas": 2}}


@pytest.mark.parametrize("settings, message", [
    ({"mig_strategy": "mig"},
     "mig_device_plugin_mig_strategy must be none, single or mixed, got 'mig'"),
    ({"gfd": "maybe"}, "mig_device_plugin_gfd must be true or false"),
    ({"driver_root": "run/nvidia"}, "gpuops_mig_driver_root must be auto, an absolute path"),
    ({"allocation_policy": "spread"}, "must be distributed or packed .v0.20.0., got 'spread'"),
    ({"sharing_configs": {"ts": {"1g.10gb": {"strategy": "mps", "replicas": 2}}}},
     "mig_device_plugin_sharing_configs, config ts, profile 1g.10gb: MPS cannot share MIG "
     "devices"),
    ({"sharing_configs": {"bad name": "none"}}, "'bad name' is not a config name"),
    ({"sharing_configs": {"ts": TS2}, "mig_strategy": "none"}, "under the MIG strategy none"),
    ({"sharing_configs": {"ts": TS2, "default": "ts"}},
     "config default: 'ts' names another config, .* Give it the policy of ts"),
    ({"sharing_configs": {"ts": "none"}, "values": {"config": {"default": "other"}}},
     "sets config.default to 'other', which config.map does not name .it names default, ts."),
    ({"sharing_configs": {"ts": "none", "default": "none"},
      "values": {"config": {"default": "ts"}}},
     "names a config default, .* but mig_device_plugin_values sets config.default to 'ts'"),
    ({"allocation_policy": "packed", "values": {"config": {"default": ["x"]}}},
     "sets config.default to \\['x'\\], which config.map does not name .it names default."),
    ({"values": ["x"]}, "mig_device_plugin_values must be a mapping"),
])
def test_bad_settings_are_refused_before_helm(settings, message):
    with pytest.raises((dp.DevicePluginError, dp.sharing.SharingError), match=message):
        dp.chart_values(dict({"mig_strategy": "mixed", "driver_root": ""}, **settings))
