"""The collection's known variable names (plugins/plugin_utils/_variable_names.py), held to the docs and roles."""

import glob
import os
import re

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.plugin_utils import _variable_names as v

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ROLES = os.path.join(REPO, "roles")


@pytest.fixture(scope="module")
def known():
    return v.known_names(ROLES)


def test_the_playbook_variables_are_those_docs_rollout_documents():
    with open(os.path.join(REPO, "docs", "rollout.md")) as handle:
        documented = set(re.findall(r"`(gpuops_mig_\w+)`", handle.read()))
    assert documented == set(v.PLAYBOOK_VARIABLES)


def test_every_playbook_variable_the_playbooks_read_is_known(known):
    """A gpuops_mig_* name in a playbook is a documented variable, a group, or internal (leading __)."""
    groups = {"gpuops_mig_changing", "gpuops_mig_steady", "gpuops_mig_round_hosts", "gpuops_mig_round_apply"}
    used = set()
    for path in glob.glob(os.path.join(REPO, "playbooks", "**", "*.yml"), recursive=True):
        with open(path) as handle:
            used.update(re.findall(r"(?<![\w.])(gpuops_mig_\w+)", handle.read()))
    # facts.yml's and plan.yml's own facts live on localhost or the controller, never beside a preview
    local = {"gpuops_mig_declared", "gpuops_mig_k8s_nodes", "gpuops_mig_report", "gpuops_mig_table",
             "gpuops_mig_pods", "gpuops_mig_plan_report", "gpuops_mig_batch", "gpuops_mig_batch_size",
             "gpuops_mig_previewed",
             "gpuops_mig_round_"}  # demand_round.yml's varnames query for every round setting
    assert used - groups - local - known == set()


def test_the_roles_defaults_and_results_are_known(known):
    for path in glob.glob(os.path.join(ROLES, "*", "defaults", "main.yml")):
        with open(path) as handle:
            assert set(yaml.safe_load(handle) or {}) - known == set(), path
    results = set()
    for path in glob.glob(os.path.join(ROLES, "*", "tasks", "*.yml")):
        with open(path) as handle:
            text = handle.read()
        results.update(re.findall(r"register: ((?:mig_|gpuops_mig_)\w+)", text))
        results.update(re.findall(r"^\s+((?:mig_node|mig_preflight|mig_device_plugin|gpuops_mig)_\w+):", text, re.M)
                       if "set_fact" in text else ())
    assert results - known == set()


def test_the_spec_options_of_every_role_and_entry_point(known):
    assert {"mig_node_config_name", "mig_node_force", "mig_preflight_kubernetes", "mig_device_plugin_values"} <= known
    assert "gpuops_mig_preview_failure" in known and "mig_node_report" in known


def test_a_typo_names_the_closest_documented_variable(known):
    names = ["mig_node_config_nmae", "mig_node_config_name", "__mig_node_decision", "ansible_host", "gpuops_mig_serail",
             "mig_preflight_zzzzzzzzzzzzzzzzzzzzzz"]
    assert v.unknown(names, known) == [("gpuops_mig_serail", "gpuops_mig_serial"),
                                       ("mig_node_config_nmae", "mig_node_config_name"),
                                       ("mig_preflight_zzzzzzzzzzzzzzzzzzzzzz", None)]
    message = v.problem("gpu-1", ["mig_node_config_nmae"], known)
    assert message.startswith("gpu-1: unknown variable mig_node_config_nmae (did you mean mig_node_config_name?): "
                              "no role argument spec or playbook of gpuops.mig documents it")
    assert "Nothing was changed" in message
    assert v.problem("gpu-1", ["mig_node_config_name", "__mig_node_x", "other_var"], known) is None
    assert "unknown variables gpuops_mig_serail (did you mean" in v.problem("h", ["gpuops_mig_serail", "mig_node_x"], known)


def test_a_deprecated_variable_is_known_warned_about_and_documented_nowhere(known):
    """Released variables that go in 1.0.0: accepted (not taken for typos), one message each, and gone
    from every argument spec and defaults file (so ansible-doc no longer lists them)."""
    assert set(v.DEPRECATED_VARIABLES) <= known
    assert not set(v.DEPRECATED_VARIABLES) & v.spec_options(ROLES)
    for path in glob.glob(os.path.join(ROLES, "*", "defaults", "main.yml")):
        with open(path) as handle:
            assert not set(yaml.safe_load(handle) or {}) & set(v.DEPRECATED_VARIABLES), path
    assert v.problem("h", ["mig_node_reboot_post_delay"], known) is None
    assert v.deprecated(["mig_node_config_name", "mig_device_plugin_wait", "mig_device_plugin_wait"]) == [
        "mig_device_plugin_wait is deprecated and goes in gpuops.mig 1.0.0: set mig_device_plugin_wait_timeout "
        "to '' for no wait."]
    assert v.deprecated(["mig_node_config_name"]) == []
