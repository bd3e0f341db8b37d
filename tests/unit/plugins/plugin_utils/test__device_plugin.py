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
        "mig_strategy": "mixed", "gfd": "false", "fail_on_init_error": "false",
        "device_list_strategy": ["cdi-cri", "envvar"], "driver_root": "auto",
        "values": {"failOnInitError": True, "gfd": {"enabled": True}, "tolerations": []}},
        {"a": CONTAINER_DRIVER, "b": CONTAINER_DRIVER, "c": {"driver": {"present": False}}})
    assert values == {"migStrategy": "mixed", "gfd": {"enabled": True}, "failOnInitError": True,
                      "deviceListStrategy": "cdi-cri,envvar", "nvidiaDriverRoot": "/run/nvidia/driver",
                      "tolerations": []}


def test_driver_root():
    assert dp.driver_root("auto", {"a": HOST_DRIVER}) == "/"
    assert dp.driver_root("auto", {}) == ""
    assert dp.driver_root("/opt/driver", {"a": HOST_DRIVER}) == "/opt/driver"
    with pytest.raises(dp.DevicePluginError, match="different roots .*/ on a; /run/nvidia/driver on b"):
        dp.driver_root("auto", {"a": HOST_DRIVER, "b": CONTAINER_DRIVER})


def test_sharing_configs_and_the_allocation_policy_go_into_config_map():
    values = dp.chart_values({"mig_strategy": "mixed", "driver_root": "", "allocation_policy": "packed",
                              "sharing_configs": {"ts4": {"1g.10gb": {"replicas": 4}}}, "config_default": "ts4"})
    assert values["config"]["default"] == "ts4" and sorted(values["config"]["map"]) == ["default", "ts4"]
    ts4 = yaml.safe_load(values["config"]["map"]["ts4"])
    assert ts4["flags"] == {"migStrategy": "mixed", "plugin": {"sharedDevicesAllocationPolicy": "packed"}}
    assert ts4["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]
    assert "sharing" not in yaml.safe_load(values["config"]["map"]["default"])
    # The policy alone: one default config carries it.
    only = dp.chart_values({"mig_strategy": "single", "driver_root": "", "allocation_policy": "distributed"})
    assert list(only["config"]["map"]) == ["default"]


@pytest.mark.parametrize("settings, message", [
    ({"mig_strategy": "mig"}, "mig_device_plugin_mig_strategy must be none, single or mixed, got 'mig'"),
    ({"fail_on_init_error": "maybe"}, "mig_device_plugin_fail_on_init_error must be true or false"),
    ({"device_list_strategy": "cdi"}, "mig_device_plugin_device_list_strategy: 'cdi'; each of envvar"),
    ({"device_list_strategy": ["envvar", "envvar"]}, "a strategy given twice"),
    ({"device_list_strategy": 5}, "must be a strategy or a list of them, got 5"),
    ({"driver_root": "run/nvidia"}, "mig_device_plugin_driver_root must be auto, an absolute path"),
    ({"allocation_policy": "spread"}, "must be distributed or packed .v0.20.0., got 'spread'"),
    ({"sharing_configs": {"ts": {"1g.10gb": {"strategy": "mps", "replicas": 2}}}},
     "mig_device_plugin_sharing_configs, config ts, profile 1g.10gb: MPS cannot share MIG devices"),
    ({"sharing_configs": {"bad name": "none"}}, "'bad name' is not a config name"),
    ({"sharing_configs": {"ts": {"1g.10gb": {"replicas": 2}}}, "mig_strategy": "none"}, "under the MIG strategy none"),
    ({"sharing_configs": {"ts": "none"}, "config_default": "other"}, "config_default is 'other', which"),
    ({"config_default": "ts"}, "mig_device_plugin_sharing_configs names no config"),
    ({"values": ["x"]}, "mig_device_plugin_values must be a mapping"),
])
def test_bad_settings_are_refused_before_helm(settings, message):
    with pytest.raises((dp.DevicePluginError, dp.sharing.SharingError), match=message):
        dp.chart_values(dict({"mig_strategy": "mixed", "driver_root": ""}, **settings))
