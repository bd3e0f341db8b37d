"""Repair first (docs/rollout.md, "What happens when a run is interrupted"): a converged node on which a run
that did not finish left its record of what it owed is put right by the next run, and reported `repaired`.
On a Kubernetes node the record is the Node annotation gpuops.mig/owed; on a host outside Kubernetes, the file
var/lib/gpuops-mig/owed.json under mig_node_persist_root. The crash sweep (tests/crash, test_crash_sweep.py) makes such records by killing runs;
here they are written as such a run leaves them, so the repair is checked without the kill."""

import json
import os
import re

import pytest

import gpuops_mig_sim as sim

from test_roles import DCGM_EXPORTER, STATE, Fleet

pytestmark = pytest.mark.playbook

LAYOUT = [{"gpus": "all", "devices": {"2g.12gb": 2}}]
FAST = {"mig_node_validate_delay": "1"}
PAUSED = "paused-for-mig-change"


def record(**parts):
    return json.dumps(dict({"run": "20261125T080000Z-dead", "job": "", "time": "2026-11-25T08:00:00Z",
                            "services": [], "operands": {}, "device_plugin": False}, **parts), sort_keys=True)


def test_a_converged_node_left_owing_is_repaired_first(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    node = fleet.add("node-a", "1xA30-24GB", node_labels={DCGM_EXPORTER: "true"}, mig_node_layouts=LAYOUT)
    box = fleet.add("box-b", "1xA30-24GB", kubernetes=False, mig_node_layouts=LAYOUT)
    for state in (node, box):
        sim.set_host(state, add_clients=["nvidia-dcgm"])
    first = fleet.run("playbooks/site.yml", FAST)
    assert first.returncode == 0, first.stdout[-4000:]

    # What a run killed after pausing the clients and changing the GPUs leaves behind.
    for state in (node, box):
        sim.set_host(state, remove_clients=["nvidia-dcgm"])
    cluster.patch("Node", "node-a", {"metadata": {
        "labels": {DCGM_EXPORTER: PAUSED},
        "annotations": {"gpuops.mig/owed": record(services=["nvidia-dcgm.service"], operands={DCGM_EXPORTER: "true"},
                                                  device_plugin=True)}}})
    owed_file = os.path.join(str(fleet.dir), "box-b", "var", "lib", "gpuops-mig", "owed.json")
    os.makedirs(os.path.dirname(owed_file), exist_ok=True)   # the first run made it (and removed its record)
    with open(owed_file, "w") as handle:
        handle.write(record(services=["nvidia-dcgm.service"]))
    # ... and its hold on the node, no longer renewed.
    cluster.seed(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "gpuops-mig-node-a",
                "namespace": "default",
                "annotations": {"gpuops.mig/lease-run-id": "20261125T080000Z-dead"},
            },
            "spec": {
                "holderIdentity": "gpuops.mig run 20261125T080000Z-dead on ctl",
                "leaseDurationSeconds": 20,
                "acquireTime": "2026-11-25T08:00:00.000000Z",
                "renewTime": "2026-11-25T08:00:00.000000Z",
            },
        }
    )
    plugin = [p["metadata"]["uid"] for p in cluster.list("Pod", "nvidia-device-plugin")
              if p["spec"].get("nodeName") == "node-a"]

    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = proc.stdout
    assert "run 20261125T080000Z-dead, interrupted, left host services stopped (nvidia-dcgm.service)" in out
    for state in (node, box):
        assert sim.load_state(state)["host"]["clients"] == ["nvidia-dcgm"]
    labels = cluster.get("Node", "node-a")["metadata"]
    assert labels["labels"][DCGM_EXPORTER] == "true" and labels["labels"][STATE] == "success"
    assert "gpuops.mig/owed" not in (labels.get("annotations") or {})
    assert not os.path.exists(owed_file)
    # Taken over, then released: kept, naming no holder (the fleet's too). The collection's
    # Leases only: kwok renews each node's in kube-node-lease, the controllers theirs in
    # kube-system.
    holders = [lease["spec"]["holderIdentity"] for lease in cluster.list("Lease", "default")]
    assert holders == ["", ""]
    assert "took the lease over from gpuops.mig run 20261125T080000Z-dead on ctl" in out
    # The device plugin owed its restart: a new pod.
    assert [p["metadata"]["uid"] for p in cluster.list("Pod", "nvidia-device-plugin")
            if p["spec"].get("nodeName") == "node-a"] != plugin
    rows = dict(re.findall(r'"(node-a|box-b) +(\w+) +converged ', out))
    assert rows == {"node-a": "repaired", "box-b": "repaired"}, out[-3000:]

    again = fleet.run("playbooks/site.yml", FAST)
    assert again.returncode == 0 and "repaired" not in again.stdout and "interrupted" not in again.stdout


