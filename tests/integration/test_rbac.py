"""The collection runs with exactly the permissions rbac/ ships (tests/integration/conftest.py
binds them to the ServiceAccount every rollout test runs as); here one rule is taken away."""

import os

import pytest
import yaml

from tests.integration.conftest import ROLLOUT_RBAC, client_env
from tests.integration.test_roles import STATE, Fleet, output
from tests.support.kubeapi import seed

pytestmark = pytest.mark.playbook


def without(manifest, resource, verb, path):
    with open(manifest, encoding="utf-8") as f:
        role = yaml.safe_load(f)
    for rule in role["rules"]:
        if resource in rule["resources"] and verb in rule["verbs"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    role["rules"] = [rule for rule in role["rules"] if rule["verbs"]]
    path.write_text(yaml.safe_dump(role))
    return str(path)


def test_a_missing_rule_stops_the_rollout_before_any_change_naming_verb_and_resource(
    cluster, tmp_path
):
    role = without(ROLLOUT_RBAC[0], "pods/eviction", "create", tmp_path / "rollout.yml")
    kubeconfig = cluster.service_account_kubeconfig(
        tmp_path / "sa.kubeconfig", "short", [role] + ROLLOUT_RBAC[1:]
    )
    fleet = Fleet(
        tmp_path, cluster, client_env(kubeconfig, tmp_path, cluster.control_plane.bin_dir)
    )
    fleet.add(
        "node-r", "1xA100-SXM4-40GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.20gb": 2}}]
    )
    cluster.seed(seed.pod("web-0", node="node-r", owner=("ReplicaSet", "web-1")))
    before = fleet.digest("node-r")

    proc = fleet.run("tests/integration/playbooks/mig_node.yml")
    assert proc.recap["node-r"]["failed"] == 1, output(proc)
    assert (
        "node-r: this run's Kubernetes identity may not create pods/eviction. A rollout needs "
        "what rbac/rollout.yml grants (docs/rbac.md). Nothing was changed." in proc.stdout
    ), output(proc)
    node = cluster.get("Node", "node-r")
    assert not node["spec"].get("unschedulable") and STATE not in node["metadata"]["labels"]
    assert fleet.digest("node-r") == before
    writes = [
        r
        for r in cluster.requests
        if r.method in ("PATCH", "PUT", "DELETE")
        or (r.method == "POST" and "accessreviews" not in r.path)
    ]
    assert writes == [], writes
    assert os.path.exists(kubeconfig)
