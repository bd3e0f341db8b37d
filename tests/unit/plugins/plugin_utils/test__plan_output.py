"""The fleet planner's views of a plan: the table for people and the vars file site.yml reads."""

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_output as plan_output
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import node_facts
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.test__fleet_plan import h100_with_busy_3g


def test_views_table_and_vars_file():
    fleet = {"a": node_facts([h100_with_busy_3g()])}
    plan = fp.plan_fleet(fleet, {"1g.10gb": 1})
    table = plan_output.plan_table(plan)
    assert table[0].split()[:4] == ["NODE", "GPU", "MODEL", "ACTION"]
    assert "change" in table[1] and "3g.40gb x1" in table[1]
    data = plan_output.vars_file_data(plan)["gpuops_mig_plan"]
    assert data["version"] == 1 and set(data) == {"version", "nodes", "report"}
    assert set(data["nodes"]["a"]) == {"layouts", "config_label", "touched"}
    assert data["nodes"]["a"]["config_label"].startswith("gpuops-plan-")
