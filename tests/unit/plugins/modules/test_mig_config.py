"""gpuops.mig.mig_config through the simulator (pynvml's own code runs)."""

import os

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.modules import mig_config

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "module_utils", "fixtures")
CONFIG = os.path.abspath(os.path.join(FIXTURES, "mig-parted-config.yaml"))


def devices(result, index):
    return next(g for g in result["gpus"] if g["index"] == index)


def uuids(gpu_report):
    return {ci["uuid"] for gi in gpu_report["devices"] for ci in gi["compute_instances"]}


def apply(run_module, name, **kwargs):
    args = {"config_file": CONFIG, "config_name": name}
    args.update(kwargs.pop("args", {}))
    return run_module(mig_config, args, **kwargs)


def test_mixed_model_host_converges_and_is_idempotent(sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA30-24GB", mig="enabled")
    before = file_digest(state)
    preview = apply(run_module, "all-balanced", check_mode=True, diff=True)
    assert preview["changed"] is True
    assert file_digest(state) == before
    assert devices(preview, 0)["plan"]["created_devices"] == 4
    assert "3g.20gb" in preview["diff"]["after"] and "(no MIG devices)" in preview["diff"]["before"]

    result = apply(run_module, "all-balanced")
    assert result["changed"] is True
    assert devices(result, 0)["mig_devices"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert devices(result, 1)["mig_devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert devices(result, 2)["mig_devices"] == {"1g.6gb": 2, "2g.12gb": 1}
    assert all(u.startswith("MIG-") for u in uuids(devices(result, 0)))
    assert any("0x2330" in label for label in result["unmatched"]) or result["unmatched"]

    again = apply(run_module, "all-balanced")
    assert again["changed"] is False
    assert uuids(devices(again, 1)) == uuids(devices(result, 1))


def test_devices_that_can_stay_keep_their_uuids(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB", mig="enabled")
    seven = apply(run_module, "all-1g.5gb")
    before = {(gi["placement"]["start"], gi["compute_instances"][0]["uuid"]) for gi in devices(seven, 0)["devices"]}
    result = apply(run_module, "all-balanced")
    gpu = devices(result, 0)
    after = {(gi["placement"]["start"], gi["compute_instances"][0]["uuid"]) for gi in gpu["devices"]}
    kept = before & after
    assert len(kept) == 2                      # two 1g.5gb devices stay, with their UUIDs
    assert gpu["plan"]["destroyed_devices"] == 5
    assert gpu["mig_devices"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def test_a_busy_device_is_kept_when_the_new_layout_has_room_for_it(sim_host, run_module):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    first = apply(run_module, "all-3g.20gb")
    busy = devices(first, 0)["devices"][1]
    sim.add_process(state, 0, pid=5150, gi=busy["gi_id"], ci=busy["compute_instances"][0]["ci_id"])
    result = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.20gb": 1, "1g.5gb": 3}}]})
    gpu = devices(result, 0)
    assert busy["compute_instances"][0]["uuid"] in uuids(gpu)
    assert gpu["mig_devices"] == {"1g.5gb": 3, "3g.20gb": 1}


def test_a_busy_device_that_must_go_stops_everything(sim_host, run_module, file_digest):
    state = sim_host("2xA100-SXM4-40GB", mig="enabled")
    first = apply(run_module, "all-3g.20gb")
    busy = devices(first, 1)["devices"][0]
    sim.add_process(state, 1, pid=6060, gi=busy["gi_id"], ci=busy["compute_instances"][0]["ci_id"])
    before = file_digest(state)
    result = apply(run_module, "all-1g.5gb")
    assert result["failed"] is True
    assert result["msg"].startswith("Nothing was changed.")
    assert "GPU 1 (NVIDIA A100-SXM4-40GB, 00000000:0F:00.0)" in result["msg"]
    assert "6060" in result["msg"] and busy["compute_instances"][0]["uuid"] in result["msg"]
    assert file_digest(state) == before   # GPU 0 was free to change, but nothing ran


def test_failure_part_way_leaves_no_half_made_device_and_rerun_converges(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    sim.add_fault(state, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "INSUFFICIENT_RESOURCES", nth=2)
    result = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}]})
    assert result["failed"] is True
    assert "failed part-way" in result["msg"]
    assert result["msg"].count("GPU 0 (NVIDIA H100 80GB HBM3") == 1   # the GPU is named once
    report = result["failed_part_way"][0]
    assert [s["action"] for s in report["done"]] == ["create_gi"]
    state_gpu = sim.load_state(state)["gpus"][0]
    assert len(state_gpu["gpu_instances"]) == 1
    assert all(gi["compute_instances"] for gi in state_gpu["gpu_instances"])   # nothing half-made
    again = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}]})
    assert again["changed"] is True
    assert devices(again, 0)["mig_devices"] == {"3g.40gb": 2}
    assert devices(again, 0)["plan"]["created_devices"] == 1


