"""Kueue Workloads waiting for admission as pending pods for the planner (_kueue.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as fp
from ansible_collections.gpuops.mig.plugins.plugin_utils import _kueue as kueue

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


def workload(name="train", pod_sets=None, conditions=(), namespace="ml", **extra):
    """A Workload as Kueue's job integration makes it (kueue.x-k8s.io/v1beta2)."""
    if pod_sets is None:
        pod_sets = [pod_set("main", 4, {MIG_1G: 1})]
    obj = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
           "metadata": {"name": name, "namespace": namespace,
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name}]},
           "spec": {"queueName": "team", "podSets": pod_sets},
           "status": {"conditions": [{"type": t, "status": s, "reason": "r"} for t, s in conditions]}}
    for key, value in extra.items():
        obj[key].update(value)
    return obj


def pod_set(name, count, limits=None, requests=None, node_selector=None):
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    spec = {"containers": [{"name": "c", "image": "x", "resources": resources}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"name": name, "count": count, "template": {"spec": spec}}


def demand(workloads, **kw):
    pods, warnings = kueue.pending_pods(workloads)
    items, dummy, whole, unresolved = fp.demand_from_pods(pods, **kw)
    return dict((i["profile"], i["count"]) for i in items), whole, warnings, items


def test_a_waiting_workload_asks_for_count_times_its_template():
    assert demand([workload()])[:3] == ({"1g.10gb": 4}, 0, [])
    two = workload(pod_sets=[pod_set("launcher", 1, requests={MIG_3G: "1", "cpu": "2"}),
                             pod_set("workers", 3, limits={MIG_1G: 2, "nvidia.com/gpu": 1})])
    got, whole, warnings, items = demand([two])
    assert got == {"1g.10gb": 6, "3g.40gb": 1} and whole == 3 and warnings == []
    assert items[0]["source"] == "Workload ml/train (pod set workers x3)"


@pytest.mark.parametrize("conditions", [
    (("QuotaReserved", "False"),),                               # waiting for quota
    (("QuotaReserved", "True"), ("Admitted", "False")),          # quota reserved, admission checks pending
    (),                                                          # not looked at by Kueue yet
    (("QuotaReserved", "True"), ("Admitted", "False"), ("Evicted", "True")),   # evicted, requeued
])
def test_workloads_not_admitted_have_no_pods_and_count(conditions):
    assert demand([workload(conditions=conditions)])[0] == {"1g.10gb": 4}


@pytest.mark.parametrize("other", [
    workload(conditions=(("QuotaReserved", "True"), ("Admitted", "True"))),     # its pods exist: counted as pods
    workload(conditions=(("Finished", "True"),)),
    workload(spec={"active": False}),                                          # deactivated: never admitted
    workload(metadata={"deletionTimestamp": "2026-11-25T08:00:00Z"}),
    # Kueue's pod integration: the (gated) pods exist already and are counted as pending pods.
    workload(metadata={"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]}),
    workload(pod_sets=[pod_set("main", 0, {MIG_1G: 1})]),
    workload(pod_sets=[pod_set("main", 3, {"cpu": "1"})]),
])
def test_admitted_finished_inactive_or_pod_owned_workloads_add_nothing(other):
    assert demand([other]) == ({}, 0, [], [])


def test_nothing_installed_or_nothing_listed_is_no_demand():
    assert kueue.pending_pods(None) == ([], []) and kueue.pending_pods([]) == ([], [])


@pytest.mark.parametrize("bad, reason", [
    (workload(pod_sets=[pod_set("main", "four", {MIG_1G: 1})]),
     "pod set main: count must be a whole number from 0 to 2147483647, got 'four'"),
    (workload(pod_sets=[pod_set("main", -1, {MIG_1G: 1})]), "count must be a whole number from 0 to 2147483647, got -1"),
    (workload(pod_sets=[pod_set("main", True, {MIG_1G: 1})]), "count must be a whole number"),
    (workload(pod_sets=[pod_set("main", 2, {MIG_1G: "1.5"})]),
     "pod set main asks for nvidia.com/mig-1g.10gb '1.5', which is not a whole number"),
    (workload(pod_sets=[pod_set("main", 2, {MIG_1G: [1]})]), "which is not a whole number"),
    (workload(pod_sets="main"), "spec.podSets must be a list, got 'main'"),
    (workload(pod_sets=[5]), "spec.podSets[0] must be a mapping, got 5"),
    (workload(pod_sets=[{"name": "main", "count": 1, "template": "pod"}]),
     "pod set main: template must be a mapping, got 'pod'"),
    (workload(pod_sets=[{"name": "main", "count": 1, "template": {"spec": {"containers": {"c": 1}}}}]),
     "template.spec.containers must be a list"),
    (workload(status={"conditions": "Admitted"}), "status.conditions must be a list"),
])
def test_a_workload_that_cannot_be_read_is_skipped_with_a_warning_naming_it(bad, reason):
    good = workload("infer", pod_sets=[pod_set("main", 1, {MIG_3G: 1})])
    got, dummy, warnings, dummy = demand([bad, good])
    assert got == {"3g.40gb": 1}
    assert len(warnings) == 1 and warnings[0].startswith("Kueue Workload ml/train skipped, its demand is not "
                                                         "counted: ") and reason in warnings[0], warnings


def test_something_that_is_not_a_workload_is_skipped_too():
    pods, warnings = kueue.pending_pods(["train", {"metadata": "x"}])
    assert pods == [] and warnings == [
        "Kueue Workload (without metadata) skipped, its demand is not counted: not a Workload manifest (a mapping), "
        "got 'train'",
        "Kueue Workload (without metadata) skipped, its demand is not counted: metadata must be a mapping, got 'x'"]


def test_the_single_strategy_reads_the_profile_from_the_templates_node_selector():
    selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"}
    wl = workload(pod_sets=[pod_set("main", 3, {"nvidia.com/gpu": 1}, node_selector=selector)])
    assert demand([wl], strategy="single")[0] == {"1g.10gb": 3}


def test_time_sliced_workloads_count_replicas():
    wl = workload(pod_sets=[pod_set("main", 5, {MIG_1G + ".shared": 1})])
    assert demand([wl], replicas={"1g.10gb": 2})[0] == {"1g.10gb": 3}
