# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""tools/mig-sim and simulator/bin/nvidia-smi, run as subprocesses like users and the collection run them."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import gpuops_mig_sim as sim

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MIG_SIM = os.path.join(REPO, "tools", "mig-sim")
NVIDIA_SMI = os.path.join(REPO, "simulator", "bin", "nvidia-smi")
# The tools must work with a plain python3 too (no Ansible, no pynvml); fall back to this interpreter.
PLAIN_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def mig_sim(*args, python=sys.executable):
    return subprocess.run([python, MIG_SIM] + [str(a) for a in args], capture_output=True, text=True, timeout=60, check=False)


def nvidia_smi(state, *args, **kwargs):
    """Runs the shim; through this interpreter unless direct=True (then its shebang picks python3)."""
    env = dict(os.environ)
    env.pop("GPUOPS_MIG_SIMULATE", None)
    if state:
        env["GPUOPS_MIG_SIMULATE"] = str(state)
    command = [NVIDIA_SMI] if kwargs.get("direct") else [sys.executable, NVIDIA_SMI]
    return subprocess.run(command + list(args), capture_output=True, text=True, timeout=60, env=env, check=False)


def state_of(path):
    with open(str(path)) as f:
        return json.load(f)


@pytest.fixture
def host(tmp_path):
    path = tmp_path / "host.json"
    sim.create_state(str(path), ["2xA100-SXM4-40GB", "1xH100-SXM5-80GB,1xA10"], seed="t")
    return path


def test_models_lists_the_catalog():
    result = mig_sim("models", python=PLAIN_PYTHON)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("A30-24GB") and "0x20B710DE" in line and "24576 MiB" in line for line in lines)
    assert any(line.startswith("L40S") and line.endswith("no") for line in lines)


def test_create_and_show(tmp_path):
    host = tmp_path / "host.json"
    result = mig_sim("create", host, "--gpus", "2xA100-SXM4-40GB", "--gpus", "1xH100-SXM5-80GB,1xA10", "--seed", "t")
    assert result.returncode == 0, result.stderr
    state = state_of(host)
    assert state == sim.create_state(str(tmp_path / "same.json"), ["2xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA10"], seed="t")
    assert [g["model"] for g in state["gpus"]] == ["A100-SXM4-40GB", "A100-SXM4-40GB", "H100-SXM5-80GB", "A10"]
    assert (state["driver_version"], state["cuda_driver_version"]) == ("570.124.06", 12080)
    shown = mig_sim("show", host, python=PLAIN_PYTHON)
    assert shown.returncode == 0
    assert "GPU 2  00000000:47:00.0  H100-SXM5-80GB  NVIDIA H100 80GB HBM3" in shown.stdout
    assert "MIG: not supported" in shown.stdout
    assert json.loads(mig_sim("show", host, "--json").stdout) == state


def test_create_options(tmp_path):
    path = tmp_path / "s.json"
    result = mig_sim("create", path, "--gpus", "1xA30-24GB", "--driver", "535.183.01", "--cuda", "12020",
                     "--mig", "enabled")
    assert result.returncode == 0, result.stderr
    state = state_of(path)
    assert state["nvml_version"] == "12.535.183.01"
    assert state["gpus"][0]["mig"] == {"current": 1, "pending": 1}