def test_a_record_gpuops_did_not_write_stops_the_node(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("node-a", "1xA30-24GB", mig_node_layouts=LAYOUT)
    cluster.patch("Node", "node-a",
                  {"metadata": {"annotations": {"gpuops.mig/owed": "{\"services\": \"all\"}"}}})
    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode != 0
    assert "node-a: the annotation gpuops.mig/owed is not a record gpuops.mig wrote" in proc.stdout


FORGED = {
    "services": ["sshd.service"],
    "operands": {"node-role.kubernetes.io/control-plane": "true"},
}


@pytest.mark.parametrize(
    "forged, lease_run, refused",
    [
        (
            FORGED,
            "20261125T080000Z-dead",
            "service(s) sshd.service are not among mig_node_gpu_clients; label(s) "
            "node-role.kubernetes.io/control-plane are not operand labels",
        ),
        (
            {"services": ["nvidia-dcgm.service"]},
            None,
            "its run 20261125T080000Z-dead holds no lease on the node",
        ),
        (
            {"services": ["nvidia-dcgm.service"]},
            "someone-else",
            "its run 20261125T080000Z-dead never held the node's lease "
            "(the Lease names run someone-else)",
        ),
    ],
)
def test_a_forged_record_is_refused_and_nothing_in_it_runs(
    cluster, cluster_env, tmp_path, forged, lease_run, refused
):
    """Anyone who may patch a Node (its kubelet too) can write gpuops.mig/owed: a record that asks
    for a service outside mig_node_gpu_clients, a label outside the paused operand labels, or that
    names a run the node's Lease never named, refuses the node; nothing it names is started or
    labelled."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    node = fleet.add("node-a", "1xA30-24GB", mig_node_layouts=LAYOUT)
    sim.set_host(node, add_clients=["nvidia-dcgm"])
    assert fleet.run("playbooks/site.yml", FAST).returncode == 0
    sim.set_host(node, remove_clients=["nvidia-dcgm"])
    cluster.patch(
        "Node", "node-a", {"metadata": {"annotations": {"gpuops.mig/owed": record(**forged)}}}
    )
    if lease_run:
        cluster.patch(
            "Lease",
            "gpuops-mig-node-a",
            {"metadata": {"annotations": {"gpuops.mig/lease-run-id": lease_run}}},
            namespace="default",
        )
    else:
        cluster.delete("Lease", "gpuops-mig-node-a", namespace="default")
    before = json.dumps(cluster.get("Node", "node-a")["metadata"]["labels"], sort_keys=True)

    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode != 0
    assert (
        "node-a: the annotation gpuops.mig/owed asks for what gpuops.mig does not put back"
        in proc.stdout
    )
    assert refused in proc.stdout, proc.stdout[-3000:]
    assert sim.load_state(node)["host"]["clients"] == []  # nvidia-dcgm not started either
    after = cluster.get("Node", "node-a")["metadata"]
    assert json.dumps(after["labels"], sort_keys=True) == before
    assert "gpuops.mig/owed" in after["annotations"]  # left for a person
