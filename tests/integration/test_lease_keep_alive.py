"""A node's hold kept alive while the run lives (issue 37; plugins/module_utils/_keep_alive.py),
on the real control plane, as the rollout's ServiceAccount: a short Lease outlasts a step longer
than itself, ends with the run, and a run killed mid-step blocks the node for one duration at
most."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.module_utils._keep_alive import lock_path
from tests.support.controlplane.client import ApiError

pytestmark = pytest.mark.playbook

BIN = os.path.dirname(os.path.abspath(sys.executable))
DURATION = 6


def playbook(tmp_path, run_id, pause):
    """Take gpu-1's Lease (keep_alive, DURATION s), then run a step of `pause` seconds."""
    path = tmp_path / ("hold-%s.yml" % run_id)
    path.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Hold the node",
                            "gpuops.mig.mig_node_lease": {
                                "state": "acquired",
                                "node": "gpu-1",
                                "namespace": "default",
                                "holder": {"run_id": run_id},
                                "duration": DURATION,
                                "keep_alive": True,
                            },
                            "register": "hold",
                        },
                        {
                            "name": "Say what keeps it",
                            "ansible.builtin.debug": {
                                "msg": "kept: {{ hold.kept_alive }}; taken over from: "
                                "{{ hold.taken_over_from | default('nobody') }}"
                            },
                        },
                        {
                            "name": "A step longer than the lease",
                            "ansible.builtin.pause": {"seconds": pause},
                        },
                    ],
                }
            ]
        )
    )
    return path


def start(tmp_path, env, run_id, pause):
    log = open(str(tmp_path / ("%s.log" % run_id)), "w")
    return subprocess.Popen(
        [
            os.path.join(BIN, "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook(tmp_path, run_id, pause)),
        ],
        env=dict(env, ANSIBLE_PYTHON_INTERPRETER=sys.executable),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def lease(cluster):
    try:
        return cluster.get("Lease", "gpuops-mig-gpu-1", "default")
    except ApiError:
        return None


def renewals(cluster, seconds):
    """The renew times seen over `seconds`."""
    seen = set()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        current = lease(cluster)
        if current and current["spec"].get("holderIdentity"):
            seen.add(current["spec"]["renewTime"])
        time.sleep(0.5)
    return seen


def test_a_short_lease_outlasts_a_long_step_and_ends_with_its_run(cluster, cluster_env, tmp_path):
    proc = start(tmp_path, cluster_env, "run-a", 4 * DURATION)
    cluster.wait_for(lambda: lease(cluster) is not None, "the hold", timeout=60)
    during = renewals(cluster, 3 * DURATION)
    assert len(during) >= 4, during  # renewed every DURATION / 3 s while the step runs
    lock = lock_path("default/gpuops-mig-gpu-1/run-a")
    assert os.path.exists(lock)      # the keep-alive's flock, held while it runs
    assert proc.wait(timeout=120) == 0, (tmp_path / "run-a.log").read_text()
    assert "kept: started; taken over from: nobody" in (tmp_path / "run-a.log").read_text()
    time.sleep(DURATION / 3 + 2)  # the keep-alive sees the run gone
    after = renewals(cluster, DURATION)
    assert len(after) <= 1, after  # no renewal once the run ended
    assert not os.path.exists(lock)  # and the keep-alive removed its file as it ended


def test_a_run_killed_mid_step_blocks_the_node_for_one_duration_at_most(
    cluster, cluster_env, tmp_path
):
    proc = start(tmp_path, cluster_env, "run-dead", 600)
    cluster.wait_for(lambda: lease(cluster) is not None, "the hold", timeout=60)
    time.sleep(DURATION)
    os.killpg(proc.pid, signal.SIGKILL)  # the controller dies in the middle of a step
    proc.wait(timeout=30)
    killed = time.monotonic()
    # Another run waits for the node and takes it over once the dead run's hold lapses.
    second = start(tmp_path, cluster_env, "run-next", 0)
    assert second.wait(timeout=120) != 0  # refused at once: the hold is still fresh
    taken = None
    while time.monotonic() - killed < 4 * DURATION:
        retry = start(tmp_path, cluster_env, "run-next", 0)
        if retry.wait(timeout=120) == 0:
            taken = time.monotonic() - killed
            break
        time.sleep(1)
    log = (tmp_path / "run-next.log").read_text()
    assert taken is not None, log
    assert taken <= DURATION + DURATION / 3 + 8, taken  # a duration after its last renewal
    assert "taken over from: gpuops.mig run run-dead" in log, log
