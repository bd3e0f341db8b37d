"""Run the collection's modules in-process against simulated GPUs.

The module code, the NVML adapter and pynvml's own functions all run; only
libnvidia-ml is replaced by the simulator (GPUOPS_MIG_SIMULATE).
"""

import hashlib
import json
import os

import pytest

from ansible.module_utils.testing import patch_module_args

import gpuops_mig_sim as sim

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SIM_BIN = os.path.join(REPO, "simulator", "bin")


class ModuleResult(dict):
    """The module's JSON result; ``failed`` tells whether it called fail_json."""


def _run_module(module, args, capsys, check_mode=False, diff=False):
    args = dict(args)
    args["_ansible_check_mode"] = check_mode
    args["_ansible_diff"] = diff
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            module.main()
    out = capsys.readouterr().out
    return ModuleResult(json.loads(out))


def _file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def run_module(capsys):
    """run_module(module, args, check_mode=False, diff=False) -> the module's JSON result."""
    def run(module, args, check_mode=False, diff=False):
        return _run_module(module, args, capsys, check_mode=check_mode, diff=diff)
    return run


@pytest.fixture
def file_digest():
    """file_digest(path) -> sha256 of the file, to prove a state file is unchanged byte for byte."""
    return _file_digest


@pytest.fixture
def sim_host(tmp_path, monkeypatch):
    """A factory: sim_host("2xA100-SXM4-40GB,1xA30-24GB") -> path of a fresh simulated host."""
    monkeypatch.setenv("PATH", SIM_BIN + os.pathsep + os.environ.get("PATH", ""))

    def make(gpus, **kwargs):
        path = str(tmp_path / "state.json")
        sim.create_state(path, gpus, **kwargs)
        monkeypatch.setenv("GPUOPS_MIG_SIMULATE", path)
        return path

    return make


@pytest.fixture(autouse=True)
def _fresh_pynvml():
    """pynvml keeps the loaded library and its function pointers in module globals;
    every test starts and ends without any (as a fresh module process would)."""
    import pynvml
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()


@pytest.fixture
def gpu_workload():
    """gpu_workload() -> a real, sleeping host process to register as a live GPU process."""
    import subprocess
    import sys
    procs = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
