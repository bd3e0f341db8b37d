"""A subset of the crash sweep (tests/crash/sweep.py; the whole sweep is run by hand, docs/rollout.md):
site.yml killed at chosen task boundaries of the node workflow, then run again; the fleet must be
whole afterwards. The boundaries are found by task name in an uninterrupted run, so they follow the
role when tasks move."""

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
def boundaries(tmp_path_factory):
    return sweep.boundaries(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.parametrize("path, task", POINTS)
def test_a_crash_is_repaired_by_the_next_run(boundaries, tmp_path, path, task):
    # The first batch is node-a's: the node with a host service, an operand and a GPU pod.
    point = next(n for n, name, where in boundaries if where == path and name.endswith(": " + task))
    assert sweep.crash_and_rerun(tmp_path, point) == []
