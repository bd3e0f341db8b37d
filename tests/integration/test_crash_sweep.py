"""A subset of the crash sweep (tests/crash/sweep.py; the whole sweep is run by hand, docs/rollout.md):
site.yml killed at chosen task boundaries of the node workflow, then run again; the fleet must be
whole afterwards. The boundaries are found by task name in an uninterrupted run, so they follow the
role when tasks move. Both scenarios: a static rollout, and a hand-off to HAMi then taken back. They
run on the worker's real test cluster, reset before each run (the uninterrupted runs included)."""

import fcntl
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crash"))

import sweep  # noqa: E402

pytestmark = pytest.mark.playbook

# One point per kind of thing a crash leaves: a cordon, paused operands and stopped services with GPUs half
# changed, GPUs at the layout with /dev/nvidia-caps not following them (repaired on a converged node), a
# device-plugin restart owed, a node validated but not released. CI (scripts/test.sh) runs the points not
# marked `full`, the GPUs half changed and the restart owed; `pytest -m full` runs the rest.
FULL = pytest.mark.full
POINTS = [
    pytest.param("drain.yml", "Drain (retried while a PodDisruptionBudget blocks an eviction)", id="before-drain",
                 marks=FULL),
    pytest.param("geometry.yml", "Apply the MIG geometry", id="before-geometry"),
    pytest.param("geometry.yml", "Make /dev/nvidia-caps current for the new MIG devices", id="before-device-nodes",
                 marks=FULL),
    pytest.param("device_plugin_restart.yml", "Restart the device plugin and GFD pods", id="before-device-plugin-restart"),
    pytest.param("uncordon.yml", "Uncordon and record the outcome on the node", id="before-uncordon",
                 marks=FULL),
]


def found_once(tmp_path_factory, cluster, scenario):
    """The boundaries of the scenario's uninterrupted run (about a minute), found once per session:
    they depend only on the role's tasks, while a module fixture runs again on every xdist worker and
    each time a worker comes back to this module."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent   # the session's directory, above each worker's
    path = shared / ("crash-boundaries-%s.json" % scenario)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # the other worker waits for it rather than runs it too
        if not path.exists():
            workdir = tmp_path_factory.mktemp("uninterrupted-" + scenario)
            path.write_text(json.dumps(sweep.boundaries(workdir, sweep.fresh(cluster),
                                                        scenario=scenario)))
    return [tuple(b) for b in json.loads(path.read_text())]


@pytest.fixture(scope="session")
def boundaries(tmp_path_factory, _session_cluster):
    return found_once(tmp_path_factory, _session_cluster, "rollout")


@pytest.mark.parametrize("path, task", POINTS)
def test_a_crash_is_repaired_by_the_next_run(boundaries, cluster, tmp_path, path, task):
    # The first batch is node-a's: the node with a host service, an operand and a GPU pod.
    point = next(n for n, name, where in boundaries if where == path and name.endswith(": " + task))
    assert sweep.crash_and_rerun(tmp_path, cluster, point) == []


# The hand-off to HAMi, killed where HAMi's entry for the node is in mig mode already but not yet recorded: just
# after its ConfigMap is written, and with the node handed over but the record not yet written. The re-run must
# still record HAMi's entry as it was before the first run, for the take-back to put back.
HANDOFF_POINTS = [
    pytest.param("Put the partitioner's plugin on the node", False, id="handoff-after-hami-config",
                 marks=FULL),
    pytest.param("Record the hand-off", True, id="handoff-before-record"),
]


@pytest.fixture(scope="session")
def handoff_boundaries(tmp_path_factory, _session_cluster):
    return found_once(tmp_path_factory, _session_cluster, "handoff")


@pytest.mark.parametrize("task, last", HANDOFF_POINTS)
def test_a_crashed_hand_off_is_repaired_by_the_next_run_and_taken_back(handoff_boundaries, cluster, tmp_path, task,
                                                                       last):
    # By a part of the task's name in handoff.yml (the last such task where the record may be written in steps).
    found = [n for n, name, where in handoff_boundaries if where == "handoff.yml" and task in name]
    assert found, "no task '%s' in handoff.yml: %s" % (task, handoff_boundaries)
    assert sweep.crash_and_rerun(tmp_path, cluster, found[-1] if last else found[0], scenario="handoff") == []
