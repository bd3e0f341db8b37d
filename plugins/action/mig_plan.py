# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_plan: plans on the controller (documentation: plugins/modules/mig_plan.py)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fleet_plan
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as plan_demand
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_output as plan_output
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError, RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils._fleet_facts import fleet_from_hostvars
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import describe, plain, require_shapes
from ansible_collections.gpuops.mig.plugins.plugin_utils import _kueue as kueue
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing
from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand_allocations as demand_allocations

ARGUMENT_SPEC = dict(
    demand=dict(type="raw"),
    pods=dict(type="list", elements="dict"),
    claims=dict(type="list", elements="dict"),
    workloads=dict(type="list", elements="raw"),
    strategy=dict(type="str", default="mixed", choices=["mixed", "single"]),
    single_profile=dict(type="str"),
    sharing=dict(type="raw"),
    hosts=dict(type="list", elements="str"),
    fleet=dict(type="dict"),
    policy=dict(type="dict", default={}),
    node_groups=dict(type="dict"),
    k8s_node_names=dict(type="dict", default={}),
    allocations=dict(type="dict"),
    exact_limit=dict(type="int", default=fleet_plan.EXACT_LIMIT),
    config_label_prefix=dict(type="str", default="gpuops-plan"),
)
# Checked before Ansible's own argument checks, which would make ["5"] of 5 and a mapping of "a=1".
SHAPES = dict(
    pods=(list, dict, "a list of pod manifests (the resources of kubernetes.core.k8s_info)"),
    claims=(list, dict, "a list of ResourceClaim manifests (the resources of kubernetes.core.k8s_info)"),
    workloads=(list, None, "a list of Kueue Workload manifests (the resources of kubernetes.core.k8s_info)"),
    hosts=(list, str, "a list of inventory host names"),
    fleet=(dict, None, "a mapping of host to its gpuops_mig facts"),
    policy=(dict, None, "a mapping (nodes, spare, whole_gpus, skip_unreachable)"),
    node_groups=(dict, list, "a mapping of group name to a list of hosts"),
    k8s_node_names=(dict, str, "a mapping of Kubernetes node name to inventory host"),
    allocations=(dict, None, "a mapping of host to gpuops.mig.mig_node_info's result"),
)
# Options Ansible's checks would turn from another type into a string (5 -> "5").
STRINGS = ("strategy", "single_profile", "config_label_prefix")


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        result["changed"] = False
        try:
            check_arguments(self._task.args)
        except GpuopsError as e:
            return dict(result, failed=True, msg="MIG plan refused, nothing planned: %s" % e)
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            mutually_exclusive=[("hosts", "fleet")],
        )
        try:
            args = plain(args, "the arguments")
            if args["fleet"] is not None:
                fleet = args["fleet"]
            else:
                fleet = fleet_from_hostvars(task_vars, args["hosts"])
            node_groups = args["node_groups"]
            if node_groups is None:
                node_groups = plain(task_vars.get("groups") or {}, "the inventory's groups")
            pod_maps = None
            if args["allocations"] is not None:
                # Devices pods hold are busy for the planner; each node then says whom its change evicts.
                pod_maps = demand_allocations.pod_maps(args["allocations"], sorted(fleet))
                fleet = demand_allocations.with_holders(fleet, pod_maps)
            items = plan_demand.demand_items(args["demand"])
            in_use, whole_pending, unresolved = {}, 0, []
            # Workloads waiting for admission have no pods yet: their pod sets are read as pending pods.
            waiting_pods, workload_warnings = kueue.pending_pods(args["workloads"])
            if args["pods"] is not None or waiting_pods:
                replicas = dict((profile, spec["replicas"])
                                for profile, spec in sharing.policy(args["sharing"], "sharing").items())
                pod_items, in_use, whole_pending, unresolved = plan_demand.demand_from_pods(
                    (args["pods"] or []) + waiting_pods, args["strategy"], args["k8s_node_names"],
                    args["single_profile"], fleet, replicas)
                items.extend(pod_items)
            if args["claims"] is not None:
                claim_items, claims_unresolved = plan_demand.demand_from_claims(args["claims"])
                items.extend(claim_items)
                unresolved = unresolved + claims_unresolved
            plan = fleet_plan.plan_fleet(fleet, items, policy=args["policy"], in_use=in_use,
                                         node_groups=node_groups, exact_limit=args["exact_limit"],
                                         unresolved=unresolved, whole_pending=whole_pending,
                                         config_label_prefix=args["config_label_prefix"])
            if pod_maps is not None:
                demand_allocations.add_evictions(plan, fleet, pod_maps, args["pods"], args["k8s_node_names"])
        except GpuopsError as e:
            result.update(failed=True, msg="MIG plan refused, nothing planned: %s" % e)
            return result
        result.update(
            plan=plan,
            vars=plan_output.vars_file_data(plan),
            table=plan_output.plan_table(plan) + ["warning: %s" % w for w in workload_warnings],
            report=plan["report"],
            mig_parted=plan["mig_parted"],
        )
        if workload_warnings:
            result["warnings"] = workload_warnings
        return result


def check_arguments(args):
    """Refuse an argument of the wrong shape before Ansible's checks bend it into another."""
    require_shapes(args, SHAPES)
    demand = args.get("demand")
    if demand is not None and not isinstance(demand, (Mapping, list)):
        raise RefusedError("demand must be a mapping of MIG profile to count, or a list of items; got %s"
                           % describe(demand))
    for name in STRINGS:
        value = args.get(name)
        if value is not None and not isinstance(value, str):
            raise RefusedError("%s must be a string, got %s" % (name, describe(value)))
