"""The event source gpuops.mig.mig_demand watching ResourceClaims and Kueue Workloads beside pods, against the
Kubernetes API emulator (its main() in an event loop, as in test_eda_source.py; no ansible-rulebook).

All three kinds make one demand: one event per settled change, a claim that gets allocated and a Workload that
gets admitted leave it, and a cluster without Kueue's CRD still has its pods and claims watched.
"""

import asyncio
import runpy

import yaml

from test_eda_source import MIG_1G, MIG_3G, SOURCE, _until, run_source
from tests.support.kubeapi import kueue, seed

# Long enough that the three kinds' first listings (one thread each) land in one settle window on a busy machine.
SETTLE = 1.5
NOT_SERVED = "Kueue Workloads (kueue.x-k8s.io/v1beta2) are not served by this cluster: not watched"


def allocate(kube_api, claim_name, node="gpu-a"):
    """What the scheduler's DRA plugin leaves on a claim it allocated for a pod it bound: the allocation and the
    pod in reservedFor (the emulator deallocates a claim reserved for no live pod)."""
    user = kube_api.create(seed.pod(claim_name + "-user", node=node, claims=[claim_name], phase="Running"))
    kube_api.set_status("ResourceClaim", claim_name, {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node,
                                                "device": "gpu-0-mig-1g10gb-19-0"}]}},
        "reservedFor": [{"resource": "pods", "name": user["metadata"]["name"], "uid": user["metadata"]["uid"]}],
    }, "default")


def admit(kube_api, name):
    workload = kube_api.get("Workload", "job-" + name, "default")
    admitted = kueue.workload(name, workload["spec"]["podSets"], admitted=True)
    kube_api.set_status("Workload", "job-" + name, admitted["status"], "default")


def counts(event):
    return event["pods"], event["claims"], event["workloads"], event["waiting"]


def test_a_claim_and_a_waiting_workload_join_the_pods_in_one_event(kube_api, capsys):
    kube_api.seed(kueue.crd(),
                  seed.pod("pending", limits={MIG_1G: 1}, phase="Pending"),
                  seed.resource_claim("two-small", count=2, profile="1g.10gb"),
                  seed.resource_claim("whole", device_class="gpu.nvidia.com"),     # no MIG device: not demand
                  kueue.workload("train", [kueue.pod_set("main", 3, {MIG_3G: 1})]),
                  kueue.workload("serving", [kueue.pod_set("main", 4, {MIG_3G: 1})], admitted=True))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(SETTLE * 2)     # one event for all three kinds, not one per kind or per object
        assert len(recorder.events) == 1
        allocate(kube_api, "two-small")
        admit(kube_api, "train")
        assert await _until(lambda: len(recorder.events) == 2, 15)
        kube_api.delete("Pod", "pending")
        assert await _until(lambda: len(recorder.events) == 3, 15)
        await asyncio.sleep(SETTLE * 2)

    events = run_source(kube_api, scenario, settle_seconds=SETTLE)
    assert [e["profiles"] for e in events] == [{MIG_1G: 3, MIG_3G: 3}, {MIG_1G: 1}, {}]
    assert [counts(e) for e in events] == [(1, 1, 1, 3), (1, 0, 0, 1), (0, 0, 0, 0)]
    assert len({e["fingerprint"] for e in events}) == 3
    err = capsys.readouterr().err
    assert "not served" not in err and "reconnecting" not in err


def test_without_kueue_pods_and_claims_are_still_watched(kube_api, capsys):
    kube_api.seed(seed.pod("pending", limits={MIG_3G: 1}, phase="Pending"),
                  seed.resource_claim("small", profile="1g.10gb"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        allocate(kube_api, "small")
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await asyncio.sleep(2.5)    # Workloads looked for again meanwhile (watch_timeout_seconds): said once

    events = run_source(kube_api, scenario, settle_seconds=SETTLE, watch_timeout_seconds=1)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1, MIG_3G: 1}, {MIG_3G: 1}]
    assert [counts(e) for e in events] == [(1, 1, 0, 2), (1, 0, 0, 1)]
    err = capsys.readouterr().err
    assert err.count(NOT_SERVED) == 1, err
    assert "reconnecting" not in err


