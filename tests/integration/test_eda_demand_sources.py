"""The event source gpuops.mig.mig_demand watching ResourceClaims and Kueue Workloads beside
pods, on the real test cluster (its main() in an event loop, as in test_eda_source.py; no
ansible-rulebook), as a ServiceAccount bound to exactly what rbac/demand.yml grants.

All three kinds make one demand: one event per settled change, a claim that gets allocated and a
Workload that gets admitted leave it, and a cluster without Kueue's CRD still has its pods and
claims watched. The claims are real resource.k8s.io/v1 objects of NVIDIA's DeviceClasses; the
harness plays the scheduler's DRA plugin (the allocation, the pod in reservedFor) and Kueue (a
suspended Job, its Workload, the admission), over the real CRD workloads.kueue.x-k8s.io.
"""

import asyncio
import runpy

import yaml

from test_eda_source import MIG_1G, MIG_3G, SOURCE, _call, _until, listings, run_source
from tests.support.kubeapi import kueue, seed

# Long enough that the three kinds' first listings (one thread each) land in one settle window
# on a busy machine.
SETTLE = 1.5
NOT_SERVED = "Kueue Workloads (kueue.x-k8s.io/v1beta2) are not served by this cluster: not watched"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/workloads"


def device_classes():
    """The DeviceClasses gpu.nvidia.com and mig.nvidia.com of NVIDIA's DRA driver's chart."""
    return [o for o in seed.dra_driver() if o["kind"] == "DeviceClass"]


def kueue_crd():
    """Kueue's CRD as installed: its status is the API server's to write."""
    return {k: v for k, v in kueue.crd().items() if k != "status"}


def without_kueue(cluster):
    assert cluster.find("CustomResourceDefinition", kueue.CRD) is None, "Kueue's CRD is left over"


def user(claim, node="gpu-a"):
    """A running pod on `node` that uses `claim` (the pod the scheduler reserves it for)."""
    return seed.pod(claim + "-user", node=node, claims=[claim])


def allocate(cluster, claim_name, node="gpu-a"):
    """What the scheduler's DRA plugin leaves on a claim it allocated for the pod it bound (its
    user pod, already running): a device per requested one on the node, and the pod in
    reservedFor (the resourceclaim controller keeps a claim reserved only for live pods)."""
    claim = cluster.get("ResourceClaim", claim_name, "default")
    pod = cluster.get("Pod", claim_name + "-user", "default")
    count = claim["spec"]["devices"]["requests"][0]["exactly"]["count"]
    cluster.set_status("ResourceClaim", claim_name, {
        "allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node,
                 "device": "gpu-0-mig-1g10gb-19-%d" % i} for i in range(count)]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                         "uid": pod["metadata"]["uid"]}],
    }, "default", current=claim)


def workload(cluster, name, pod_sets, admitted=False):
    """A Workload as Kueue's job integration makes it: for a suspended Job `name` (real, so the
    garbage collector keeps its Workload), owned by it."""
    job = cluster.create({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.example/train:1"}]}}},
    })
    made = kueue.workload(name, pod_sets, admitted=admitted)
    uid = job["metadata"]["uid"]
    made["metadata"]["ownerReferences"][0]["uid"] = uid
    made["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] = uid
    return cluster.seed(made)[0]


def admit(cluster, name):
    current = cluster.get("Workload", "job-" + name, "default")
    admitted = kueue.workload(name, current["spec"]["podSets"], admitted=True)
    cluster.set_status("Workload", "job-" + name, admitted["status"], "default", current=current)


def counts(event):
    return event["pods"], event["claims"], event["workloads"], event["waiting"]


def test_a_claim_and_a_waiting_workload_join_the_pods_in_one_event(
        cluster, demand_kubeconfig, capsys):
    cluster.seed(kueue_crd(), *device_classes(), seed.node("gpu-a"),
                 seed.pod("pending", limits={MIG_1G: 1}),
                 seed.resource_claim("two-small", count=2, profile="1g.10gb"),
                 # no MIG device: not demand
                 seed.resource_claim("whole", device_class="gpu.nvidia.com"),
                 user("two-small"))
    workload(cluster, "train", [kueue.pod_set("main", 3, {MIG_3G: 1})])
    workload(cluster, "serving", [kueue.pod_set("main", 4, {MIG_3G: 1})], admitted=True)

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(SETTLE * 2)   # one event for all three kinds, not one per kind
        assert len(recorder.events) == 1
        await _call(allocate, cluster, "two-small")
        await _call(admit, cluster, "train")
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await _call(cluster.delete, "Pod", "pending")
        assert await _until(lambda: len(recorder.events) == 3, 15)
        await asyncio.sleep(SETTLE * 2)

    events = run_source(demand_kubeconfig, scenario, settle_seconds=SETTLE)
    assert [e["profiles"] for e in events] == [{MIG_1G: 3, MIG_3G: 3}, {MIG_1G: 1}, {}]
    assert [counts(e) for e in events] == [(1, 1, 1, 3), (1, 0, 0, 1), (0, 0, 0, 0)]
    assert len({e["fingerprint"] for e in events}) == 3
    err = capsys.readouterr().err
    assert "not served" not in err and "reconnecting" not in err, err


def test_without_kueue_pods_and_claims_are_still_watched(cluster, demand_kubeconfig, capsys):
    without_kueue(cluster)
    cluster.seed(*device_classes(), seed.node("gpu-a"),
                 seed.pod("pending", limits={MIG_3G: 1}),
                 seed.resource_claim("small", profile="1g.10gb"), user("small"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await _call(allocate, cluster, "small")
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await asyncio.sleep(2.5)    # Workloads looked for again meanwhile (watch_timeout_seconds)

    events = run_source(demand_kubeconfig, scenario, settle_seconds=SETTLE,
                        watch_timeout_seconds=1)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1, MIG_3G: 1}, {MIG_3G: 1}]
    assert [counts(e) for e in events] == [(1, 1, 0, 2), (1, 0, 0, 1)]
    err = capsys.readouterr().err
    assert err.count(NOT_SERVED) == 1, err     # said once
    assert "reconnecting" not in err, err


def test_kueue_installed_later_is_watched_from_then_on(cluster, demand_kubeconfig, capsys):
    without_kueue(cluster)
    cluster.seed(seed.pod("pending", limits={MIG_1G: 1}))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await _call(cluster.seed, kueue_crd())   # waits until the CRD is Established
        await _call(workload, cluster, "train", [kueue.pod_set("main", 2, {MIG_3G: 1})])
        assert await _until(lambda: len(recorder.events) == 2, 15)

    events = run_source(demand_kubeconfig, scenario, settle_seconds=0.3, watch_timeout_seconds=1)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 2}]
    err = capsys.readouterr().err
    assert NOT_SERVED in err, err
    assert "Kueue Workloads (kueue.x-k8s.io/v1beta2) are served now: watching them" in err, err