@pytest.mark.parametrize("args, expected", [
    ({"layouts": [{"gpus": "all", "devices": {"3g.40gb": 1}}]},
     "GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0): layouts[0] (gpus: all): unknown MIG profile '3g.40gb'"),
    ({"layouts": [{"gpus": [0], "devices": {"4g.20gb": 2}}]}, "4g.20gb x2 requested, but this GPU model holds at most 1"),
    ({"layouts": [{"gpus": [0], "devices": {"4g.20gb": 1, "2g.10gb": 2}}]}, "need"),
    ({"layouts": [{"gpus": [3], "devices": {"1g.5gb": 1}}]}, "selects GPU index 3, but this host has"),
    ({"layouts": [{"gpus": "all", "devices": {"1g.5gb": 1}, "colour": "red"}]}, "unknown key"),
    ({"config": {"version": "v1", "mig-configs": {"a": [{"devices": 0, "mig-enabled": True, "mig-devices": {}}]}}},
     "devices"),
    ({"config_file": "BROKEN"}, "broken.yaml: not valid YAML"),
    ({"config_file": "/nonexistent/config.yaml"},
     "config_file /nonexistent/config.yaml cannot be read: No such file or directory"),
    ({"config_file": CONFIG, "config_name": "all-teapots"}, "no config named 'all-teapots'; available: "),
    # YAML text, as the mig_node role passes a file read on the controller: a config defined twice is
    # refused rather than the last definition winning.
    ({"config": "version: v1\nmig-configs:\n  big: [{devices: all, mig-enabled: true, mig-devices: {7g.40gb: 1}}]\n"
                "  big: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}]\n", "config_name": "big"},
     "found duplicate key 'big'"),
    ({"config": 42}, "expected a mapping with 'version' and 'mig-configs', got"),
])
def test_bad_input_is_a_clear_error_and_changes_nothing(sim_host, run_module, file_digest, tmp_path, args, expected):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    if args.get("config_file") == "BROKEN":
        broken = tmp_path / "broken.yaml"
        broken.write_text("version: v1\nmig-configs: {a: [devices: all\n")
        args = {"config_file": str(broken)}
    before = file_digest(state)
    result = run_module(mig_config, args)
    assert result["failed"] is True, result
    assert expected in result["msg"]
    assert file_digest(state) == before


def test_config_as_yaml_text_is_applied_like_a_mapping(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB", mig="enabled")
    with open(CONFIG) as f:
        text = f.read()
    result = run_module(mig_config, {"config": text, "config_name": "all-1g.5gb"})
    assert result["changed"] is True and devices(result, 0)["mig_devices"] == {"1g.5gb": 7}


def test_mig_disabled_where_devices_are_asked_for(sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB")
    before = file_digest(state)
    result = apply(run_module, "all-3g.20gb")
    assert result["failed"] is True
    assert "wants MIG enabled, but it is disabled" in result["msg"]
    assert file_digest(state) == before
    preview = apply(run_module, "all-3g.20gb", check_mode=True)   # the decide step of a rollout
    assert preview["changed"] is True and devices(preview, 0)["mode_mismatch"]


def test_force_terminates_workloads_on_devices_that_must_go(sim_host, run_module, gpu_workload):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    first = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}]})
    doomed = devices(first, 0)["devices"][0]
    worker = gpu_workload()
    sim.add_process(state, 0, pid=worker.pid, gi=doomed["gi_id"], ci=doomed["compute_instances"][0]["ci_id"],
                    live=True)
    target = {"layouts": [{"gpus": "all", "devices": {"7g.80gb": 1}}]}
    refused = run_module(mig_config, target)
    assert refused["failed"] is True and str(worker.pid) in refused["msg"]
    result = run_module(mig_config, dict(target, force=True, force_timeout=5))
    assert result["changed"] is True
    assert devices(result, 0)["done"][0] == {"action": "terminate", "pids": [worker.pid]}
    assert worker.wait(timeout=5) is not None
    assert devices(result, 0)["mig_devices"] == {"7g.80gb": 1}


