"""Fixtures for tests that need a Kubernetes API: the emulator in tests/support/kubeapi.

    def test_drain(kube_api, kube_env):
        kube_api.seed(seed.node("gpu-1"), seed.pod("web-1", node="gpu-1", owner=("ReplicaSet", "web")))
        subprocess.run([...ansible-playbook...], env=kube_env)   # clients find the API via KUBECONFIG
        assert kube_api.find("Pod", "web-1") is None
"""

import os
import sys

import pytest

from tests.support.kubeapi import KubeAPI

BIN = os.path.dirname(sys.executable)  # .venv/bin: helm and kubectl live next to python


@pytest.fixture
def kube_api(tmp_path):
    """A started emulator on a free loopback port; `kube_api.kubeconfig` is a kubeconfig for it.

    Seed it with `kube_api.seed(seed.node(...), seed.pod(...), ...)` (tests.support.kubeapi.seed).
    The test fails at teardown if a hook or controller raised inside the emulator.
    """
    api = KubeAPI().start()
    api.write_kubeconfig(tmp_path / "kubeconfig")
    yield api
    api.stop()
    assert not api.errors, f"errors inside the Kubernetes emulator: {api.errors!r}"


@pytest.fixture
def kube_env(kube_api, tmp_path):
    """Environment for client subprocesses (kubectl, helm, ansible-playbook with kubernetes.core):
    the emulator's kubeconfig, and helm/kubectl/discovery caches kept inside tmp_path."""
    scratch = tmp_path / "client-tmp"
    scratch.mkdir()
    env = dict(os.environ)
    env.update(
        KUBECONFIG=kube_api.kubeconfig,
        K8S_AUTH_KUBECONFIG=kube_api.kubeconfig,
        KUBECACHEDIR=str(tmp_path / "kube-cache"),
        HELM_CACHE_HOME=str(tmp_path / "helm" / "cache"),
        HELM_CONFIG_HOME=str(tmp_path / "helm" / "config"),
        HELM_DATA_HOME=str(tmp_path / "helm" / "data"),
        TMPDIR=str(scratch),  # kubernetes.core keeps its discovery cache in the temp dir
        PATH=BIN + os.pathsep + env.get("PATH", ""),
    )
    return env
