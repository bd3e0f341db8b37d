"""The demand round's filters (plugins/filter/demand_round.py) with what a playbook hands them: values parsed
by Ansible's loader (tagged with their origin), and refusals as AnsibleFilterError naming the variable."""

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible.parsing.utils.yaml import from_yaml

from ansible_collections.gpuops.mig.plugins.filter.demand_round import FilterModule

FILTERS = FilterModule().filters()

ROUND_VARS = """
plan:
  nodes:
    gpu-a: {touched: true, config_label: gpuops-plan-1, supplies: {1g.10gb: 2},
            gpus: [{index: 0, mig_enabled_before: true, mig_enabled: true, changed: true, destroyed: 0, created: 2}]}
  report: {demand: [{request: 1g.10gb, requested: 2, met: 2, unmet: 0}]}
settings: {max_nodes: "2", dry_run: false}
state: {last_change: "2026-11-25T08:00:00Z"}
"""


def tagged():
    return from_yaml(ROUND_VARS, file_name="/playbooks/group_vars/all.yml")


def test_tagged_values_from_a_playbook_select_and_record_as_plain_values():
    data = tagged()
    selection = FILTERS["mig_round_select"](data["plan"], [], [], data["settings"], {}, data["state"])
    assert selection["apply"] == ["gpu-a"] and selection["max_nodes"] == 2
    json.dumps(selection)
    assert selection["nodes"]["gpu-a"]["config_label"].__class__ is str   # plain, no longer tagged
    opening = FILTERS["mig_round_record"](data["state"], "round-1", selection, False,
                                          now="2026-11-25T09:00:00Z")
    state = opening["state"]
    assert state["unfinished"] == {"gpu-a": "round-1"} and state["last_change"].__class__ is str
    assert opening["lines"][-1] == "round: 1 planned, 1 applied, 0 held"
    assert opening["deferred"] == {}
    # The closing: the reports come from hostvars, tagged as the rest.
    reports = from_yaml("gpu-a: {outcome: deferred, deferred: {pods: [ml/late], why: late}}",
                        file_name="/playbooks/group_vars/all.yml")
    closing = FILTERS["mig_round_record"](data["state"], "round-1", selection, True, {}, reports,
                                          "2026-11-25T09:05:00Z")
    assert closing["deferred"] == {"gpu-a": {"pods": ["ml/late"], "why": "late"}}
    assert closing["state"]["unfinished"] == {} and closing["lines"][0].split()[1] == "deferred"
    json.dumps(closing)


def test_bad_input_is_a_filter_error_that_names_the_variable():
    data = tagged()
    with pytest.raises(AnsibleFilterError, match="gpuops_mig_round_max_nodes must be a whole number"):
        FILTERS["mig_round_select"](data["plan"], [], [], {"max_nodes": "two"})
    with pytest.raises(AnsibleFilterError, match="gpuops_mig_round_cooldown must not be negative"):
        FILTERS["mig_round_select"](data["plan"], [], [], {"cooldown": -5})
