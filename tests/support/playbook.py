"""Run a few tasks on localhost with ansible-playbook and read each task's result, for tests
of modules and action plugins against a Kubernetes API."""

import json
import os
import subprocess
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def run_tasks(tasks, env, tmp_path):
    """Run `tasks` on localhost with ansible-playbook and `env`; returns {task name: result}."""
    playbook = tmp_path / "playbook.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False,
                                         "tasks": tasks}]))
    env = dict(env,
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_DEPRECATION_WARNINGS="False")
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c",
                           "local", str(playbook)],
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    plays = json.loads(proc.stdout)["plays"]
    return {task["task"]["name"]: task["hosts"]["localhost"] for task in plays[0]["tasks"]}
