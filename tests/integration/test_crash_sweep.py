"""A subset of the crash sweep (tests/crash/sweep.py; the whole sweep is run by hand, docs/rollout.md):
site.yml killed at chosen task boundaries of the node workflow, then run again; the fleet must be
whole afterwards. The boundaries are found by task name in an uninterrupted run, so they follow the
role when tasks move. Both scenarios: a static rollout, and a hand-off to HAMi then taken back. They
run on the worker's real test cluster, reset before each run (the uninterrupted runs included)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crash"))

import sweep  # noqa: E402

pytestmark = pytest.mark.playbook

# One point per kind of thing a crash leaves: a cordon, paused operands and stopped services with GPUs half
# changed, GPUs at the layout with /dev/nvidia-caps not following them (repaired on a converged node), a
# device-plugin restart owed, a node validated but not released.
POINTS = [
    pytest.param("drain.yml", "Drain (retried while a PodDisruptionBudget blocks an eviction)", id="before-drain"),
    pytest.param("geometry.yml", "Apply the MIG geometry", id="before-geometry"),
    pytest.param("geometry.yml", "Make /dev/nvidia-caps current for the new MIG devices", id="before-device-nodes"),
    pytest.param("device_plugin_restart.yml", "Restart the device plugin and GFD pods", id="before-device-plugin-restart"),
    pytest.param("uncordon.yml", "Uncordon and record the outcome on the node", id="before-uncordon"),
]


@pytest.fixture(scope="module")
def boundaries(tmp_path_factory, _session_cluster):
    return sweep.boundaries(tmp_path_factory.mktemp("uninterrupted"), sweep.fresh(_session_cluster))


@pytest.mark.parametrize("path, task", POINTS)
def test_a_crash_is_repaired_by_the_next_run(boundaries, cluster, tmp_path, path, task):
    # The first batch is node-a's: the node with a host service, an operand and a GPU pod.
    point = next(n for n, name, where in boundaries if where == path and name.endswith(": " + task))
    assert sweep.crash_and_rerun(tmp_path, cluster, point) == []


# The hand-off to HAMi, killed where HAMi's entry for the node is in mig mode already but not yet recorded: just
# after its ConfigMap is written, and with the node handed over but the record not yet written. The re-run must
# still record HAMi's entry as it was before the first run, for the take-back to put back.
HANDOFF_POINTS = [
    pytest.param("Put the partitioner's plugin on the node", False, id="handoff-after-hami-config"),
    pytest.param("Record the hand-off", True, id="handoff-before-record"),
]


@pytest.fixture(scope="module")
def handoff_boundaries(tmp_path_factory, _session_cluster):
    return sweep.boundaries(tmp_path_factory.mktemp("uninterrupted-handoff"), sweep.fresh(_session_cluster),
                            scenario="handoff")


@pytest.mark.parametrize("task, last", HANDOFF_POINTS)
def test_a_crashed_hand_off_is_repaired_by_the_next_run_and_taken_back(handoff_boundaries, cluster, tmp_path, task,
                                                                       last):
    # By a part of the task's name in handoff.yml (the last such task where the record may be written in steps).
    found = [n for n, name, where in handoff_boundaries if where == "handoff.yml" and task in name]
    assert found, "no task '%s' in handoff.yml: %s" % (task, handoff_boundaries)
    assert sweep.crash_and_rerun(tmp_path, cluster, found[-1] if last else found[0], scenario="handoff") == []
