"""mig_facts and mig_mode run by ansible-playbook against a simulated host."""

import json
import os
import subprocess
import sys

import pytest

import gpuops_mig_sim as sim

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.playbook


def run_playbook(playbook, extra_vars, tmp_path):
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        PATH=BIN + os.pathsep + env.get("PATH", ""),
    )
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", json.dumps(extra_vars), os.path.join(HERE, "playbooks", playbook)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_modules_in_a_playbook(tmp_path):
    state = str(tmp_path / "host.json")
    sim.create_state(state, "1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA10")
    out_file = tmp_path / "results.json"
    proc = run_playbook("modules.yml", {
        "sim_state": state,
        "sim_path": os.pathsep.join([os.path.join(REPO, "simulator", "bin"), BIN, os.environ["PATH"]]),
        "out_file": str(out_file),
    }, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out_file.read_text())

    # Check mode predicted the change but changed nothing.
    assert results["preview"]["changed"] is True
    assert results["preview"]["gpus"][0]["mig_mode_before"] == {"current": "disabled", "pending": "disabled"}

    enable = results["enable"]
    assert enable["changed"] is True
    assert enable["reset_required"] is False and enable["reboot_required"] is False
    a100, h100, a10 = enable["gpus"]
    assert a100["reset"]["attempted"] and a100["reset"]["ok"]   # Ampere needed the reset
    assert not h100["reset"]["attempted"]                        # Hopper took it at once
    assert a10["skipped"] == "not MIG-capable"

    assert results["again"]["changed"] is False
    facts = results["facts"]
    assert [g["mig_mode"] for g in facts["gpus"][:2]] == [{"current": "enabled", "pending": "enabled"}] * 2
    # The state file agrees with what the modules reported.
    state_data = sim.load_state(state)
    assert [g["mig"] for g in state_data["gpus"]][:2] == [{"current": 1, "pending": 1}] * 2
