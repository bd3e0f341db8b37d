"""gpuops.mig.mig_generate_config and gpuops.mig.mig_plan run by ansible-playbook with arguments as
playbooks give them: ansible-core 2.19 hands the actions tagged values, from a literal, from play vars
and from group_vars alike. Odd ones are refused with a message, never a traceback."""

import json
import os
import subprocess
import sys

import gpuops_mig_sim as sim
import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts, node_facts

pytestmark = pytest.mark.playbook

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)
GPUS = [facts(0, "A100-40GB", mig_enabled=False), facts(1, "H100-80GB", [])]


def run_playbook(tmp_path, tasks, group_vars, environment=None):
    """The play on one local host; the task results of the json callback, by task name."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(group_vars))
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "gpu-a": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    play = [{"hosts": "gpu_nodes", "gather_facts": False, "vars": {"play_gpus": GPUS},
             "environment": environment or {}, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
               ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    return dict((t["task"]["name"], t["hosts"]["gpu-a"]) for play in report["plays"] for t in play["tasks"])


def test_generate_config_from_a_literal_play_vars_and_group_vars(tmp_path):
    results = run_playbook(tmp_path, [
        {"name": "literal", "gpuops.mig.mig_generate_config": {"gpus": GPUS}},
        {"name": "vars", "gpuops.mig.mig_generate_config": {"gpus": "{{ play_gpus }}"}},
        {"name": "group_vars", "gpuops.mig.mig_generate_config": {"gpus": "{{ group_gpus }}"}},
    ], {"group_gpus": GPUS})
    contents = set()
    for name in ("literal", "vars", "group_vars"):
        result = results[name]
        assert not result.get("failed"), (name, result.get("msg"))
        parsed = migparted.load_config(result["content"])
        assert "all-balanced" in parsed.names and len(result["models"]) == 2
        contents.add(result["content"])
    assert len(contents) == 1


def test_generate_config_from_the_facts_mig_facts_gathered(tmp_path):
    state = str(tmp_path / "gpu-a.json")
    sim.create_state(state, "1xA100-SXM4-40GB,1xA30-24GB", seed="gpu-a")
    results = run_playbook(tmp_path, [
        {"name": "facts", "gpuops.mig.mig_facts": {}},
        {"name": "generate", "gpuops.mig.mig_generate_config": {}, "run_once": True},
    ], {}, environment={"GPUOPS_MIG_SIMULATE": state, "PYTHONPATH": os.path.join(REPO, "simulator")})
    assert not results["generate"].get("failed"), results["generate"].get("msg")
    assert [m["pci_device_id"] for m in results["generate"]["models"]] == ["0x20B010DE", "0x20B710DE"]
    migparted.load_config(results["generate"]["content"])


def test_odd_arguments_fail_the_task_with_a_message(tmp_path):
    fleet = {"gpu-a": node_facts(GPUS)}
    results = run_playbook(tmp_path, [
        {"name": "demand 5", "gpuops.mig.mig_plan": {"demand": 5, "fleet": fleet}, "ignore_errors": True},
        {"name": "exact_limit -1", "gpuops.mig.mig_plan": {"demand": {"1g.10gb": 1}, "fleet": fleet,
                                                           "exact_limit": -1}, "ignore_errors": True},
        {"name": "gpus 5", "gpuops.mig.mig_generate_config": {"gpus": 5}, "ignore_errors": True},
        {"name": "odd facts", "gpuops.mig.mig_generate_config": {"gpus": "{{ odd_gpus }}"}, "ignore_errors": True},
        {"name": "planned", "gpuops.mig.mig_plan": {"demand": {"1g.10gb": 1}, "fleet": fleet}},
    ], {"odd_gpus": [dict(GPUS[0], pci_device_id="0xZZ")]})
    expected = {
        "demand 5": "MIG plan refused, nothing planned: demand must be a mapping of MIG profile to count, or a list "
                    "of items; got 5",
        "exact_limit -1": "exact_limit must be a non-negative integer (0: the heuristic at once), got -1",
        "gpus 5": "gpus must be a list of GPU facts (ansible_facts.gpuops_mig.gpus of gpuops.mig.mig_facts), got 5",
        "odd facts": "GPU 0: pci_device_id must be a PCI device ID 0xDDDDVVVV (8 hex digits), got '0xZZ'",
    }
    for name, message in expected.items():
        assert results[name].get("failed") is True and message in results[name]["msg"], (name, results[name])
        assert not results[name]["msg"].startswith("Task failed"), (name, results[name]["msg"])
    assert results["planned"]["report"]["demand_met"] is True
