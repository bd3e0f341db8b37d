# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""tools/mig-probe and the captures of real GPUs it made (tests/data/nvml-captures).

The captures were taken read-only on real H100 and H200 machines; the simulator
must answer the same NVML questions with the same numbers.
"""

import copy
import glob
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import gpuops_mig_sim as sim

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PROBE = os.path.join(REPO, "tools", "mig-probe")
CAPTURES = sorted(glob.glob(os.path.join(REPO, "tests", "data", "nvml-captures", "*.json")))


def probe_tool(*args, env=None):
    full_env = dict(os.environ)
    full_env.pop("GPUOPS_MIG_SIMULATE", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, PROBE] + list(args), capture_output=True, text=True,
                          timeout=120, env=full_env, check=False)


def load_probe_module():
    loader = importlib.machinery.SourceFileLoader("mig_probe", PROBE)
    spec = importlib.util.spec_from_loader("mig_probe", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(path):
    with open(path) as f:
        return json.load(f)


def test_there_are_captures_of_real_gpus():
    names = sorted(gpu["name"] for path in CAPTURES for gpu in load(path)["gpus"])
    assert names == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


@pytest.mark.parametrize("capture", CAPTURES, ids=os.path.basename)
def test_simulator_matches_the_real_driver(capture):
    result = probe_tool("--compare", capture)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "matches" in result.stdout and "differs" not in result.stdout


def test_compare_names_each_difference():
    mig_probe = load_probe_module()
    real = load(CAPTURES[0])["gpus"][0]
    sim_gpu = copy.deepcopy(real)
    profile = next(p for p in sim_gpu["gi_profiles"] if p.get("name") == "MIG 3g.40gb")
    profile["memorySizeMB"] += 256
    profile["placements"] = profile["placements"][:1]
    sim_gpu["gi_profiles"][-1] = {"constant": sim_gpu["gi_profiles"][-1]["constant"], "error": "NVML error 3: Not Supported"}
    lines = mig_probe.diff_gpu(real, sim_gpu)
    assert "GI profile constant 2 (MIG 3g.40gb) memorySizeMB: real 40448, simulator 40704" in lines
    assert any("(MIG 3g.40gb) placements" in line for line in lines)
    assert any(line.startswith("GI profile constant 17: real NVML error 2") for line in lines)
    assert len(lines) == 3


def test_probe_reads_instances_and_changes_nothing(tmp_path):
    state = str(tmp_path / "host.json")
    sim.create_state(state, "1xA100-SXM4-40GB", mig="enabled")
    from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml
    with Nvml(simulate=state) as nvml:
        gi = nvml.create_gpu_instance(0, 9, 4, 4)      # 3g.20gb at slices 4-7
        nvml.create_compute_instance(0, gi, 0, 1)      # a 1c inside it, at SM slice 1
    with open(state, "rb") as f:
        before = hashlib.sha256(f.read()).hexdigest()

    result = probe_tool(env={"GPUOPS_MIG_SIMULATE": state})
    assert result.returncode == 0, result.stderr
    gpu = json.loads(result.stdout)["gpus"][0]
    with open(state, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == before

    assert gpu["mig_mode"] == [1, 1] and gpu["max_mig_device_count"] == 7
    assert "uuid" not in gpu   # captures are meant to be committed
    by_name = {p["name"]: p for p in gpu["gi_profiles"] if "name" in p}
    assert by_name["MIG 3g.20gb"]["remaining_capacity"] == 1
    assert by_name["MIG 7g.40gb"]["remaining_capacity"] == 0
    [instance] = gpu["gpu_instances"]
    assert instance["profile_id"] == 9 and instance["placement"] == [4, 4]
    assert instance["compute_instances"] == [{"id": 0, "profile_id": 0, "placement": [1, 1]}]
    assert [c["name"] for c in instance["ci_profiles"]] == ["MIG 1c.3g.20gb", "MIG 2c.3g.20gb", "MIG 3g.20gb"]


def test_simulated_capture_has_the_shape_of_a_real_one():
    result = probe_tool("--simulate", "H200")
    assert result.returncode == 0, result.stderr
    simulated = json.loads(result.stdout)
    real = load(next(path for path in CAPTURES if "h200" in path))
    assert sorted(simulated) == sorted(real)
    assert sorted(simulated["gpus"][0]) == sorted(real["gpus"][0])
