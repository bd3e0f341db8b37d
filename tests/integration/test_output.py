"""The gpuops.mig.rollout stdout callback on a real rollout: the preview, each batch, each node's steps
in order, a failure in one line, the summary; a converged re-run in a few lines."""

import re

import pytest

import gpuops_mig_sim as sim
from test_roles import Fleet, output

pytestmark = pytest.mark.playbook


def test_a_rollout_an_operator_can_follow(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.env["ANSIBLE_STDOUT_CALLBACK"] = "gpuops.mig.rollout"
    fleet.add("node-1", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}])
    bad = fleet.add("node-2", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 4}}])
    sim.add_fault(bad, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    knobs = {"gpuops_mig_max_fail_percentage": 100, "mig_node_validate_delay": 1}

    first = fleet.run("playbooks/site.yml", knobs)
    lines = first.stdout.splitlines()
    assert first.returncode == 2, output(first)
    assert "TASK [" not in first.stdout and "skipping:" not in first.stdout and "PLAY RECAP" not in first.stdout
    assert "== Check and preview every node before anything changes" in lines
    assert any(line.strip().startswith("Batch 1: ") for line in lines), first.stdout
    steps = [line.split("  ", 1)[1] for line in lines if re.match(r"^\d\d:\d\d:\d\d node-1  ", line)]
    assert steps == ["cordon and drain", "pause the GPU clients", "MIG mode", "MIG geometry", "boot-time restore",
                     "restore the GPU clients", "restart the device plugin", "validate what the node advertises",
                     "uncordon"], first.stdout
    # The step that failed, then the node's verdict; the playbook's repeat of the verdict is not said again.
    failures = [line for line in lines if line.startswith("FAILED node-2: ")]
    assert [f.split(": ")[1] for f in failures] == ["Apply the MIG geometry", "Fail with what went wrong"], first.stdout
    assert all("insufficient resources" in f for f in failures), first.stdout
    assert "[ERROR]" not in first.stdout + first.stderr and "Origin:" not in first.stdout, first.stdout
    assert lines[-2:] == ["-- 2 node(s): 2 changed, 1 failed, 0 unreachable", "  failed: node-2"], first.stdout

    sim.clear_faults(bad)
    again = fleet.run("playbooks/site.yml", knobs)
    assert again.returncode == 0, output(again)
    rerun = fleet.run("playbooks/site.yml", knobs)
    assert rerun.returncode == 0 and "0 changed, 0 failed" in rerun.stdout, output(rerun)
    assert len(rerun.stdout.splitlines()) <= 12, rerun.stdout
    # A group left empty (no node converged, or none changes) is no host-pattern warning.
    for run in (first, again, rerun):
        assert "Could not match supplied host pattern" not in run.stdout + run.stderr, output(run)


def test_a_host_that_is_no_kubernetes_node_is_not_said_to_be_cordoned(tmp_path):
    """A Slurm box, say: no cluster. Its steps name no cordon, drain or uncordon."""
    fleet = Fleet(tmp_path)
    fleet.env["ANSIBLE_STDOUT_CALLBACK"] = "gpuops.mig.rollout"
    fleet.add("slurm-1", "1xA30-24GB", kubernetes=False,
              mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}])
    run = fleet.run("playbooks/site.yml", {"gpuops_mig_kubernetes": False})
    assert run.returncode == 0, output(run)
    steps = [line.split("  ", 1)[1] for line in run.stdout.splitlines()
             if re.match(r"^\d\d:\d\d:\d\d slurm-1  ", line)]
    assert steps == ["pause the GPU clients", "MIG mode", "MIG geometry", "boot-time restore",
                     "restore the GPU clients"], run.stdout
    assert "Could not match supplied host pattern" not in run.stdout + run.stderr, output(run)
