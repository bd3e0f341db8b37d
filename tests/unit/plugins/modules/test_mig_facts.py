"""gpuops.mig.mig_facts through the simulator (pynvml's own code runs)."""

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.modules import mig_facts


def facts_of(result):
    return result["ansible_facts"]["gpuops_mig"]


def test_reports_every_gpu_and_the_driver(sim_host, run_module, file_digest):
    state = sim_host("2xA100-SXM4-40GB,1xA30-24GB,1xA10", driver_version="570.124.06")
    before = file_digest(state)
    result = run_module(mig_facts, {})
    assert result["changed"] is False
    facts = facts_of(result)
    assert facts["driver"] == {"present": True, "version": "570.124.06", "cuda_version": "12.8",
                               "nvml_version": facts["driver"]["nvml_version"], "error": None,
                               "root": None, "library": "libnvidia-ml.so.1"}
    assert facts["simulated"] is True
    assert facts["gpu_count"] == 4 and facts["mig_capable_count"] == 3
    a100, dummy, a30, a10 = facts["gpus"]
    assert a100["name"] == "NVIDIA A100-SXM4-40GB"
    assert a100["pci_device_id"] == "0x20B010DE"
    assert a100["mig_mode"] == {"current": "disabled", "pending": "disabled"}
    assert a100["architecture"] == "ampere" and a100["mig_mode_persists_across_reboot"] is True
    names = {p["name"]: p for p in a100["supported_profiles"]}
    assert names["3g.20gb"]["id"] == 9 and names["3g.20gb"]["placements"] == [0, 4]
    assert names["1g.10gb"]["memory_slices"] == 2 and names["1g.10gb"]["sm_slices"] == 1
    # IDs differ per model: on the A30 profile 14 is 1g.6gb, on the A100 it is 2g.10gb.
    assert {p["id"]: p["name"] for p in a30["supported_profiles"]}[14] == "1g.6gb"
    assert names["2g.10gb"]["id"] == 14
    assert a10["mig_capable"] is False and a10["mig_mode"] is None
    assert file_digest(state) == before   # reading changes nothing


def test_reports_instances_uuids_and_processes(sim_host, run_module, file_digest):
    state = sim_host("1xH100-SXM5-80GB", mig="enabled")
    # Build a layout through pynvml itself, as any NVML client would.
    from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml
    with Nvml() as nvml:
        gi = nvml.create_gpu_instance(0, 9, 4, 4)             # 3g.40gb at slices 4-7
        nvml.create_compute_instance(0, gi, 2, 0)             # the full 3c
        gi2 = nvml.create_gpu_instance(0, 14, 0, 2)            # 2g.20gb at 0-1
        nvml.create_compute_instance(0, gi2, 0, 0)            # 1c of it
    sim.add_process(state, 0, pid=4242, gi=gi, ci=0, used_memory_mib=2048)
    facts = facts_of(run_module(mig_facts, {"profiles": False}))
    gpu = facts["gpus"][0]
    assert "supported_profiles" not in gpu
    assert gpu["mig_devices"] == {"3g.40gb": 1, "1c.2g.20gb": 1}
    by_profile = {g["profile"]: g for g in gpu["gpu_instances"]}
    big = by_profile["3g.40gb"]
    assert big["placement"] == {"start": 4, "size": 4}
    ci = big["compute_instances"][0]
    assert ci["mig_device_uuid"].startswith("MIG-")
    assert ci["processes"] == [{"pid": 4242, "used_memory_mib": 2048}]
    assert by_profile["2g.20gb"]["compute_instances"][0]["processes"] == []


def test_selection_limits_the_report(sim_host, run_module, file_digest):
    sim_host("2xA100-SXM4-40GB,1xH100-SXM5-80GB")
    facts = facts_of(run_module(mig_facts, {"gpus": ["0x233010DE"]}))
    assert [g["index"] for g in facts["gpus"]] == [2]
    facts = facts_of(run_module(mig_facts, {"gpus": ["1", "00000000:07:00.0"]}))
    assert [g["index"] for g in facts["gpus"]] == [0, 1]


def test_unknown_gpu_is_a_clear_error(sim_host, run_module, file_digest):
    sim_host("2xA100-SXM4-40GB")
    result = run_module(mig_facts, {"gpus": ["7"]})
    assert result["failed"] is True
    assert result["msg"] == "GPU index 7 does not exist on this host (it has GPU indexes 0, 1)"
    result = run_module(mig_facts, {"gpus": ["fast-ones"]})
    assert "'fast-ones' is not a GPU selector" in result["msg"]


def test_host_without_driver_is_a_fact_not_a_failure(monkeypatch, run_module):
    monkeypatch.delenv("GPUOPS_MIG_SIMULATE", raising=False)
    result = run_module(mig_facts, {})   # this machine has no libnvidia-ml
    assert not result.get("failed")
    facts = facts_of(result)
    assert facts["driver"]["present"] is False
    assert "libnvidia-ml.so.1" in facts["driver"]["error"]
    assert facts["gpus"] == []
    result = run_module(mig_facts, {"fail_on_missing_driver": True})
    assert result["failed"] is True
    assert result["msg"].startswith("No usable NVIDIA driver on this host")


def test_host_without_nvidia_ml_py_fails_saying_so(sim_host, monkeypatch, run_module):
    """A Python that cannot import pynvml knows nothing of the GPUs: not a host with none."""
    from ansible_collections.gpuops.mig.plugins.module_utils import _nvml
    sim_host("2xA100-SXM4-40GB")
    monkeypatch.setattr(_nvml, "HAS_PYNVML", False)
    for args in ({}, {"fail_on_missing_driver": True}):
        result = run_module(mig_facts, args)
        assert result["failed"] is True and "ansible_facts" not in result
        assert result["msg"].startswith("Failed to import the required Python library (nvidia-ml-py) on ")
        assert "read and change the GPUs through NVML (import pynvml)" in result["msg"]
        assert "mig_preflight_install_nvml=true" in result["msg"]


def test_nvml_failure_is_a_message_not_a_traceback(sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB")
    sim.add_fault(state, "nvmlDeviceGetMigMode", "NO_PERMISSION")
    result = run_module(mig_facts, {})
    assert result["failed"] is True
    assert result["msg"].startswith("GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0): reading the MIG mode: permission denied")
    assert "Traceback" not in result["msg"]


def test_old_driver_lists_profiles_only_while_mig_is_enabled(sim_host, run_module):
    sim_host("1xA100-SXM4-40GB", driver_version="535.183.01")
    gpu = facts_of(run_module(mig_facts, {}))["gpus"][0]
    assert gpu["mig_capable"] is True and gpu["supported_profiles"] == []