@pytest.mark.parametrize("args, message", [
    (["--gpus", "2xV100"], "unknown GPU model 'V100'"),
    (["--gpus", "0xA10"], "count must be at least 1"),
    (["--gpus", "1xA10", "--driver", "five"], "bad driver version"),
])
def test_create_rejects_bad_input(tmp_path, args, message):
    path = tmp_path / "s.json"
    result = mig_sim("create", path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not path.exists()


def test_create_refuses_to_overwrite_without_force(host):
    before = host.read_bytes()
    result = mig_sim("create", host, "--gpus", "1xH200")
    assert result.returncode == 2 and "already exists" in result.stderr
    assert host.read_bytes() == before
    assert mig_sim("create", host, "--gpus", "1xH200", "--force").returncode == 0
    assert [g["model"] for g in state_of(host)["gpus"]] == ["H200"]


def test_missing_state_file(tmp_path):
    result = mig_sim("show", tmp_path / "nope.json")
    assert result.returncode == 2 and "cannot read the simulated host state" in result.stderr


def test_processes(host):
    assert mig_sim("process", "add", host, "--gpu", 0, "--pid", 4242, "--name", "train",
                   "--memory-mib", 1024).returncode == 0
    assert mig_sim("process", "add", host, "--gpu", 3, "--pid", 7, "--type", "graphics").returncode == 0
    processes = state_of(host)["processes"]
    assert [(p["pid"], p["gpu"], p["name"], p["used_memory_mib"], p["type"]) for p in processes] == [
        (4242, 0, "train", 1024, "compute"), (7, 3, "python", 0, "graphics")]
    bad = mig_sim("process", "add", host, "--gpu", 0, "--gi", 1, "--ci", 0, "--pid", 1)
    assert bad.returncode == 2 and "does not have MIG enabled" in bad.stderr
    assert mig_sim("process", "clear", host, "--gpu", 3).returncode == 0
    assert [p["pid"] for p in state_of(host)["processes"]] == [4242]
    assert mig_sim("process", "clear", host).returncode == 0
    assert state_of(host)["processes"] == []


def test_host_quirks(host):
    result = mig_sim("host", host, "--passthrough", "on", "--deny-changes", "on", "--mode-change-survives-reboot",
                     "off", "--client", "add", "nvidia-dcgm", "--client", "add", "nvsm", "--auto-placement", "lowest")
    assert result.returncode == 0, result.stderr
    assert state_of(host)["host"] == {"passthrough": True, "deny_changes": True, "mode_change_survives_reboot": False,
                                      "clients": ["nvidia-dcgm", "nvsm"], "auto_placement": "lowest", "driver_root": None,
                                      "root": None}
    root = os.path.join(os.path.dirname(host), "root")
    assert mig_sim("host", host, "--root", root).returncode == 0
    assert state_of(host)["host"]["root"] == root and os.path.isfile(os.path.join(root, "proc", "devices"))
    assert mig_sim("host", host, "--root", "none").returncode == 0 and state_of(host)["host"]["root"] is None
    assert mig_sim("host", host, "--client", "remove", "nvsm", "--passthrough", "off").returncode == 0
    assert state_of(host)["host"]["clients"] == ["nvidia-dcgm"]
    bad = mig_sim("host", host, "--client", "remove", "nvsm")
    assert bad.returncode == 2 and "no host client 'nvsm'" in bad.stderr
    assert mig_sim("host", host, "--passthrough", "maybe").returncode == 2


def test_faults(host):
    result = mig_sim("fault", "add", host, "--function", "nvmlDeviceCreateGpuInstanceWithPlacement", "--nth", 2,
                     "--error", "INSUFFICIENT_RESOURCES", "--sticky")
    assert result.returncode == 0, result.stderr
    assert mig_sim("fault", "add", host, "--function", "nvmlInit", "--error", "9").returncode == 0
    faults = state_of(host)["faults"]
    assert [(f["symbols"], f["nth"], f["error"], f["sticky"]) for f in faults] == [
        (["nvmlDeviceCreateGpuInstanceWithPlacement"], 2, 23, True), (["nvmlInitWithFlags"], 1, 9, False)]
    assert "fault: nvmlInit call 1 -> DRIVER_NOT_LOADED (9)" in mig_sim("show", host).stdout
    bad = mig_sim("fault", "add", host, "--function", "nvmlNope", "--error", "IN_USE")
    assert bad.returncode == 2 and "unknown NVML function" in bad.stderr
    assert mig_sim("fault", "clear", host).returncode == 0
    assert state_of(host)["faults"] == []


def test_reset_reboot_and_boot_id(host):
    boot = mig_sim("boot-id", host, python=PLAIN_PYTHON).stdout.strip()
    assert boot == state_of(host)["boot_id"]
    result = mig_sim("reset", host, "--gpu", "00000000:0F:00.0")
    assert (result.returncode, result.stdout) == (0, "GPU 00000000:0F:00.0 was successfully reset.\n")
    sim.set_host(str(host), add_clients=["nvidia-dcgm"])
    result = mig_sim("reset", host)
    assert result.returncode == 255
    assert result.stdout.splitlines()[0] == "Unable to reset GPU 00000000:07:00.0: In use by another client"
    rebooted = mig_sim("reboot", host)
    assert rebooted.returncode == 0
    new_boot = mig_sim("boot-id", host).stdout.strip()
    assert new_boot == rebooted.stdout.strip() != boot


def test_nvidia_smi_list(host):
    sim.create_state(str(host), "1xA100-SXM4-40GB,1xA10", mig="enabled", force=True)
    state = state_of(host)
    result = nvidia_smi(host, "-L", direct=True)   # once through the shebang, as the collection runs it
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: %s)" % state["gpus"][0]["uuid"],
        "GPU 1: NVIDIA A10 (UUID: %s)" % state["gpus"][1]["uuid"],
    ]


def test_nvidia_smi_reset(host):
    result = nvidia_smi(host, "-r", "-i", "00000000:07:00.0,0000:0F:00.0")
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["GPU 00000000:07:00.0 was successfully reset.",
                                          "GPU 00000000:0F:00.0 was successfully reset."]
    sim.add_process(str(host), 1, 99)
    result = nvidia_smi(host, "--gpu-reset", "-i", "00000000:07:00.0,00000000:0F:00.0")
    assert result.returncode == 255
    assert result.stdout.splitlines() == ["GPU 00000000:07:00.0 was successfully reset.",
                                          "Unable to reset GPU 00000000:0F:00.0: In use by another client"]
    sim.set_host(str(host), passthrough=True)
    result = nvidia_smi(host, "-r", "-i", "00000000:07:00.0")
    assert (result.returncode, result.stdout) == (3, "Unable to reset GPU 00000000:07:00.0: Not Supported\n")


def test_nvidia_smi_errors(host):
    before = host.read_bytes()
    unknown = nvidia_smi(host, "-r", "-i", "00000000:AA:00.0")
    assert (unknown.returncode, unknown.stdout) == (6, "No devices were found\n")
    assert nvidia_smi(host, "-q").returncode == 2
    assert nvidia_smi(None, "-L").returncode == 9
    assert host.read_bytes() == before


def test_mig_sim_drives_the_library_end_to_end(host):
    """The CLI and the library share the file: a GI created through NVML shows up in show and -L."""
    sim.create_state(str(host), "1xH100-SXM5-80GB", mig="enabled", force=True)
    code = ("import sys; sys.path.insert(0, sys.argv[2]);"
            "import gpuops_mig_sim as sim; import pynvml as n;"
            "sim.install(sys.argv[1]); n.nvmlInit(); d = n.nvmlDeviceGetHandleByIndex(0);"
            "gi = n.nvmlDeviceCreateGpuInstance(d, 9); n.nvmlGpuInstanceCreateComputeInstance(gi, 2)")
    subprocess.run([sys.executable, "-c", code, str(host), os.path.join(REPO, ".build", "collections")], check=True)
    assert "GI 1  3g.40gb (profile id 9)  placement 4:4" in mig_sim("show", host).stdout
    listing = nvidia_smi(host, "-L").stdout.splitlines()
    assert listing[1].startswith("  MIG 3g.40gb     Device  0: (UUID: MIG-")
