# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_plan: plans on the controller (documentation: plugins/modules/mig_plan.py)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.mig.plugins.module_utils import _fleet_plan as fleet_plan
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError

ARGUMENT_SPEC = dict(
    demand=dict(type="raw"),
    pods=dict(type="list", elements="dict"),
    strategy=dict(type="str", default="mixed", choices=["mixed", "single"]),
    single_profile=dict(type="str"),
    hosts=dict(type="list", elements="str"),
    fleet=dict(type="dict"),
    policy=dict(type="dict", default={}),
    node_groups=dict(type="dict"),
    k8s_node_names=dict(type="dict", default={}),
    exact_limit=dict(type="int", default=fleet_plan.EXACT_LIMIT),
    config_label_prefix=dict(type="str", default="gpuops-plan"),
)


def fleet_from_hostvars(task_vars, hosts):
    """{host: its gpuops_mig facts, or None when the host has none (unreachable, failed)}."""
    hostvars = task_vars.get("hostvars", {})
    fleet = {}
    for host in hosts:
        facts = None
        if host in hostvars:
            facts = (hostvars[host].get("ansible_facts") or {}).get("gpuops_mig")
        fleet[host] = facts
    return fleet


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            mutually_exclusive=[("hosts", "fleet")],
        )
        result["changed"] = False
        if args["fleet"] is not None:
            fleet = args["fleet"]
        else:
            hosts = args["hosts"] if args["hosts"] is not None else task_vars.get("ansible_play_hosts_all", [])
            fleet = fleet_from_hostvars(task_vars, hosts)
        node_groups = args["node_groups"]
        if node_groups is None:
            node_groups = dict((name, list(members)) for name, members in (task_vars.get("groups") or {}).items())
        try:
            demand = args["demand"]
            if isinstance(demand, dict):
                demand = [{"profile": k, "count": v} for k, v in demand.items()]
            items = list(demand or [])
            in_use, whole_pending, unresolved = {}, 0, []
            if args["pods"] is not None:
                pod_items, in_use, whole_pending, unresolved = fleet_plan.demand_from_pods(
                    args["pods"], args["strategy"], args["k8s_node_names"], args["single_profile"], fleet)
                items.extend(pod_items)
            plan = fleet_plan.plan_fleet(fleet, items, policy=args["policy"], in_use=in_use,
                                         node_groups=node_groups, exact_limit=args["exact_limit"],
                                         unresolved=unresolved, whole_pending=whole_pending,
                                         config_label_prefix=args["config_label_prefix"])
        except GpuopsError as e:
            result.update(failed=True, msg="MIG plan refused, nothing planned: %s" % e)
            return result
        result.update(
            plan=plan,
            vars=fleet_plan.vars_file_data(plan),
            table=fleet_plan.plan_table(plan),
            report=plan["report"],
            mig_parted=plan["mig_parted"],
        )
        return result
