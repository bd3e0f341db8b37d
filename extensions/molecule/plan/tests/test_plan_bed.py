# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After plan.yml, site.yml -e @<its vars file> and plan.yml again: the plan met the demand, the GPUs
have the planned layout, the nodes advertise it, the pending pods run there, and the second plan changes nothing."""

import json
import os

import pytest

from bedview import BED, advertised, gpu_state, inventory_hosts, listed_devices, mig_devices

PLAN_DIR = os.path.join(BED, "plan")
TOUCHED = ["a30-0", "h100-0"]
DEMAND_SELECTOR = "app=plan-demand"


def load(name):
    with open(os.path.join(PLAN_DIR, name), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def plan():
    return load("mig-plan.json")


def quantity(value):
    return int(str(value))


def pending_pods(cluster):
    return cluster.core.list_namespaced_pod("ml", label_selector=DEMAND_SELECTOR).items


def requests(pod):
    """{resource: count} of the pod's nvidia.com resources (limits, else requests, summed over containers)."""
    total = {}
    for container in pod.spec.containers:
        resources = (container.resources and (container.resources.limits or container.resources.requests)) or {}
        for key, value in resources.items():
            if key.startswith("nvidia.com/"):
                total[key] = total.get(key, 0) + quantity(value)
    return total


def demand(cluster):
    """What the pending pods ask for: {profile: devices}."""
    wanted = {}
    for pod in pending_pods(cluster):
        for key, count in requests(pod).items():
            profile = key[len("nvidia.com/mig-"):]
            wanted[profile] = wanted.get(profile, 0) + count
    return wanted


def planned_devices(layouts):
    """{GPU index: sorted profile names, or None for MIG off} of a node's planned inline layouts."""
    per_gpu = {}
    for layout in layouts:
        devices = sorted(p for p, n in (layout.get("devices") or {}).items() for dummy in range(n))
        for index in layout["gpus"]:
            per_gpu[index] = devices if layout["mig_enabled"] else None
    return per_gpu


def test_the_plan_meets_the_demand(cluster, plan):
    report = plan["report"]
    assert report["demand_met"] is True and report["unmet_devices"] == 0 and not report["unresolved"], report
    assert sorted(report["nodes_touched"]) == TOUCHED and report["devices_destroyed"] == 0
    # Every node of the fleet is planned; the one without a MIG-capable GPU with no layouts.
    assert sorted(plan["nodes"]) == sorted(inventory_hosts()) and plan["nodes"]["l40s-0"]["layouts"] == []
    wanted = demand(cluster)
    assert wanted == {"3g.40gb": 5, "1g.10gb": 3, "1g.6gb": 2}
    rows = {row["request"]: row for row in report["demand"]}
    for profile, count in wanted.items():
        assert rows[profile]["requested"] == count and rows[profile]["met"] == count, rows
    # What the touched nodes will offer covers the demand.
    offered = {}
    for node in TOUCHED:
        for devices in planned_devices(plan["nodes"][node]["layouts"]).values():
            for profile in devices or []:
                offered[profile] = offered.get(profile, 0) + 1
    assert all(offered.get(profile, 0) >= count for profile, count in wanted.items()), offered


def test_gpus_have_the_planned_layout(name, plan):
    state = gpu_state(name)
    if not plan["nodes"][name]["layouts"]:  # l40s-0: no MIG-capable GPU, nothing planned
        assert all(gpu["mig"] is None and not gpu["gpu_instances"] for gpu in state["gpus"])
        return
    expected = planned_devices(plan["nodes"][name]["layouts"])
    for gpu in state["gpus"]:
        if expected[gpu["index"]] is None:
            assert not gpu["mig"]["current"] and not gpu["gpu_instances"], (name, gpu["index"])
        else:
            assert gpu["mig"]["current"] and mig_devices(gpu) == expected[gpu["index"]], (name, gpu["index"])
    assert plan["nodes"][name]["touched"] is (name in TOUCHED)
    if name not in TOUCHED:
        assert all(not gpu["gpu_instances"] for gpu in state["gpus"]), "an untouched node changed"


def test_nodes_advertise_the_layout_and_are_schedulable(cluster, name, plan):
    node = cluster.node(name)
    assert listed_devices(node) == advertised(gpu_state(name))
    assert not node.spec.unschedulable
    if plan["nodes"][name]["layouts"]:  # every planned node, touched or not, is labelled with its planned layout
        labels = node.metadata.labels
        assert labels["nvidia.com/mig.config"] == plan["nodes"][name]["config_label"]
        assert labels["nvidia.com/mig.config.state"] == "success"


def test_the_pending_pods_now_run_on_the_planned_nodes(cluster):
    """kube-scheduler binds a pending pod to a schedulable node with room: after the rollout every
    demand pod runs on a node the plan touched, and no node holds pods asking for more than it
    advertises."""
    pods = pending_pods(cluster)
    assert len(pods) == 6
    where = [(p.metadata.name, p.spec.node_name, p.status.phase) for p in pods]
    assert all(node in TOUCHED and phase == "Running" for dummy, node, phase in where), where
    used = {}
    for pod in cluster.pods():
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            for key, count in requests(pod).items():
                used[(pod.spec.node_name, key)] = used.get((pod.spec.node_name, key), 0) + count
    for node in TOUCHED:
        allocatable = {k: int(v) for k, v in cluster.node(node).status.allocatable.items() if k.startswith("nvidia.com/")}
        over = dict((key, count) for (name, key), count in used.items() if name == node and count > allocatable.get(key, 0))
        assert not over, (node, over, allocatable)


def test_a_second_plan_asks_for_no_change(plan):
    again = load("mig-plan-again.json")
    report = again["report"]
    assert report["demand_met"] is True and report["unmet_devices"] == 0
    assert report["nodes_touched"] == [] and report["devices_created"] == 0 and report["devices_destroyed"] == 0
    for node, entry in again["nodes"].items():
        assert entry["touched"] is False, node
        assert planned_devices(entry["layouts"]) == planned_devices(plan["nodes"][node]["layouts"]), node
