"""The NVML adapter: naming, error wording, reset parsing, and simulator isolation."""

import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _nvml

GIB = 1024 ** 3


@pytest.mark.parametrize("profile_mib, total_mib, expected", [
    (4864, 40960, 5),        # A100-40GB 1g.5gb
    (9856, 40960, 10),       # A100-40GB 2g.10gb
    (19968, 40960, 20),      # A100-40GB 3g.20gb
    (40192, 40960, 40),      # A100-40GB 7g.40gb
    (5836, 24576, 6),        # A30 1g.6gb
    (16384, 143771, 18),     # H200 1g.18gb (17.6 rounds up)
    (71168, 143771, 71),     # H200 3g.71gb (70.5 rounds half up, not to even)
    (22528, 183359, 23),     # B200 1g.23gb (22.5 rounds half up)
])
def test_profile_memory_name_matches_nvidia_tools(profile_mib, total_mib, expected):
    assert _nvml.mig_profile_memory_gb(profile_mib, total_mib * 1024 * 1024) == expected


def test_profile_and_device_names():
    assert _nvml.gi_profile_name(7, 1, 4864, 40960 * 1024 * 1024) == "1g.5gb+me"
    assert _nvml.gi_profile_name(9, 1, 9856, 40960 * 1024 * 1024) == "1g.10gb"
    assert _nvml.mig_device_name(3, 3, "3g.20gb") == "3g.20gb"
    assert _nvml.mig_device_name(1, 3, "3g.20gb") == "1c.3g.20gb"


@pytest.mark.parametrize("text, reason", [
    ("Unable to reset GPU 00000000:07:00.0: In use by another client", "in_use"),
    ("Unable to reset GPU 00000000:07:00.0 because it's being used by some other process", "in_use"),
    ("Unable to reset GPU 00000000:07:00.0: Not Supported", "not_supported"),
    ("GPU Reset couldn't run because GPU 00000000:07:00.0 is the primary GPU.", "primary"),
    ("Unable to reset GPU 00000000:07:00.0: Unknown Error", "other"),
])
def test_reset_refusals_are_classified(text, reason):
    assert _nvml.classify_reset_failure(text) == reason
    assert reason in _nvml.RESET_HINTS


def test_reset_runs_nvidia_smi_per_gpu_and_reads_its_answer():
    calls = []

    def run(argv):
        calls.append(argv)
        if argv[-1] == "00000000:07:00.0":
            return 0, "GPU 00000000:07:00.0 was successfully reset.\n", ""
        return 255, "", "Unable to reset GPU 00000000:0F:00.0: In use by another client\n"

    out = _nvml.reset_gpus(["00000000:07:00.0", "00000000:0F:00.0"], run, "/usr/bin/nvidia-smi")
    assert calls == [["/usr/bin/nvidia-smi", "-r", "-i", "00000000:07:00.0"],
                     ["/usr/bin/nvidia-smi", "-r", "-i", "00000000:0F:00.0"]]
    assert out["00000000:07:00.0"][:2] == (True, None)
    assert out["00000000:0F:00.0"][:2] == (False, "in_use")


def test_reset_through_the_simulated_nvidia_smi(tmp_path):
    from ansible_collections.gpuops.mig.plugins.module_utils import _nvml_sim as sim
    state = str(tmp_path / "h.json")
    sim.create_state(state, "1xA100-SXM4-40GB")
    sim.set_host(state, passthrough=True)
    smi = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "tools", "sim-bin", "nvidia-smi")

    def run(argv):
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, GPUOPS_MIG_SIMULATE=state), check=False)
        return p.returncode, p.stdout, p.stderr

    out = _nvml.reset_gpus(["00000000:07:00.0"], run, smi)
    assert out["00000000:07:00.0"][:2] == (False, "not_supported")


def test_nvml_errors_read_as_sentences():
    assert "permission denied" in _nvml.nvml_reason(4)
    assert "in use by another client" in _nvml.nvml_reason(19)
    assert _nvml.nvml_reason(4242) == "NVML error 4242"


def test_simulator_is_not_loaded_without_the_variable():
    code = (
        "import sys\n"
        "from ansible_collections.gpuops.mig.plugins.module_utils import _nvml\n"
        "try:\n"
        "    _nvml.Nvml().__enter__()\n"
        "except _nvml.DriverNotFound as e:\n"
        "    print('driver:', e)\n"
        "print('sim loaded:', any('_nvml_sim' in m for m in sys.modules))\n"
    )
    env = dict(os.environ)
    env.pop("GPUOPS_MIG_SIMULATE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "driver: the NVML library (libnvidia-ml.so.1) was not found" in out
    assert "sim loaded: False" in out


def test_missing_pynvml_is_its_own_error(monkeypatch):
    monkeypatch.setattr(_nvml, "HAS_PYNVML", False)
    with pytest.raises(_nvml.MissingLibrary):
        _nvml.Nvml().__enter__()


def test_terminate_processes_ends_real_processes():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _nvml.pid_alive(proc.pid)
        assert _nvml.terminate_processes([proc.pid], timeout=5) == []
        assert not _nvml.pid_alive(proc.pid)   # a zombie counts as gone
    finally:
        proc.kill()
        proc.wait()
