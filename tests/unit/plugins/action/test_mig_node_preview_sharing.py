"""gpuops.mig.mig_node_preview's sharing plan (plugins/action/mig_node_preview.py sharing_plan): the checks that
need the decision (Kubernetes, the node's path), before any change."""

import pytest

from ansible_collections.gpuops.mig.plugins.action.mig_node_preview import sharing_plan
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing

INFO = {"change": {"any": True}, "planned": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "mig_enabled": True,
                                             "devices": {"1g.5gb": 7}}]}
LAYOUT = {"source_kind": "mig_node_layouts", "operator": {"present": False}, "node": {"metadata": {"labels": {}}}}
ARGS = {"sharing": {"1g.5gb": {"replicas": 2}}, "kubernetes": True, "device_plugin_config_name": "",
        "device_plugin_config_map": "nvidia/plugin-configs",
        "configmaps": {"nvidia": [{"metadata": {"name": "plugin-configs"}, "data": {}}]}}


def plan(path="reconfigure", info=None, **args):
    return sharing_plan("gpu-1", dict(ARGS, **args), INFO if info is None else info, LAYOUT,
                        {"path": path, "strategy": "mixed"})


def test_the_plan_for_a_node_that_changes():
    found = plan()
    assert found["managed"] and found["entry"] in found["data"] and found["label"] == found["entry"]


def test_nothing_without_sharing_or_without_a_layout():
    assert plan(sharing={}) == sharing.UNMANAGED
    assert plan(info=dict(INFO, change=None)) == sharing.UNMANAGED


def test_refused_outside_kubernetes_and_on_the_mig_manager_path():
    with pytest.raises(sharing.SharingError, match="gpu-1: mig_node_sharing and .* need.* Kubernetes"):
        plan(kubernetes=False)
    with pytest.raises(sharing.SharingError, match="mig_node_operator_mode=takeover"):
        plan(path="mig-manager")
    # A converged node keeps its config: nothing to refuse there.
    assert plan(path="converged")["managed"]