def test_kueue_installed_later_is_watched_from_then_on(kube_api, capsys):
    kube_api.seed(seed.pod("pending", limits={MIG_1G: 1}, phase="Pending"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        kube_api.create(kueue.crd())
        kube_api.create(kueue.workload("train", [kueue.pod_set("main", 2, {MIG_3G: 1})]))
        assert await _until(lambda: len(recorder.events) == 2, 15)

    events = run_source(kube_api, scenario, settle_seconds=0.3, watch_timeout_seconds=1)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 2}]
    assert "Kueue Workloads (kueue.x-k8s.io/v1beta2) are served now: watching them" in capsys.readouterr().err


def test_claims_and_workloads_resume_after_the_api_goes_away(kube_api):
    kube_api.seed(kueue.crd(), seed.resource_claim("first", profile="1g.10gb"))
    port = kube_api.port

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        kube_api.stop()
        await asyncio.sleep(1.5)   # reconnect attempts fail meanwhile
        kube_api.create(seed.resource_claim("while-down", profile="3g.40gb"))
        kube_api.create(kueue.workload("train", [kueue.pod_set("main", 1, {MIG_3G: 1})]))
        kube_api.start(port=port)
        assert await _until(lambda: len(recorder.events) == 2, 15)
        kube_api.stop()
        kube_api.start(port=port)   # nothing changed while away: no event
        await asyncio.sleep(2.5)

    events = run_source(kube_api, scenario, settle_seconds=SETTLE)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 2}]
    assert [counts(e) for e in events] == [(0, 1, 0, 1), (0, 2, 1, 3)]


def test_options_turn_claims_and_workloads_off(kube_api):
    kube_api.seed(kueue.crd(), seed.pod("pending", limits={MIG_1G: 1}, phase="Pending"),
                  seed.resource_claim("small", profile="1g.10gb"),
                  kueue.workload("train", [kueue.pod_set("main", 2, {MIG_3G: 1})]))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(SETTLE * 2)

    events = run_source(kube_api, scenario, settle_seconds=SETTLE, claims="false", workloads=False)
    assert [(e["profiles"], counts(e)) for e in events] == [({MIG_1G: 1}, (1, 0, 0, 1))]


def test_the_documentation_parses_and_names_every_option_the_examples_use():
    module = runpy.run_path(SOURCE)
    doc = yaml.safe_load(module["DOCUMENTATION"])
    assert {"claims", "workloads", "kueue_api_version"} <= set(doc["options"])
    for example in yaml.safe_load(module["EXAMPLES"]):
        assert set(example["gpuops.mig.mig_demand"]) <= set(doc["options"])
        module["demand"].watched_kinds(example["gpuops.mig.mig_demand"])   # valid as given


def test_the_first_event_waits_for_every_kind_to_be_listed(kube_api, monkeypatch):
    """Issue 33: the pods' first listing comes late (a loaded machine, made certain here: it waits
    2 s, longer than the settle window); the first event still has the pending pod beside the
    claim."""
    import time

    from kubernetes import client

    listed = client.CoreV1Api.list_pod_for_all_namespaces
    calls = []

    def late(self, *args, **kwargs):
        if not calls:
            time.sleep(2)
        calls.append(kwargs.get("watch"))
        return listed(self, *args, **kwargs)
    monkeypatch.setattr(client.CoreV1Api, "list_pod_for_all_namespaces", late)
    kube_api.seed(seed.pod("pending", limits={MIG_3G: 1}, phase="Pending"),
                  seed.resource_claim("small", profile="1g.10gb"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(1)

    events = run_source(kube_api, scenario, settle_seconds=0.3, workloads=False)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1, MIG_3G: 1}], events
