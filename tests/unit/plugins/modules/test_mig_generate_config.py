"""The generated mig-parted config (gpuops.mig.mig_generate_config's engine) applies with mig_mode and
mig_config as they are, on simulated GPUs of three models."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import generate_config
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_facts, mig_mode


def gather(run_module):
    return run_module(mig_facts, {})["ansible_facts"]["gpuops_mig"]["gpus"]


def test_generated_config_applies_on_a_mixed_host(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA30-24GB", mig="enabled")
    config = generate_config(gather(run_module))
    names = list(config["mig-configs"])
    assert names[:2] == ["all-disabled", "all-enabled"] and names[-1] == "all-balanced"
    assert "all-1g.5gb" in names and "all-1g.5gb.me" in names and "all-7g.80gb" in names
    # One entry per model with its device-filter; 1g.10gb means a different profile on each 8-slot model.
    entries = config["mig-configs"]["all-1g.10gb"]
    assert sorted((e["device-filter"], e["mig-devices"]["1g.10gb"]) for e in entries) == [
        ("0x20B010DE", 4), ("0x233010DE", 7)]
    balanced = dict((e["device-filter"], e["mig-devices"]) for e in config["mig-configs"]["all-balanced"])
    assert balanced == {"0x20B010DE": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
                        "0x233010DE": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
                        "0x20B710DE": {"1g.6gb": 2, "2g.12gb": 1}}
    for name in names:
        if name == "all-disabled":
            continue
        result = run_module(mig_config, {"config": config, "config_name": name})
        assert not result.get("failed"), (name, result.get("msg"))
        wanted = {}
        for entry in config["mig-configs"][name]:
            wanted[entry.get("device-filter", "any")] = entry["mig-devices"]
        for gpu in gather(run_module):
            expected = wanted.get(gpu["pci_device_id"], wanted.get("any"))
            if expected is not None:
                assert gpu["mig_devices"] == expected, (name, gpu["index"])
    # all-disabled: the mode, through mig_mode with the same config (no devices may remain).
    run_module(mig_config, {"config": config, "config_name": "all-enabled"})
    result = run_module(mig_mode, {"config": config, "config_name": "all-disabled", "reset": True})
    assert not result.get("failed"), result.get("msg")
    assert all(not g["mig_enabled"] for g in gather(run_module))


def test_one_model_needs_no_device_filter(sim_host, run_module):
    sim_host("2xH100-SXM5-80GB", mig="disabled")
    config = generate_config(gather(run_module))
    assert all("device-filter" not in e for entries in config["mig-configs"].values() for e in entries)
    wanted = [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]
    assert config["mig-configs"]["all-3g.40gb"] == wanted


def test_no_mig_capable_gpu_or_no_profiles_is_a_clear_error():
    with pytest.raises(ConfigError, match="no MIG-capable GPU"):
        generate_config([{"index": 0, "mig_capable": False}])
    with pytest.raises(ConfigError, match="lists no MIG profiles"):
        generate_config([{"index": 0, "mig_capable": True, "pci_device_id": "0x20B010DE", "name": "A100",
                          "supported_profiles": []}])
