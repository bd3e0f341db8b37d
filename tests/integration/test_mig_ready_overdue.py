"""The MIG-ready gate's last resort (issue 34, item 3), on the real test cluster: a node that
does not converge by itself within gpuops_mig_ready_converge_seconds, and that the inventory
names, gets the node workflow run on it by the watcher, which lifts the taint only once the layout
is validated. It is bench/bench_mig_ready.py's case c, run once: the bench asserts the node's
condition ("validated by gpuops.mig run"), its state label and the layout on the host."""

import os

import pytest

from bench import bench_mig_ready as bench
from test_eda_loop import _java

pytestmark = pytest.mark.playbook


def test_an_overdue_node_the_inventory_names_gets_the_workflow_and_is_lifted_once_validated(
        cluster, tmp_path):
    _java()
    bench.Node.seen = bench.Seen(cluster)
    cluster.seed(*bench.plugin_daemonsets())
    roles = bench.ROLLOUT_RBAC + [os.path.join(bench.RBAC, "ready.yml")]
    kubeconfig = cluster.service_account_kubeconfig(tmp_path / "ready.kubeconfig", "ready", roles)
    records, dummy = bench.case_c(cluster, kubeconfig, tmp_path, repeat=1, converge=5)
    # Held until it was overdue (5 s), then cordoned by the workflow before the taint came off.
    assert records[0]["to_cordon"] >= 5 and records[0]["cordoned"] > 0, records
