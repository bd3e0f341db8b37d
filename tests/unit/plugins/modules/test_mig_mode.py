"""gpuops.mig.mig_mode through the simulator (pynvml's own code runs)."""

import os

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_facts, mig_mode, mig_node_info


def modes(state):
    return [g["mig"] for g in sim.load_state(state)["gpus"]]


def make_layout(gpu, layout):
    """Create GPU instances [(profile_id, start, size, ci_constant)] through pynvml."""
    ids = []
    with Nvml() as nvml:
        for profile_id, start, size, ci in layout:
            gi = nvml.create_gpu_instance(gpu, profile_id, start, size)
            nvml.create_compute_instance(gpu, gi, ci, 0)
            ids.append(gi)
    return ids


def test_ampere_mode_stays_pending_until_a_reset(sim_host, run_module):
    state = sim_host("1xA100-SXM4-40GB")
    result = run_module(mig_mode, {"mode": "enabled"})
    assert result["changed"] is True
    assert result["reset_required"] is True and result["reboot_required"] is False
    gpu = result["gpus"][0]
    assert gpu["mig_mode"] == {"current": "disabled", "pending": "enabled"}
    assert gpu["action_required"] == "reset"
    assert modes(state) == [{"current": 0, "pending": 1}]

    again = run_module(mig_mode, {"mode": "enabled"})
    assert again["changed"] is False and again["reset_required"] is True

    reset = run_module(mig_mode, {"mode": "enabled", "reset": True})
    assert reset["changed"] is True
    assert reset["gpus"][0]["reset"]["ok"] is True
    assert reset["gpus"][0]["reset"]["message"] == "GPU 00000000:07:00.0 was successfully reset."
    assert reset["reset_required"] is False and reset["reboot_required"] is False
    assert modes(state) == [{"current": 1, "pending": 1}]
    assert run_module(mig_mode, {"mode": "enabled", "reset": True})["changed"] is False


def test_hopper_takes_the_mode_at_once(sim_host, run_module):
    state = sim_host("2xH100-SXM5-80GB")
    result = run_module(mig_mode, {"mode": "enabled", "reset": True})
    assert result["changed"] is True and result["reset_required"] is False
    assert all(not g["reset"]["attempted"] for g in result["gpus"])
    assert all(g["mig_mode_persists_across_reboot"] is False for g in result["gpus"])
    assert modes(state) == [{"current": 1, "pending": 1}] * 2
    assert run_module(mig_mode, {"mode": "enabled"})["changed"] is False


