# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""simulator/bin/nvidia-ctk `cdi generate --output`, run as a subprocess as the collection runs it."""

import os
import stat
import subprocess

import yaml

import gpuops_mig_sim as sim

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NVIDIA_CTK = os.path.join(REPO, "simulator", "bin", "nvidia-ctk")


def generate(state, output):
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=str(state))
    return subprocess.run([NVIDIA_CTK, "cdi", "generate", "--output", str(output)],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_generate_makes_a_missing_output_directory_like_the_real_command(tmp_path):
    # The real nvidia-ctk (CDI's Spec.write) runs MkdirAll(dir, 0755) before writing the spec.
    state = tmp_path / "host.json"
    sim.create_state(str(state), "1xA100-SXM4-40GB", seed="t")
    output = tmp_path / "etc" / "cdi" / "nvidia.yaml"
    result = generate(state, output)
    assert (result.returncode, result.stderr) == (0, "")
    assert stat.S_IMODE(os.stat(str(output.parent)).st_mode) == 0o755 & ~_umask()
    assert yaml.safe_load(output.read_text())["kind"] == "nvidia.com/gpu"


def test_an_output_directory_that_cannot_be_made_is_a_clean_error(tmp_path):
    state = tmp_path / "host.json"
    sim.create_state(str(state), "1xA100-SXM4-40GB", seed="t")
    (tmp_path / "etc").write_text("a file where the directory should be\n")
    result = generate(state, tmp_path / "etc" / "cdi" / "nvidia.yaml")
    assert result.returncode == 1
    assert "failed to create Spec dir" in result.stderr and "Traceback" not in result.stderr


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
