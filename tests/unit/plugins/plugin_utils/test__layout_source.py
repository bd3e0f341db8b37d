"""Where a node's layout comes from: the rules gpuops.mig.mig_node_preview and the fleet report share."""

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import LABEL_CONFIG
from ansible_collections.gpuops.mig.plugins.plugin_utils import _layout_source as ls

LABELLED = {LABEL_CONFIG: "all-7g"}


def settings(**kw):
    base = dict(plan=None, config=None, config_file=None, layouts=None, configmap=None, config_name="",
                config_from_label=True)
    base.update(kw)
    return base


def test_sources_a_plan_wins():
    assert ls.sources_of(settings()) == []
    assert ls.sources_of(settings(layouts=[{"gpus": "all"}], configmap="cm")) == [
        "mig_node_layouts", "mig_node_config_configmap"]
    assert ls.sources_of(settings(layouts=[{"gpus": "all"}], plan={"layouts": []})) == ["gpuops_mig_plan"]
    assert ls.sources_of(settings(config="", config_file="f.yaml")) == ["mig_node_config_file"]


def test_two_sources_are_refused_naming_them():
    with pytest.raises(RefusedError, match="gpu-1: declare the MIG layout with exactly one of .* found mig_node_config, "
                                           "mig_node_layouts."):
        ls.layout_source("gpu-1", settings(config="c", layouts=[{"gpus": "all"}]), strict=False)


def test_no_source_is_refused_unless_an_operator_config_can_be_used():
    with pytest.raises(RefusedError, match="gpu-1: declare .* none is set, and no GPU Operator was found"):
        ls.layout_source("gpu-1", settings())
    assert ls.layout_source("gpu-1", settings(), operator_present=True)["kind"] == ls.CONFIGMAP
    assert ls.layout_source("gpu-1", settings(), strict=False) == {
        "kind": None, "config_name": "", "name_from": None, "label": None}


@pytest.mark.parametrize("given, labels, kind, name, name_from, label", [
    # The plan wins, its label names the layout; no node label is taken.
    (dict(plan={"config_label": "gpuops-plan-1a"}, config_name="mine"), LABELLED, "gpuops_mig_plan", "mine",
     ls.NAME_FROM_SETTING, "gpuops-plan-1a"),
    (dict(plan={"layouts": [], "config_label": ""}), LABELLED, "gpuops_mig_plan", "", None, "planned"),
    # mig_node_config_name, else the node label; inline layouts never take the label.
    (dict(config="c", config_name="all-1g"), LABELLED, "mig_node_config", "all-1g", ls.NAME_FROM_SETTING, "all-1g"),
    (dict(config="c"), LABELLED, "mig_node_config", "all-7g", ls.NAME_FROM_LABEL, "all-7g"),
    (dict(config="c", config_from_label=False), LABELLED, "mig_node_config", "", None, None),
    (dict(layouts=[{"gpus": "all"}]), LABELLED, "mig_node_layouts", "", None, "custom"),
    (dict(layouts=[{"gpus": "all"}], config_name="half"), {}, "mig_node_layouts", "half", ls.NAME_FROM_SETTING, "half"),
    (dict(configmap="cm"), None, ls.CONFIGMAP, "", None, None),
    (dict(config_file="f.yaml"), {}, "mig_node_config_file", "", None, None),
])
def test_kind_name_and_label(given, labels, kind, name, name_from, label):
    assert ls.layout_source("gpu-1", settings(**given), labels) == {
        "kind": kind, "config_name": name, "name_from": name_from, "label": label}


def test_a_config_without_a_name_is_labelled_by_its_one_config():
    assert ls.label_from_config(["all-3g"]) == "all-3g"
    assert ls.label_from_config(["a", "b"]) == "custom"
    assert ls.label_from_config([]) == "custom"
