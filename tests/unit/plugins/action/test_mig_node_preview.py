"""gpuops.mig.mig_node_preview's controller-side helpers (the action as a whole runs in the playbook tests)."""

import pytest

from ansible_collections.gpuops.mig.plugins.action import mig_node_preview as a


def args(**kw):
    base = dict(plan=None, config=None, config_file=None, layouts=None, configmap=None, kubernetes=True,
                k8s_node_name=None, nodes=[], reboot_method="reboot", reboot_command="")
    base.update(kw)
    return base


def test_sources_a_plan_wins():
    assert a.sources_of(args()) == []
    assert a.sources_of(args(layouts=[{"gpus": "all"}], configmap="cm")) == ["mig_node_layouts", "mig_node_config_configmap"]
    assert a.sources_of(args(layouts=[{"gpus": "all"}], plan={"layouts": []})) == ["gpuops_mig_plan"]
    assert a.sources_of(args(config="", config_file="f.yaml")) == ["mig_node_config_file"]


def test_settings_are_checked_before_anything():
    a.check_settings("gpu-1", args(), ["mig_node_layouts"])
    with pytest.raises(a.Refused, match="gpu-1: declare the MIG layout with exactly one of .* found mig_node_config, "
                                        "mig_node_layouts."):
        a.check_settings("gpu-1", args(), ["mig_node_config", "mig_node_layouts"])
    with pytest.raises(a.Refused, match="mig_node_reboot_method=command needs mig_node_reboot_command"):
        a.check_settings("gpu-1", args(reboot_method="command"), [])
    a.check_settings("gpu-1", args(reboot_method="command", reboot_command="systemctl reboot"), [])


def test_pick_node_by_name():
    nodes = [{"metadata": {"name": "gpu-1"}}, {"metadata": {"name": "node-b"}}]
    assert a.pick_node("gpu-1", args(nodes=nodes)) == nodes[0]
    assert a.pick_node("b", args(nodes=nodes, k8s_node_name="node-b")) == nodes[1]
    assert a.pick_node("gpu-1", args(kubernetes=False)) is None
    with pytest.raises(a.Refused, match="gpu-9: no Kubernetes node named 'gpu-9'. Set mig_node_k8s_node_name"):
        a.pick_node("gpu-9", args(nodes=nodes))


@pytest.mark.parametrize("config, names", [
    ("version: v1\nmig-configs:\n  all-3g: []\n", ["all-3g"]),
    ({"version": "v1", "mig-configs": {"a": [], "b": []}}, ["a", "b"]),
    ("version: v1\nmig-configs: [oops", []),
    ("just text", []),
    ({"mig-configs": ["not", "a", "dict"]}, []),
])
def test_config_names(config, names):
    assert a.config_names(config) == names
