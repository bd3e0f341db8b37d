"""Fixtures for tests that need a Kubernetes API.

`cluster` and `cluster_env` are a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok; tests/support/controlplane), one per pytest
worker, reset between tests:

    def test_drain(cluster, cluster_env):
        cluster.seed(seed.node("gpu-1"), seed.pod("web-1", node="gpu-1"))
        subprocess.run([...ansible-playbook...], env=cluster_env)
        cluster.wait_for(lambda: cluster.find("Pod", "web-1") is None, "web-1 evicted")
"""

import os
import sys

import pytest

from tests.support.controlplane.cluster import TestCluster
from tests.support.controlplane.faultproxy import FaultProxy
from tests.support.controlplane.launcher import ControlPlane
from tests.support.controlplane.standins import StandIns

BIN = os.path.dirname(sys.executable)  # .venv/bin: helm and kubectl live next to python


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """The worker's control plane, started once (about 10 s) and stopped at the end."""
    plane = ControlPlane(str(tmp_path_factory.mktemp("control-plane")))
    plane.start()
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def _session_cluster(control_plane):
    api = TestCluster(control_plane)
    stand_ins = StandIns(api).start()
    api.stand_ins = stand_ins
    yield api
    stand_ins.stop()
    api.close()


@pytest.fixture
def cluster(_session_cluster):
    """The real cluster (a TestCluster: kind-based calls, `seed`, `wait_for`, `on`, `requests`);
    what the test made is deleted afterwards. Fails at teardown if a hook raised."""
    _session_cluster.reset()
    _session_cluster.stand_ins.reset()
    yield _session_cluster
    errors = list(_session_cluster.errors)
    assert not errors, f"errors in hooks: {errors!r}"


RBAC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "rbac")
# site.yml on Kubernetes deploys the device plugin's chart by default: its rules too.
ROLLOUT_RBAC = [os.path.join(RBAC, f)
                for f in ("rollout.yml", "fleet-report.yml", "device-plugin.yml")]


@pytest.fixture
def cluster_env(cluster, tmp_path):
    """Environment for client subprocesses against the real cluster, as a ServiceAccount bound
    to exactly what rbac/rollout.yml, fleet-report.yml and device-plugin.yml grant
    (docs/rbac.md)."""
    kubeconfig = cluster.service_account_kubeconfig(tmp_path / "rollout.kubeconfig", "rollout",
                                                    ROLLOUT_RBAC)
    return client_env(kubeconfig, tmp_path, cluster.control_plane.bin_dir)


@pytest.fixture
def demand_kubeconfig(cluster, tmp_path):
    """A kubeconfig of a ServiceAccount bound to exactly what rbac/demand.yml grants the event
    source gpuops.mig.mig_demand (docs/rbac.md)."""
    return cluster.service_account_kubeconfig(tmp_path / "demand.kubeconfig", "demand",
                                              [os.path.join(RBAC, "demand.yml")],
                                              namespace="default")


@pytest.fixture
def fault_proxy(cluster):
    """A started FaultProxy (tests/support/controlplane/faultproxy.py) in front of the cluster's
    API server: `fault_proxy.kubeconfig_from(kubeconfig, path)` routes a client through it."""
    proxy = FaultProxy.for_cluster(cluster).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def admin_env(cluster, tmp_path):
    """Environment for client subprocesses as a cluster admin (helm installing a chart)."""
    return client_env(cluster.control_plane.kubeconfig, tmp_path, cluster.control_plane.bin_dir)


def client_env(kubeconfig, tmp_path, bin_dir):
    """Environment for kubectl, helm and ansible-playbook (kubernetes.core) with `kubeconfig`,
    their caches kept inside tmp_path."""
    scratch = tmp_path / "client-tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(
        KUBECONFIG=str(kubeconfig),
        K8S_AUTH_KUBECONFIG=str(kubeconfig),
        KUBECACHEDIR=str(tmp_path / "kube-cache"),
        HELM_CACHE_HOME=str(tmp_path / "helm" / "cache"),
        HELM_CONFIG_HOME=str(tmp_path / "helm" / "config"),
        HELM_DATA_HOME=str(tmp_path / "helm" / "data"),
        TMPDIR=str(scratch),  # kubernetes.core keeps its discovery cache in the temp dir
        # the kubectl built with the control plane first (the venv's is five minors older)
        PATH=os.pathsep.join([bin_dir, BIN, env.get("PATH", "")]),
    )
    return env
