"""A simulated host from its one variable gpuops_mig_simulate (_simulate.py, its filter)."""

import os
import shlex
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.mig.plugins.filter import simulate as simulate_filter
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _simulate as simulate

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 4))
PYTHON = "/opt/venv/bin/python3"
ENVIRON = {"HOME": "/home/ops", "PATH": "/usr/bin:/bin", "PYTHONPATH": "/site"}


def test_the_collection_root_holds_the_simulator_and_its_stand_ins():
    assert os.path.realpath(simulate.COLLECTION_ROOT) == os.path.realpath(ROOT)
    for name in ("nvidia-smi", "systemctl", "nvidia-ctk"):
        assert os.access(os.path.join(ROOT, "simulator", "bin", name), os.X_OK), name
    assert os.path.isfile(os.path.join(ROOT, "tools", "mig-sim"))


def test_gpus_give_a_state_per_host_and_gpu_list_in_the_cache_made_by_mig_sim():
    sim = simulate.simulated_host("2xH100-SXM5-80GB", "sim-01", PYTHON, ENVIRON,
                                  collection_root="/c")
    root = "/home/ops/.cache/gpuops-mig/simulated/sim-01/2xH100-SXM5-80GB"
    assert sim["root"] == root and sim["state"] == root + ".json"
    assert sim["create"] == [PYTHON, "/c/tools/mig-sim", "create", root + ".json",
                             "--gpus", "2xH100-SXM5-80GB", "--seed", "sim-01"]
    assert sim["environment"] == {
        "GPUOPS_MIG_SIMULATE": root + ".json",
        "PATH": "/c/simulator/bin:/opt/venv/bin:/usr/bin:/bin",
        "PYTHONPATH": "/c/simulator:/site",
        "SYSTEMD_UNIT_PATH": root + "/etc/systemd/system",
    }


def test_xdg_cache_home_is_where_the_states_go_when_set():
    environ = dict(ENVIRON, XDG_CACHE_HOME="/var/cache/me")
    sim = simulate.simulated_host("1xA100-SXM4-40GB,1xA30-24GB", "h", PYTHON, environ,
                                  collection_root="/c")
    assert sim["state"] == os.path.join("/var/cache/me/gpuops-mig/simulated/h",
                                        "1xA100-SXM4-40GB,1xA30-24GB.json")


def test_a_state_file_is_used_as_it_is_and_its_root_is_beside_it():
    sim = simulate.simulated_host("/fleet/gpu-01.json", "gpu-01", PYTHON, {},
                                  collection_root="/c")
    assert sim["state"] == "/fleet/gpu-01.json" and sim["root"] == "/fleet/gpu-01"
    assert sim["create"] is None
    assert sim["environment"]["PATH"] == "/c/simulator/bin:/opt/venv/bin"
    assert sim["environment"]["PYTHONPATH"] == "/c/simulator"


def test_the_role_settings_keep_every_write_under_the_hosts_root():
    sim = simulate.simulated_host("/fleet/gpu 01.json", "gpu-01", PYTHON, {},
                                  collection_root="/c")
    settings = sim["settings"]
    assert settings["mig_node_reboot_method"] == "command"
    assert settings["mig_node_reboot_command"] == "systemctl reboot"
    boot_id = shlex.split(settings["mig_node_reboot_boot_time_command"])
    assert boot_id == [PYTHON, "/c/tools/mig-sim", "boot-id", "/fleet/gpu 01.json"]
    paths = dict((k, v) for k, v in settings.items() if k.endswith(("_root", "_file")))
    assert sorted(paths) == ["mig_node_persist_root"]
    assert all(v == "/fleet/gpu 01" or v.startswith("/fleet/gpu 01/") for v in paths.values()), paths


@pytest.mark.parametrize("value", ["", None, "  ", "H100", "2 x H100", "2xH100;rm -rf /",
                                   True])
def test_a_value_that_is_neither_gpus_nor_a_state_file_is_refused_naming_the_host(value):
    with pytest.raises(RefusedError, match="^sim-01: gpuops_mig_simulate is"):
        simulate.simulated_host(value, "sim-01", PYTHON, ENVIRON)


def test_the_filter_refuses_as_a_filter_error():
    filters = simulate_filter.FilterModule().filters()
    with pytest.raises(AnsibleFilterError, match="sim-01: gpuops_mig_simulate"):
        filters["mig_simulated_host"]("H100", "sim-01", PYTHON)
    made = filters["mig_simulated_host"]("1xH200", "sim-01", PYTHON)["create"]
    assert made[-3:] == ["1xH200", "--seed", "sim-01"]


def test_the_create_command_makes_a_host_the_stand_ins_answer_for(tmp_path):
    environ = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}
    sim = simulate.simulated_host("1xH100-SXM5-80GB", "sim-01", sys.executable, environ)
    os.makedirs(os.path.dirname(sim["state"]))
    subprocess.run(sim["create"], check=True, capture_output=True)
    env = dict(os.environ, **sim["environment"])

    def run(argv):
        return subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    assert "H100" in run(["nvidia-smi", "-L"])
    assert "simulated by gpuops.mig simulator/bin/systemctl" in run(["systemctl", "--version"])
    assert run(shlex.split(sim["settings"]["mig_node_reboot_boot_time_command"])).strip()
