"""A fault at every mutating NVML call of mig_config and mig_mode leaves no half-made MIG device.

For each transition, a clean run first counts how often each mutating NVML function is
called; then, from the same starting state, one fault is armed at each of those calls in
turn. After every faulty run: the module ended with a message (a refusal or a part-way
failure, never a traceback), no GPU instance is left without compute instances, every GPU
instance is as it was before or as the target has it, and a plain re-run converges on the
clean run's result. GPUOPS_MIG_FAULT_SWEEP_ERRORS=all tries every error of ERRORS at each call
instead of the first only (slower; the CI run keeps to the first).
"""

import os

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_mode

# Every NVML function of the simulator that changes a GPU, with errors the driver gives for it.
ERRORS = {
    "nvmlDeviceSetMigMode": ("IN_USE", "UNKNOWN"),
    "nvmlDeviceCreateGpuInstance": ("INSUFFICIENT_RESOURCES",),
    "nvmlDeviceCreateGpuInstanceWithPlacement": ("INSUFFICIENT_RESOURCES", "UNKNOWN"),
    "nvmlGpuInstanceCreateComputeInstance": ("INSUFFICIENT_RESOURCES",),
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement": ("INSUFFICIENT_RESOURCES", "UNKNOWN"),
    "nvmlComputeInstanceDestroy": ("IN_USE", "UNKNOWN"),
    "nvmlGpuInstanceDestroy": ("IN_USE", "UNKNOWN"),
}
NEVER = 10 ** 9   # a fault armed this far out only counts the calls

# H100 (GPU 0) and A100 (GPU 1): devices kept, kept with their compute instances changed,
# destroyed (one with three compute instances) and created.
BEFORE = [
    {"gpus": [0], "devices": [
        {"profile": "1g.10gb", "placement": {"start": 0}},
        {"profile": "2g.20gb", "placement": {"start": 2}},
        {"profile": "3g.40gb", "placement": {"start": 4},
         "compute_instances": [{"profile": "2c.3g.40gb", "placement": {"start": 0}},
                               {"profile": "1c.3g.40gb", "placement": {"start": 2}}]}]},
    {"gpus": [1], "devices": [
        {"profile": "3g.20gb", "placement": {"start": 0},
         "compute_instances": [{"profile": "1c.3g.20gb", "placement": {"start": s}} for s in (0, 1, 2)]},
        {"profile": "3g.20gb", "placement": {"start": 4}}]},
]
AFTER = [
    {"gpus": [0], "devices": [
        {"profile": "1g.10gb", "placement": {"start": 0}},
        {"profile": "1g.10gb", "placement": {"start": 2}},
        {"profile": "1g.10gb", "placement": {"start": 3}},
        {"profile": "3g.40gb", "placement": {"start": 4}}]},
    {"gpus": [1], "devices": [
        {"profile": "1g.5gb", "placement": {"start": s}} for s in (0, 1, 2)] + [
        {"profile": "3g.20gb", "placement": {"start": 4}}]},
]


def layout_of(state):
    """Per GPU: {(GI profile, start): ((CI profile, start), ...)}, and the MIG modes."""
    layout = []
    for gpu in sim.load_state(state)["gpus"]:
        layout.append({
            "mig": (gpu["mig"]["current"], gpu["mig"]["pending"]),
            "gpu_instances": dict(((gi["profile_id"], gi["start"]),
                                   tuple(sorted((ci["profile_id"], ci["start"]) for ci in gi["compute_instances"])))
                                  for gi in gpu["gpu_instances"]),
        })
    return layout


def calls_per_function(state, run):
    """How often a clean run calls each mutating NVML function."""
    for function in ERRORS:
        sim.add_fault(state, function, "UNKNOWN", nth=NEVER)
    result = run()
    assert not result.get("failed"), result.get("msg")
    counts = dict((fault["function"], fault["calls"]) for fault in sim.load_state(state)["faults"])
    sim.clear_faults(state)
    return counts


def errors_to_try(function):
    return ERRORS[function] if os.environ.get("GPUOPS_MIG_FAULT_SWEEP_ERRORS") == "all" else ERRORS[function][:1]


def assert_whole(state, before, after):
    """No GPU instance without compute instances; each GPU instance as it was or as the target has it."""
    for index, gpu in enumerate(layout_of(state)):
        for key, cis in gpu["gpu_instances"].items():
            assert cis, "GPU %d: GPU instance %s left without compute instances" % (index, key)
            assert cis in (before[index]["gpu_instances"].get(key), after[index]["gpu_instances"].get(key)), \
                "GPU %d: GPU instance %s half-made: %s" % (index, key, cis)


def sweep(state, run, rerun):
    """Arm one fault at each call of a clean run in turn; returns the fault points tried."""
    with open(state, "rb") as handle:
        start = handle.read()
    before = layout_of(state)
    counts = calls_per_function(state, run)
    after = layout_of(state)
    tried = []
    for function, count in sorted(counts.items()):
        for nth in range(1, count + 1):
            for error in errors_to_try(function):
                with open(state, "wb") as handle:
                    handle.write(start)
                sim.add_fault(state, function, error, nth=nth)
                result = run()
                point = "%s call %d -> %s" % (function, nth, error)
                tried.append(point)
                assert result.get("failed"), point   # every call counted changes something
                assert "failed part-way" in result["msg"] or result["msg"].startswith("Nothing was changed"), \
                    (point, result["msg"])
                assert_whole(state, before, after)
                sim.clear_faults(state)
                again = rerun()
                assert not again.get("failed"), (point, again.get("msg"))
                assert layout_of(state) == after, point
    return tried, counts


@pytest.fixture
def transition(sim_host, run_module):
    state = sim_host("1xH100-SXM5-80GB,1xA100-SXM4-40GB", mig="enabled")
    assert not run_module(mig_config, {"layouts": BEFORE}).get("failed")
    return state


def test_a_fault_anywhere_in_mig_config_leaves_every_device_whole_and_a_rerun_converges(transition, run_module):
    def run():
        return run_module(mig_config, {"layouts": AFTER})

    tried, counts = sweep(transition, run, run)
    # 2 + 1 CI destroys (the changed 3g.40gb, the 2g.20gb) + 3 (the A100's 3g.20gb), 2 GI destroys,
    # 1 CI created in the changed GI, 5 GPU instances with 5 CIs created.
    assert counts["nvmlComputeInstanceDestroy"] == 6 and counts["nvmlGpuInstanceDestroy"] == 2
    assert counts["nvmlDeviceCreateGpuInstanceWithPlacement"] == 5
    assert counts["nvmlGpuInstanceCreateComputeInstanceWithPlacement"] == 6
    assert len(tried) == sum(counts.values()) * (1 if os.environ.get("GPUOPS_MIG_FAULT_SWEEP_ERRORS") != "all"
                                                 else 2)
    assert run_module(mig_config, {"layouts": AFTER})["changed"] is False


def test_a_fault_anywhere_in_disabling_mig_leaves_every_device_whole_and_a_rerun_converges(transition, run_module):
    def run():
        return run_module(mig_mode, {"mode": "disabled", "reset": True})

    tried, counts = sweep(transition, run, run)
    # 1 + 1 + 2 and 3 + 1 CI destroys, 5 GI destroys, the mode of both GPUs.
    assert counts["nvmlComputeInstanceDestroy"] == 8 and counts["nvmlGpuInstanceDestroy"] == 5
    assert counts["nvmlDeviceSetMigMode"] == 2
    assert len(tried) >= 15
    assert layout_of(transition) == [{"mig": (0, 0), "gpu_instances": {}}] * 2
