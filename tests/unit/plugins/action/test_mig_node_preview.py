"""gpuops.mig.mig_node_preview's controller-side helpers (the action as a whole runs in the playbook tests)."""

import pytest

from ansible_collections.gpuops.mig.plugins.action import mig_node_preview as a
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _handoff as h
from ansible_collections.gpuops.mig.plugins.plugin_utils import _layout_source as layout_source


def args(**kw):
    base = dict(plan=None, config=None, config_file=None, layouts=None, configmap=None, kubernetes=True,
                k8s_node_name=None, nodes=[], reboot_method="reboot", reboot_command="")
    base.update(kw)
    return base


def test_settings_are_checked_before_anything():
    a.check_settings("gpu-1", args(), ["mig_node_layouts"])
    with pytest.raises(RefusedError, match="gpu-1: declare the MIG layout with exactly one of .* found mig_node_config, "
                                           "mig_node_layouts."):
        a.check_settings("gpu-1", args(), ["mig_node_config", "mig_node_layouts"])
    with pytest.raises(RefusedError, match="mig_node_reboot_method=command needs mig_node_reboot_command"):
        a.check_settings("gpu-1", args(reboot_method="command"), [])
    a.check_settings("gpu-1", args(reboot_method="command", reboot_command="systemctl reboot"), [])


def test_pick_node_by_name():
    nodes = [{"metadata": {"name": "gpu-1"}}, {"metadata": {"name": "node-b"}}]
    assert a.pick_node("gpu-1", args(nodes=nodes)) == nodes[0]
    assert a.pick_node("b", args(nodes=nodes, k8s_node_name="node-b")) == nodes[1]
    assert a.pick_node("gpu-1", args(kubernetes=False)) is None
    with pytest.raises(RefusedError, match="gpu-9: no Kubernetes node named 'gpu-9'. Set mig_node_k8s_node_name"):
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


@pytest.mark.parametrize("config", [
    "version: v1\nmig-configs: " + "[" * 30000 + "]" * 30000,      # crashed libyaml's C composer
    "version: v1\nmig-configs: {c: " + "{a: " * 5000 + "0" + "}" * 5001,
    "version: v1\nmig-configs:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        "  b%d: &b%d [%s]\n" % (i, i, ", ".join(["*" + ("a" if i == 0 else "b%d" % (i - 1))] * 9)) for i in range(8)),
])
def test_config_names_of_hostile_text_is_none_at_once(config):
    assert a.config_names(config) == []


def role_vars(**kw):
    """The mig_node role's variables as the argument spec check returns them (typed, every option present)."""
    base = dict(mig_node_kubernetes=True, mig_node_k8s_node_name="node-1", mig_node_config={}, mig_node_config_file="",
                mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}], mig_node_config_configmap="",
                mig_node_config_configmap_key="config.yaml",
                mig_node_config_name="", mig_node_config_from_label=True, mig_node_allow_unmatched=False,
                mig_node_mig_strategy="mixed", mig_node_operator_mode="auto", mig_node_reboot_method="command",
                mig_node_reboot_command="systemctl reboot", mig_node_driver_root="auto", mig_node_persist=True,
                mig_node_reset_gpus=True, mig_node_persist_unit_before=["kubelet.service"], mig_node_persist_python="",
                mig_node_persist_root="/srv/root", mig_node_persist_config_dir="/etc/gpuops-mig",
                mig_node_persist_lib_dir="/usr/local/lib/gpuops-mig", mig_node_persist_script="/usr/local/sbin/x",
                mig_node_persist_unit_dir="/etc/systemd/system")
    base.update(kw)
    return base


def defaults():
    return dict((name, spec.get("default")) for name, spec in a.ARGUMENT_SPEC.items())