def test_check_mode_before_the_mode_change_on_an_old_driver(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB", driver_version="535.183.01")   # lists no profiles while MIG is off
    preview = apply(run_module, "all-3g.20gb", check_mode=True)
    assert preview["changed"] is True
    assert devices(preview, 0)["mode_mismatch"] and devices(preview, 0)["plan"] is None


def test_gpus_that_are_not_mig_capable_are_reported_not_touched(sim_host, run_module):
    sim_host("1xA10,1xH100-SXM5-80GB", mig="enabled")
    result = run_module(mig_config, {"layouts": [{"gpus": "all", "devices": {"7g.80gb": 1}}]})
    assert "skipped" not in result      # a top-level 'skipped' would make Ansible ignore changed_when/failed_when
    assert result["skipped_gpus"] == ["GPU 0 (NVIDIA A10) (layouts[0] (gpus: all))"]
    assert [g["index"] for g in result["gpus"]] == [1]


# H100: a 3g.40gb at 4:4 split into 1c.3g.40gb x3 (GI profile 9, CI profile 0 at 0, 1, 2).
THREE_COMPUTE_INSTANCES = [{"gpus": [0], "devices": [
    {"profile": "3g.40gb", "placement": {"start": 4},
     "compute_instances": [{"profile": "1c.3g.40gb", "placement": {"start": s}} for s in (0, 1, 2)]}]}]


def compute_instances_of(state):
    return [(gi["start"], sorted((ci["profile_id"], ci["start"]) for ci in gi["compute_instances"]))
            for gi in sim.load_state(state)["gpus"][0]["gpu_instances"]]


def uuids_of(state):
    """The MIG device UUIDs of GPU 0, by compute instance ID."""
    return [ci["uuid"] for gi in sim.load_state(state)["gpus"][0]["gpu_instances"]
            for ci in sorted(gi["compute_instances"], key=lambda c: c["id"])]


def test_a_gpu_instance_that_cannot_be_destroyed_gets_its_compute_instances_back(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    assert run_module(mig_config, {"layouts": THREE_COMPUTE_INSTANCES})["changed"] is True
    before = compute_instances_of(state)
    sim.add_fault(state, "nvmlGpuInstanceDestroy", "IN_USE")
    target = {"layouts": [{"gpus": "all", "devices": {"1g.10gb": 7}}]}
    result = run_module(mig_config, target)
    assert result["failed"] is True
    assert "destroying GPU instance 1: in use by another client (processes, or services such as " \
           "nvidia-persistenced, DCGM or nvsm); its 3 compute instance(s) had been destroyed first and were " \
           "created again at the same profiles and placements (with new MIG device UUIDs %s), " \
           "so GPU instance 1 (3g.40gb, placement 4:4) is whole. The next run continues from " \
           "here." % ", ".join(uuids_of(state)) in result["msg"], result["msg"]
    assert compute_instances_of(state) == before == [(4, [(0, 0), (0, 1), (0, 2)])]
    sim.clear_faults(state)
    assert devices(run_module(mig_config, target), 0)["mig_devices"] == {"1g.10gb": 7}


def test_a_compute_instance_change_that_fails_puts_the_old_ones_back(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    assert run_module(mig_config, {"layouts": THREE_COMPUTE_INSTANCES})["changed"] is True
    before = compute_instances_of(state)
    sim.add_fault(state, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    whole = {"layouts": [{"gpus": [0], "devices": [{"profile": "3g.40gb", "placement": {"start": 4}}]}]}
    result = run_module(mig_config, whole)
    assert result["failed"] is True
    assert result["failed_part_way"][0]["plan"]["change"], "the GPU instance is kept and its CIs changed"
    assert "its compute instances were put back as they were (same profiles and placements, new " \
           "MIG device UUIDs %s), so GPU instance 1 (3g.40gb, placement 4:4) is whole" \
           % ", ".join(uuids_of(state)) in result["msg"], result["msg"]
    assert compute_instances_of(state) == before
    sim.clear_faults(state)
    assert devices(run_module(mig_config, whole), 0)["mig_devices"] == {"3g.40gb": 1}
    assert compute_instances_of(state) == [(4, [(2, 0)])]


def test_a_new_gpu_instance_that_cannot_be_removed_again_is_named(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    sim.add_fault(state, "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    sim.add_fault(state, "nvmlGpuInstanceDestroy", "UNKNOWN")
    target = {"layouts": [{"gpus": [0], "devices": [{"profile": "3g.40gb", "placement": {"start": 4}}]}]}
    result = run_module(mig_config, target)
    assert result["failed"] is True
    assert "removing the new GPU instance 1 (3g.40gb, placement 4:4) again failed too (GPU 0 (NVIDIA H100 80GB " \
           "HBM3, 00000000:07:00.0): destroying GPU instance 1: unknown error reported by the driver): it is left " \
           "without some of its compute instances until the next run" in result["msg"], result["msg"]
    assert compute_instances_of(state) == [(4, [])]
    sim.clear_faults(state)
    assert devices(run_module(mig_config, target), 0)["mig_devices"] == {"3g.40gb": 1}
    assert compute_instances_of(state) == [(4, [(2, 0)])]