def test_claims_and_workloads_resume_after_the_api_goes_away(
        cluster, demand_kubeconfig, fault_proxy, tmp_path):
    cluster.seed(kueue_crd(), *device_classes(), seed.resource_claim("first", profile="1g.10gb"))
    kubeconfig = fault_proxy.kubeconfig_from(demand_kubeconfig, tmp_path / "via-proxy")

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        fault_proxy.stop()          # connections refused, the watches cut
        await asyncio.sleep(1.5)    # reconnect attempts fail meanwhile
        await _call(cluster.create, seed.resource_claim("while-down", profile="3g.40gb"))
        await _call(workload, cluster, "train", [kueue.pod_set("main", 1, {MIG_3G: 1})])
        fault_proxy.start()
        assert await _until(lambda: len(recorder.events) == 2, 15)
        faulted = fault_proxy.faulted
        fault_proxy.fail_for("500", 1.5, cut=True)   # nothing changed meanwhile: no event
        await asyncio.sleep(3)
        assert fault_proxy.faulted > faulted, "the source did not try while the API failed"

    events = run_source(kubeconfig, scenario, settle_seconds=SETTLE)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 2}]
    assert [counts(e) for e in events] == [(0, 1, 0, 1), (0, 2, 1, 3)]
    # Each kind resumed its watch from its resourceVersion: listed once. (The first listing of
    # Workloads may be answered 429 while the new CRD's watch cache starts; the client retries it.)
    for path in (CLAIMS, WORKLOADS):
        assert len(listings(fault_proxy, path)) == 1, [r for r in fault_proxy.requests
                                                       if r[1] == path]


def test_options_turn_claims_and_workloads_off(cluster, demand_kubeconfig):
    cluster.seed(kueue_crd(), *device_classes(), seed.pod("pending", limits={MIG_1G: 1}),
                 seed.resource_claim("small", profile="1g.10gb"))
    workload(cluster, "train", [kueue.pod_set("main", 2, {MIG_3G: 1})])

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(SETTLE * 2)

    events = run_source(demand_kubeconfig, scenario, settle_seconds=SETTLE, claims="false",
                        workloads=False)
    assert [(e["profiles"], counts(e)) for e in events] == [({MIG_1G: 1}, (1, 0, 0, 1))]


def test_the_documentation_parses_and_names_every_option_the_examples_use():
    module = runpy.run_path(SOURCE)
    doc = yaml.safe_load(module["DOCUMENTATION"])
    assert {"claims", "workloads", "kueue_api_version"} <= set(doc["options"])
    for example in yaml.safe_load(module["EXAMPLES"]):
        assert set(example["gpuops.mig.mig_demand"]) <= set(doc["options"])
        module["demand"].watched_kinds(example["gpuops.mig.mig_demand"])   # valid as given


def test_the_first_event_waits_for_every_kind_to_be_listed(
        cluster, demand_kubeconfig, monkeypatch):
    """Issue 33: the pods' first listing comes late (a loaded machine, made certain here: it
    waits 2 s, longer than the settle window); the first event still has the pending pod beside
    the claim."""
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
    cluster.seed(*device_classes(), seed.pod("pending", limits={MIG_3G: 1}),
                 seed.resource_claim("small", profile="1g.10gb"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        await asyncio.sleep(1)

    events = run_source(demand_kubeconfig, scenario, settle_seconds=0.3, workloads=False)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1, MIG_3G: 1}], events