def test_check_mode_predicts_and_changes_nothing(sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB,1xH100-SXM5-80GB")
    before = file_digest(state)
    result = run_module(mig_mode, {"mode": "enabled", "reset": True}, check_mode=True, diff=True)
    assert result["changed"] is True
    a100, h100 = result["gpus"]
    assert a100["mig_mode"] == {"current": "disabled", "pending": "enabled"}
    assert h100["mig_mode"] == {"current": "enabled", "pending": "enabled"}
    assert "current=disabled pending=enabled" in result["diff"]["after"]
    assert "current=disabled pending=disabled" in result["diff"]["before"]
    assert file_digest(state) == before


def test_passthrough_vm_needs_a_reboot(sim_host, run_module):
    state = sim_host("1xA100-SXM4-40GB")
    sim.set_host(state, passthrough=True)
    result = run_module(mig_mode, {"mode": "enabled", "reset": True})
    gpu = result["gpus"][0]
    assert result["reboot_required"] is True and result["reset_required"] is False
    assert gpu["action_required"] == "reboot"
    assert gpu["reset"]["reason"] == "not_supported"
    assert "reboot" in gpu["hint"]
    sim.reboot(state)
    after = run_module(mig_mode, {"mode": "enabled", "reset": True})
    assert after["changed"] is False and after["reboot_required"] is False
    assert modes(state) == [{"current": 1, "pending": 1}]


def test_clients_holding_the_gpu_block_the_reset(sim_host, run_module):
    state = sim_host("1xA30-24GB")
    sim.set_host(state, add_clients=["nvidia-dcgm"])
    result = run_module(mig_mode, {"mode": "enabled", "reset": True})
    gpu = result["gpus"][0]
    assert gpu["reset"] == {"attempted": True, "ok": False, "reason": "in_use",
                            "message": "Unable to reset GPU 00000000:07:00.0: In use by another client"}
    assert gpu["action_required"] == "reboot"
    assert "nvidia-dcgm" in gpu["hint"] or "dcgm" in gpu["hint"]
    assert modes(state) == [{"current": 0, "pending": 1}]


def test_disabling_destroys_idle_mig_devices(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    make_layout(0, [(9, 0, 4, 2), (9, 4, 4, 2)])
    result = run_module(mig_mode, {"mode": "disabled"})
    assert result["changed"] is True
    assert [gi["profile"] for gi in result["gpus"][0]["destroyed"]] == ["3g.40gb", "3g.40gb"]
    assert modes(state) == [{"current": 0, "pending": 0}]
    assert sim.load_state(state)["gpus"][0]["gpu_instances"] == []


def test_busy_mig_device_blocks_disabling_and_nothing_changes(sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB,1xH100-SXM5-80GB", mig="enabled")
    make_layout(1, [(9, 0, 4, 2)])
    gi = make_layout(0, [(19, 0, 1, 0), (9, 4, 4, 2)])[1]
    sim.add_process(state, 0, pid=31337, gi=gi, ci=0)
    before = file_digest(state)
    result = run_module(mig_mode, {"mode": "disabled"})
    assert result["failed"] is True
    msg = result["msg"]
    assert msg.startswith("Nothing was changed.")
    assert "GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0)" in msg
    assert "GPU instance %d (3g.20gb @4:4) compute instance 0" % gi in msg
    assert "PIDs 31337" in msg and "MIG-" in msg
    assert file_digest(state) == before   # GPU 1 was idle, but it was not touched either


def test_processes_on_a_whole_gpu_block_a_mode_change(sim_host, run_module, file_digest):
    state = sim_host("1xH100-SXM5-80GB")
    sim.add_process(state, 0, pid=777)
    before = file_digest(state)
    result = run_module(mig_mode, {"mode": "enabled"})
    assert result["failed"] is True
    assert "has processes (PIDs 777)" in result["msg"]
    assert file_digest(state) == before


@pytest.mark.parametrize("args, message", [
    ({"mode": "enabled", "gpus": ["3"]}, "GPU index 3 does not exist on this host (it has GPU indexes 0, 1)"),
    ({"mode": "enabled", "gpus": ["1"]}, "Nothing was changed. GPU 1 (NVIDIA A10, 00000000:0F:00.0) is not MIG-capable"),
    ({"mode": "enabled", "gpus": ["0", "1"]}, "Nothing was changed. GPU 1 (NVIDIA A10, 00000000:0F:00.0) is not MIG-capable"),
    ({"mode": "enabled", "gpus": ["all"], "non_capable": "fail"},
     "Nothing was changed. GPU 1 (NVIDIA A10, 00000000:0F:00.0) is not MIG-capable"),
    ({"mode": "enabled", "gpus": ["GPU-nope"]}, "no GPU with UUID GPU-nope on this host"),
    ({"mode": "enabled", "gpus": ["0x12345678"]}, "no GPU with PCI device ID 0x12345678 on this host"),
    ({"mode": "enabled", "gpus": ["gpu0"]}, "'gpu0' is not a GPU selector"),
])
def test_bad_input_is_a_clear_error_and_changes_nothing(sim_host, run_module, file_digest, args, message):
    state = sim_host("1xA100-SXM4-40GB,1xA10")
    before = file_digest(state)
    result = run_module(mig_mode, args)
    assert result["failed"] is True
    assert result["msg"].startswith(message)
    assert file_digest(state) == before


def test_all_skips_gpus_that_are_not_mig_capable(sim_host, run_module):
    state = sim_host("1xA10,1xH100-SXM5-80GB")
    result = run_module(mig_mode, {"mode": "enabled"})
    assert [g["skipped"] for g in result["gpus"]] == ["not MIG-capable", None]
    assert modes(state)[1] == {"current": 1, "pending": 1}


def test_missing_privileges_are_reported_as_such(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB")
    sim.set_host(state, deny_changes=True)
    result = run_module(mig_mode, {"mode": "enabled"})
    assert result["failed"] is True
    assert "setting MIG mode enabled: permission denied" in result["msg"]
    assert modes(state) == [{"current": 0, "pending": 0}]


def test_mode_from_a_mig_parted_config(sim_host, run_module):
    config = os.path.join(os.path.dirname(__file__), "..", "module_utils", "fixtures", "mig-parted-config.yaml")
    state = sim_host("1xH100-SXM5-80GB,1xA10,1xH100-SXM5-80GB")
    # custom-config names GPUs 3-7, which this host does not have: an error unless allowed.
    result = run_module(mig_mode, {"config_file": config, "config_name": "custom-config"})
    assert result["failed"] is True and "selects GPU index 3, but this host has" in result["msg"]
    result = run_module(mig_mode, {"config_file": config, "config_name": "custom-config", "allow_unmatched": True})
    assert result["changed"] is False          # GPUs 0-2 are to stay off, and are
    assert modes(state)[0] == {"current": 0, "pending": 0}
    result = run_module(mig_mode, {"layouts": [{"gpus": [2], "devices": {"3g.40gb": 2}}], "reset": True})
    assert [g["index"] for g in result["gpus"]] == [2]
    assert modes(state)[2] == {"current": 1, "pending": 1}
    assert modes(state)[0] == {"current": 0, "pending": 0}   # not selected: left alone


def test_mode_and_config_are_exclusive(sim_host, run_module):
    sim_host("1xH100-SXM5-80GB")
    result = run_module(mig_mode, {"mode": "enabled", "layouts": [{"gpus": "all", "devices": {}}]})
    assert result["failed"] is True and "mutually exclusive" in result["msg"]


def test_force_terminates_the_processes_in_the_way(sim_host, run_module, gpu_workload):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    gi = make_layout(0, [(9, 0, 4, 2)])[0]
    worker = gpu_workload()
    sim.add_process(state, 0, pid=worker.pid, gi=gi, ci=0, live=True)
    refused = run_module(mig_mode, {"mode": "disabled"})
    assert refused["failed"] is True and "PIDs %d" % worker.pid in refused["msg"]
    assert worker.poll() is None                    # without force nobody was harmed

    result = run_module(mig_mode, {"mode": "disabled", "force": True, "force_timeout": 5, "reset": True})
    assert result["changed"] is True
    assert result["gpus"][0]["terminated_pids"] == [worker.pid]
    assert worker.wait(timeout=5) is not None       # the workload really ended
    assert [gi["profile"] for gi in result["gpus"][0]["destroyed"]] == ["3g.20gb"]
    assert modes(state) == [{"current": 0, "pending": 0}]


@pytest.mark.parametrize("devices, message", [
    ({"3g.20gb": 3}, "3g.20gb"),                 # three 4-slice instances do not fit eight slices
    ({"4g.20gb": 1, "3g.20gb": 1, "2g.10gb": 1}, "GPU 0"),
    ({"1g.5gb": 99}, "1g.5gb"),
])
def test_a_config_whose_layout_cannot_be_built_is_refused_before_any_mode_change(
        sim_host, run_module, file_digest, devices, message):
    """mig_mode validates the whole config, geometry included: no GPU is left half-done."""
    state = sim_host("1xA100-SXM4-40GB")
    before = file_digest(state)
    result = run_module(mig_mode, {"layouts": [{"gpus": "all", "devices": devices}], "reset": True})
    assert result["failed"] is True
    assert "Nothing was changed" in result["msg"] and message in result["msg"]
    assert file_digest(state) == before


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_reset_that_could_not_run_is_refused_before_any_change(sim_host, run_module, file_digest, check_mode):
    state = sim_host("1xA100-SXM4-40GB")
    before = file_digest(state)
    result = run_module(mig_mode, {"mode": "enabled", "reset": True, "nvidia_smi": "/nonexistent/nvidia-smi"},
                        check_mode=check_mode)
    assert result["failed"] is True
    assert result["msg"] == ("Nothing was changed. nvidia_smi: /nonexistent/nvidia-smi is not an executable file "
                             "(reset=true, and GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0) would wait for a "
                             "GPU reset)")
    assert file_digest(state) == before


def test_a_missing_nvidia_smi_does_not_matter_where_no_reset_is_needed(sim_host, run_module, monkeypatch):
    state = sim_host("1xH100-SXM5-80GB")
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_module(mig_mode, {"mode": "enabled", "reset": True})   # Hopper switches at once
    assert result["changed"] is True and result["reset_required"] is False
    assert modes(state) == [{"current": 1, "pending": 1}]


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("nvidia_smi, problem", [
    ("nvidia-smi; touch /tmp/gpuops-mig-pwned", "has shell syntax (';')"),
    ("nvidia-smi | tee x", "has shell syntax ('|')"),
    ("$(which nvidia-smi)", "has shell syntax ('$')"),
    ("`which nvidia-smi`", "has shell syntax ('`')"),
    ("nvidia-smi -r", "has spaces or arguments"),
    ("bin/nvidia-smi", "is a relative path"),
    ("", "nvidia_smi is empty"),
])
def test_an_nvidia_smi_that_is_not_a_single_program_is_refused_before_any_change(
        sim_host, run_module, file_digest, check_mode, nvidia_smi, problem):
    """A shell never runs nvidia_smi; a value that needs one changes nothing, even without a reset pending."""
    state = sim_host("2xA100-SXM4-40GB", mig="enabled")
    make_layout(0, [(9, 0, 4, 2)])
    before = file_digest(state)
    result = run_module(mig_mode, {"mode": "disabled", "reset": True, "nvidia_smi": nvidia_smi},
                        check_mode=check_mode)
    assert result["failed"] is True
    assert problem in result["msg"], result["msg"]
    assert "takes a single program path" in result["msg"] and "without a shell" in result["msg"]
    assert file_digest(state) == before
    assert not os.path.exists("/tmp/gpuops-mig-pwned")


@pytest.mark.parametrize("module, module_args", [
    (mig_mode, {"mode": "enabled"}),
    (mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}]}),
    (mig_facts, {}),
    (mig_facts, {"fail_on_missing_driver": False}),   # not a missing driver: a setting to correct
    (mig_node_info, {"fail_on_missing_driver": False}),
])
def test_an_empty_driver_root_is_refused(sim_host, run_module, file_digest, module, module_args):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    before = file_digest(state)
    result = run_module(module, dict(module_args, driver_root=""))
    assert result["failed"] is True
    assert result["msg"] == "driver_root is empty; use auto, / or the driver's root directory"
    assert file_digest(state) == before


def test_a_gpu_instance_that_cannot_be_destroyed_keeps_its_compute_instances(sim_host, run_module):
    """Disabling MIG destroys compute instances, then their GPU instance; when that fails they are put back."""
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    gi = make_layout(0, [(9, 4, 4, 2)])[0]
    old_uuid = sim.load_state(state)["gpus"][0]["gpu_instances"][0]["compute_instances"][0]["uuid"]
    sim.add_fault(state, "nvmlGpuInstanceDestroy", "IN_USE")
    result = run_module(mig_mode, {"mode": "disabled"})
    assert result["failed"] is True
    assert "MIG mode change failed part-way" in result["msg"]
    assert ("destroying GPU instance %d: in use by another client" % gi) in result["msg"]
    gpu = sim.load_state(state)["gpus"][0]
    new_uuid = gpu["gpu_instances"][0]["compute_instances"][0]["uuid"]
    assert new_uuid != old_uuid
    assert ("its 1 compute instance(s) had been destroyed first and were created again at the "
            "same profiles and placements (with new MIG device UUIDs %s), so GPU instance %d "
            "(3g.40gb, placement 4:4) is whole" % (new_uuid, gi)) in result["msg"]
    # The put-back changed the device's UUID: the message says so, never "Nothing was changed".
    assert "Nothing was changed" not in result["msg"]
    assert result["msg"].endswith(
        "Done before the failure: GPU 0 (NVIDIA H100 80GB HBM3, 00000000:07:00.0): compute "
        "instances put back with new MIG device UUIDs %s, mode not set. The next run sets the "
        "modes still missing." % new_uuid), result["msg"]
    assert result["changed"] is True and result["failed_part_way"][0]["recreated"] == [new_uuid]
    assert [(g["start"], [(c["profile_id"], c["start"]) for c in g["compute_instances"]])
            for g in gpu["gpu_instances"]] == [(4, [(2, 0)])]
    assert modes(state) == [{"current": 1, "pending": 1}]
    assert run_module(mig_mode, {"mode": "disabled"})["changed"] is True
    assert modes(state) == [{"current": 0, "pending": 0}]


def test_when_the_compute_instances_cannot_be_put_back_the_message_names_the_gpu_instance(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    gi = make_layout(0, [(9, 4, 4, 2)])[0]
    sim.add_fault(state, "nvmlGpuInstanceDestroy", "IN_USE")
    sim.add_fault(state, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    result = run_module(mig_mode, {"mode": "disabled"})
    assert result["failed"] is True
    assert ("putting them back failed (creating compute instance (profile 2 at 0:3) again: insufficient resources"
            in result["msg"]), result["msg"]
    assert ("GPU instance %d (3g.40gb, placement 4:4) of GPU 0 (NVIDIA H100 80GB HBM3, 00000000:07:00.0) is left "
            "with 0 of its 1 compute instance(s) until the next run, which destroys it" % gi) in result["msg"]
    sim.clear_faults(state)
    assert run_module(mig_mode, {"mode": "disabled"})["changed"] is True
    assert sim.load_state(state)["gpus"][0]["gpu_instances"] == []


def test_a_pinned_placement_the_gpu_cannot_hold_is_refused_before_any_mode_change(sim_host, run_module, file_digest):
    state = sim_host("1xH100-SXM5-80GB")
    before = file_digest(state)
    layouts = [{"gpus": [0], "devices": [{"profile": "3g.40gb", "placement": {"start": 2, "size": 4}}]}]
    result = run_module(mig_mode, {"layouts": layouts, "reset": True})
    assert result["failed"] is True
    assert "Nothing was changed" in result["msg"] and "3g.40gb at placement 2:4" in result["msg"], result["msg"]
    assert file_digest(state) == before