def test_options_come_from_the_role_variables_where_the_task_gives_none():
    got = a.options_from_role("gpu-1", defaults(), role_vars(), given={"role_variables": True, "nodes": []})
    assert got["kubernetes"] is True and got["k8s_node_name"] == "node-1"
    assert got["layouts"] == [{"gpus": "all", "devices": {"3g.40gb": 2}}]
    # Empty role variables are "not set": the sources check sees one source, not four.
    # (their defaults are the role argument spec's: {}, "", "", "", each in UNSET)
    assert all(got[name] in layout_source.UNSET for name in ("config", "config_file", "configmap"))
    assert layout_source.sources_of(got) == ["mig_node_layouts"]
    assert (got["config_name"], got["strategy"], got["reboot_method"]) == ("", "mixed", "command")
    assert got["host_root"] == "/srv/root"      # the owed file and lock file go under it
    assert got["restore"] == {"reset": True, "before": ["kubelet.service"], "python": None, "root": "/srv/root",
                              "config_dir": "/etc/gpuops-mig", "lib_dir": "/usr/local/lib/gpuops-mig",
                              "script": "/usr/local/sbin/x", "unit_dir": "/etc/systemd/system"}


def test_options_the_task_gives_win_and_no_persist_means_no_restore():
    base = dict(defaults(), kubernetes=False, layouts=[{"gpus": "0"}])
    got = a.options_from_role("gpu-1", base, role_vars(mig_node_persist=False, mig_node_config_name="half"),
                              given={"kubernetes": False, "layouts": [{"gpus": "0"}]})
    assert got["kubernetes"] is False and got["layouts"] == [{"gpus": "0"}]
    assert got["config_name"] == "half" and got["restore"] is None


def test_role_variables_outside_the_mig_node_role_are_refused():
    for outside in (None, {"mig_preflight_kubernetes": True}):
        with pytest.raises(RefusedError, match="gpu-1: role_variables needs the task to run in the gpuops.mig.mig_node role"):
            a.options_from_role("gpu-1", defaults(), outside, given={"role_variables": True})


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"mig_node_lease_duration": 0}, "duration and wait_delay must be at least 1"),
        ({"mig_node_lease_wait": -5}, "wait at least 0"),
        ({"mig_node_lease_namespace": "kube-node-lease"}, "namespace kube-node-lease"),
    ],
)
def test_lease_settings_are_checked_in_the_preview_before_any_change(bad, says):
    """Not only when a lease is taken (after other nodes changed): the preview refuses them."""
    with pytest.raises(RefusedError, match=says):
        a.options_from_role("gpu-1", defaults(), role_vars(**bad), given={"role_variables": True})


def test_mig_node_force_reaches_the_preview():
    """mig_node_force plans the node as mig_mode and mig_config will apply it (busy devices destroyed)."""
    assert a.ARGUMENT_SPEC["force"]["default"] is False
    got = a.options_from_role("gpu-1", defaults(), role_vars(mig_node_force=True), given={"role_variables": True})
    assert got["force"] is True
    assert a.options_from_role("gpu-1", defaults(), role_vars(mig_node_force=False), given={})["force"] is False


def test_the_hand_off_settings_reach_the_preview():
    """mig_node_operator_mode's hand-off values and mig_node_dynamic_take_back (docs/gpu-operator.md,
    "Hand-off to dynamic partitioners") come from the role's variables, with the role's choices."""
    assert {"dynamic-dra", "dynamic-hami"} <= set(a.ARGUMENT_SPEC["operator_mode"]["choices"])
    assert "dynamic_partitioner" not in a.ARGUMENT_SPEC
    got = a.options_from_role("gpu-1", defaults(), role_vars(mig_node_operator_mode="dynamic-hami",
                                                             mig_node_dynamic_take_back=True),
                              given={"role_variables": True})
    assert got["operator_mode"] == "dynamic-hami" and got["dynamic_take_back"] is True
    assert h.split_mode(got["operator_mode"]) == ("dynamic", "hami")
    assert h.split_mode("dynamic-dra") == ("dynamic", "nvidia-dra")
    assert h.split_mode("takeover") == ("takeover", None)
