"""NVIDIA's own mig-parted v0.15.0 config-default.yaml, every named config, on every simulated MIG model.

A config *targets* a model when one of its entries selects that model (no device-filter, or one
that lists the model's PCI ID) and every profile that entry names is one of the model's profiles
in the simulator's catalog. Such a config applies through gpuops.mig.mig_config and a second run
changes nothing. Every other config is refused before any change: the module fails, says why,
and the simulated host's state file stays byte for byte the same.

One simulated host per model walks through all configs in the file's order, so each apply also
starts from the previous config's devices (the planner's transitions run too). The file is
loaded once and passed as a mapping, which keeps the whole matrix fast.
"""

import os

import pytest
import yaml

import gpuops_mig_sim as sim
from gpuops_mig_sim import models
from ansible_collections.gpuops.mig.plugins.modules import mig_config

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "mig-parted-config-default-v0.15.0.yaml")

with open(FIXTURE) as _f:
    CONFIG = yaml.safe_load(_f)

MIG_MODELS = [key for key, model in models.MODELS.items() if models.is_mig_capable(model)]


def selecting_entry(config_name, model):
    """The entry of a named config that selects a GPU of this model, or None (test's own reading)."""
    pci_id = "0x%08X" % model.pci_device_id
    for entry in CONFIG["mig-configs"][config_name]:
        wanted = entry.get("device-filter")
        if wanted is None:
            return entry
        wanted = wanted if isinstance(wanted, list) else [wanted]
        if pci_id in [w.upper().replace("0X", "0x") for w in wanted]:
            return entry
    return None


def targets(config_name, model):
    entry = selecting_entry(config_name, model)
    if entry is None:
        return False
    names = {p.name for p in model.gi_profiles.values()}
    return all(name in names for name in entry.get("mig-devices") or {})


def run(run_module, name, check_mode=False):
    return run_module(mig_config, {"config": CONFIG, "config_name": name}, check_mode=check_mode)


def test_fixture_is_the_whole_upstream_file():
    configs = CONFIG["mig-configs"]
    assert CONFIG["version"] == "v1" and len(configs) == 81
    assert list(configs)[:3] == ["all-disabled", "all-enabled", "all-1g.5gb"]
    assert len(configs["all-balanced"]) == 12


def test_every_config_targets_a_simulated_model_except_the_other_gb200_spelling():
    untargeted = sorted(name for name in CONFIG["mig-configs"]
                        if not any(targets(name, models.MODELS[key]) for key in MIG_MODELS))
    # GB200 boards whose driver names the profiles 3g.95gb, 4g.95gb and 7g.189gb (mig-parted issue
    # #227); the simulated GB200 has the 3g.93gb spelling.
    assert untargeted == ["all-3g.95gb", "all-4g.95gb", "all-7g.189gb"]


@pytest.mark.parametrize("key", MIG_MODELS)
def test_configs_that_target_the_model_apply_and_are_idempotent(key, sim_host, run_module, file_digest, tmp_path):
    """A host with one GPU of the model walks through every config that targets the model."""
    model = models.MODELS[key]
    # all-disabled: a GPU with MIG off and nothing to do; mig_config agrees and changes nothing.
    off = sim_host("1x%s" % key)
    digest = file_digest(off)
    result = run(run_module, "all-disabled")
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False and file_digest(off) == digest

    state = str(tmp_path / "enabled.json")
    sim.create_state(state, "1x%s" % key, mig="enabled")
    os.environ["GPUOPS_MIG_SIMULATE"] = state    # sim_host's monkeypatch puts the variable back
    applied = []
    for name in CONFIG["mig-configs"]:
        if name == "all-disabled" or not targets(name, model):
            continue
        wanted = {n: c for n, c in (selecting_entry(name, model).get("mig-devices") or {}).items() if c}
        result = run(run_module, name)
        assert not result.get("failed"), "%s on %s: %s" % (name, key, result.get("msg"))
        assert result["gpus"][0].get("mig_devices", {}) == wanted, (name, key, result["gpus"][0])
        digest = file_digest(state)
        again = run(run_module, name)
        assert not again.get("failed"), again.get("msg")
        assert again["changed"] is False, "%s on %s is not idempotent" % (name, key)
        assert file_digest(state) == digest
        applied.append(name)
    assert {"all-enabled", "all-balanced"} <= set(applied)


def test_configs_refused_on_every_model_they_do_not_target(sim_host, run_module, file_digest):
    """One host with a GPU of every simulated MIG model: a config that some model lacks is refused as a
    whole before any change, and the message names exactly the GPUs it cannot be applied to."""
    state = sim_host(",".join("1x%s" % key for key in MIG_MODELS), mig="enabled")
    labels = {}
    for gpu in run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {}}]})["gpus"]:
        labels[gpu["index"]] = "GPU %d (%s" % (gpu["index"], gpu["name"])
    refused = 0
    for name in CONFIG["mig-configs"]:
        if name == "all-disabled":
            continue
        missing = [i for i, key in enumerate(MIG_MODELS) if not targets(name, models.MODELS[key])]
        selected_elsewhere = [i for i in missing if selecting_entry(name, models.MODELS[MIG_MODELS[i]])]
        if not selected_elsewhere:
            continue  # only device-filters keep it off those GPUs: left alone there (next test)
        digest = file_digest(state)
        result = run(run_module, name)
        assert result.get("failed"), "%s should be refused" % name
        message = result["msg"]
        assert message.startswith("Nothing was changed.") and "Traceback" not in message, (name, message)
        for i in range(len(MIG_MODELS)):
            # Each GPU the config cannot be applied to is named with the reason; no other GPU is.
            assert (labels[i] in message) == (i in selected_elsewhere), (name, MIG_MODELS[i], message)
        assert "unknown MIG profile" in message
        assert file_digest(state) == digest, "%s changed the host while refusing" % name
        refused += 1
    # 81 configs less all-disabled, all-enabled (every model) and the three whose other entries only
    # carry device-filters (all-1g.10gb, all-1g.35gb, all-balanced: next test).
    assert refused == 76


@pytest.mark.parametrize("name", ["all-1g.10gb", "all-1g.35gb", "all-balanced"])
def test_device_filtered_configs_refuse_a_gpu_they_do_not_select(name, sim_host, run_module, file_digest):
    """Where only device-filters name other models, a host whose GPUs none of them selects is refused."""
    others = [key for key in MIG_MODELS if selecting_entry(name, models.MODELS[key]) is None]
    if not others:
        assert name == "all-balanced"    # its filters name every simulated MIG model
        return
    state = sim_host(",".join("1x%s" % key for key in others), mig="enabled")
    digest = file_digest(state)
    result = run(run_module, name)
    assert result.get("failed") and "no entry of the config selects a GPU on this host" in result["msg"], result
    assert file_digest(state) == digest
