"""Exact checkpoint and restore: mig_facts(checkpoint=true) -> simulated reboot -> mig_mode + mig_config.

The layout is built with pinned placements that the planner would not choose on its own (and with
several compute instances in one GPU instance), so only an exact restore gets it back.
"""

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_facts, mig_mode


def facts(run_module, **args):
    args.setdefault("checkpoint", True)
    result = run_module(mig_facts, args)
    assert result["changed"] is False
    return result["ansible_facts"]["gpuops_mig"]


def exact_layout(gpu_facts):
    """What a restore must reproduce: every GI and CI by profile and placement (ids and UUIDs differ)."""
    return sorted(
        (gi["profile"], gi["placement"]["start"], gi["placement"]["size"],
         tuple(sorted((ci["profile"], ci["placement"]["start"], ci["placement"]["size"])
                      for ci in gi["compute_instances"])))
        for gi in gpu_facts["gpu_instances"])


# Per model, a layout at placements the planner would not pick by itself (gaps, 1g devices spread out,
# compute instances out of order inside a GPU instance).
LAYOUTS = {
    "H100-SXM5-80GB": [
        {"profile": "3g.40gb", "placement": {"start": 4, "size": 4},
         "compute_instances": [{"profile": "1c.3g.40gb", "placement": {"start": 2}},
                               {"profile": "2c.3g.40gb", "placement": {"start": 0}}]},
        {"profile": "1g.10gb", "placement": {"start": 1}},
        {"profile": "1g.10gb", "placement": {"start": 3}},
        {"profile": "1g.10gb+me", "placement": {"start": 2}},
    ],
    "A100-SXM4-40GB": [
        {"profile": "2g.10gb", "placement": {"start": 2},
         "compute_instances": [{"profile": "1c.2g.10gb", "placement": {"start": 1}}]},
        {"profile": "1g.5gb", "placement": {"start": 0}},
        {"profile": "3g.20gb", "placement": {"start": 4}},
    ],
    "RTX-PRO-6000-BSE": [
        {"profile": "1g.24gb+gfx", "placement": {"start": 9, "size": 3}},
        {"profile": "1g.24gb-me", "placement": {"start": 0}},
        {"profile": "1g.24gb", "placement": {"start": 6}},
    ],
}


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_checkpoint_restores_the_same_devices_at_the_same_placements_after_a_reboot(
        key, sim_host, run_module, file_digest):
    state = sim_host("1x%s,1xA10" % key, mig="enabled")
    built = run_module(mig_config, {"layouts": [{"gpus": [0], "devices": LAYOUTS[key]}]})
    assert not built.get("failed"), built.get("msg")
    before = facts(run_module)
    saved = before["checkpoint"]
    assert len(saved) == 1                     # the A10 is not MIG-capable: not in the checkpoint
    assert saved[0]["gpus"] == [0] and saved[0]["mig_enabled"] is True
    assert saved[0]["device_filter"] == before["gpus"][0]["pci_device_id"]
    wanted = exact_layout(before["gpus"][0])
    assert len(wanted) == len(LAYOUTS[key])

    # Applying the checkpoint to the node it came from changes nothing.
    digest = file_digest(state)
    same = run_module(mig_config, {"layouts": saved})
    assert same["changed"] is False and file_digest(state) == digest

    sim.reboot(state)                          # GPU instances are gone (and, on Hopper+, the MIG mode)
    assert facts(run_module)["gpus"][0]["gpu_instances"] == []

    mode = run_module(mig_mode, {"layouts": saved})
    assert not mode.get("failed"), mode.get("msg")
    restored = run_module(mig_config, {"layouts": saved})
    assert not restored.get("failed"), restored.get("msg")
    assert restored["changed"] is True
    after = facts(run_module)
    assert exact_layout(after["gpus"][0]) == wanted
    assert after["checkpoint"] == saved

    again = run_module(mig_config, {"layouts": saved})
    assert again["changed"] is False


def test_checkpoint_of_mig_disabled_and_empty_gpus(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB,1xH200", mig="disabled")
    saved = facts(run_module)["checkpoint"]
    assert saved == [{"gpus": [0], "device_filter": "0x20B010DE", "mig_enabled": False},
                     {"gpus": [1], "device_filter": "0x233510DE", "mig_enabled": False}]
    assert run_module(mig_config, {"layouts": saved})["changed"] is False
    assert "checkpoint" not in facts(run_module, checkpoint=False)


def test_checkpoint_is_refused_on_another_gpu_model(sim_host, run_module, file_digest):
    sim_host("1xH100-SXM5-80GB", mig="enabled")
    run_module(mig_config, {"layouts": [{"gpus": [0], "devices": LAYOUTS["H100-SXM5-80GB"]}]})
    saved = facts(run_module)["checkpoint"]
    state = sim_host("1xH200", mig="enabled", force=True)
    digest = file_digest(state)
    result = run_module(mig_config, {"layouts": saved})
    assert result.get("failed") and "no entry of the config selects a GPU on this host" in result["msg"]
    # The refusal names the checkpoint's filter and the model the GPU is now.
    assert ("layouts[0] (gpus: [0]; device_filter: 0x233010DE) is for another GPU model: GPU 0 (NVIDIA H200) "
            "has PCI device ID 0x233510DE") in result["msg"], result["msg"]
    assert file_digest(state) == digest


@pytest.mark.parametrize("devices, message", [
    ([{"profile": "3g.40gb", "placement": {"start": 2}}],
     "devices[0]: this GPU cannot hold 3g.40gb at placement 2:4 (its placements: 0:4,4:4)"),
    ([{"profile": "3g.40gb", "placement": {"start": 0, "size": 8}}],
     "devices[0]: placement size 8 does not match 3g.40gb, which takes 4 memory slices"),
    ([{"profile": "2g.20gb", "placement": {"start": 2}}, {"profile": "1g.20gb", "placement": {"start": 2}}],
     "devices[1]: placement 2:2 overlaps another pinned GPU instance"),
    ([{"profile": "7g.80gb", "placement": {"start": 0}}, {"profile": "1g.10gb"}],
     "the requested devices (1g.10gb x1) need 1 SM slices plus 7 for the pinned GPU instances, but this GPU "
     "model has 7"),
    ([{"profile": "3g.40gb", "placement": {"start": 0},
       "compute_instances": [{"profile": "2c.3g.40gb", "placement": {"start": 1}}]}],
     "devices[0]: 2c.3g.40gb cannot start at SM slice 1 inside 3g.40gb"),
    ([{"profile": "3g.40gb", "placement": {"start": 0},
       "compute_instances": [{"profile": "1c.2g.20gb"}]}],
     "devices[0]: 1c.2g.20gb is not a compute instance of 3g.40gb"),
    ([{"profile": "3g.48gb", "placement": {"start": 0}}],
     "devices[0]: unknown MIG profile '3g.48gb'"),
])
def test_a_pin_the_gpu_cannot_hold_is_refused_before_any_change(devices, message, sim_host, run_module,
                                                                file_digest):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    run_module(mig_config, {"layouts": [{"gpus": [0], "devices": {"1g.10gb": 2}}]})
    digest = file_digest(state)
    result = run_module(mig_config, {"layouts": [{"gpus": [0], "devices": devices}]})
    assert result.get("failed")
    assert result["msg"].startswith("Nothing was changed. GPU 0 (NVIDIA H100 80GB HBM3"), result["msg"]
    assert "layouts[0] (gpus: [0])" in result["msg"] and message in result["msg"], result["msg"]
    assert file_digest(state) == digest


def test_pins_and_counts_mix_and_existing_devices_stay(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB", mig="enabled")
    first = run_module(mig_config, {"layouts": [{"gpus": [0], "devices": {"3g.20gb": 1}}]})
    gi = first["gpus"][0]["devices"][0]
    # Keep that 3g.20gb where it is (pinned), add two 1g.5gb wherever the planner likes.
    pinned = {"profile": "3g.20gb", "placement": dict(gi["placement"])}
    result = run_module(mig_config, {"layouts": [{"gpus": [0], "devices": [pinned, {"profile": "1g.5gb"},
                                                                           {"profile": "1g.5gb"}]}]})
    assert not result.get("failed"), result.get("msg")
    gpu = result["gpus"][0]
    assert gpu["mig_devices"] == {"1g.5gb": 2, "3g.20gb": 1}
    kept = [d for d in gpu["devices"] if d["profile"] == "3g.20gb"]
    assert kept[0]["placement"] == gi["placement"]
    assert kept[0]["compute_instances"][0]["uuid"] == gi["compute_instances"][0]["uuid"]   # not recreated
    assert gpu["plan"]["destroyed_devices"] == 0
