"""The event source gpuops.mig.mig_demand on the real test cluster, without ansible-rulebook.

Its `main(queue, args)` runs in an event loop here, as ansible-rulebook runs it, as a
ServiceAccount bound to exactly what rbac/demand.yml grants (the harness seeds as itself). An
API that goes away mid-watch is a fault proxy in front of kube-apiserver
(tests/support/controlplane/faultproxy.py): stopped, it refuses connections and cuts the
watches; it can also answer 500, and answer 410 Expired to a watch from a resourceVersion it
says is too old, as kube-apiserver does once its history no longer reaches that far.
"""

import asyncio
import os
import runpy

import pytest

from tests.support.kubeapi import seed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The path ansible-rulebook finds in the collections path (.build/collections links this checkout).
SOURCE = os.path.join(REPO, ".build", "collections", "ansible_collections", "gpuops", "mig",
                      "extensions", "eda", "plugins", "event_source", "mig_demand.py")
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
PODS = "/api/v1/pods"


class Recorder(object):
    def __init__(self):
        self.events = []

    async def put(self, event):
        self.events.append(event["mig_demand"])


async def _until(predicate, timeout):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.05)
    return True


async def _call(function, *args):
    """A blocking call of the harness (the cluster's client), off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


def run_source(kubeconfig, scenario, **args):
    """Run the source while ``scenario(recorder)`` (a coroutine function) acts; returns the
    events."""
    module = runpy.run_path(SOURCE)
    recorder = Recorder()

    async def go():
        task = asyncio.ensure_future(module["main"](recorder, dict(
            {"settle_seconds": 0.3, "kubeconfig": kubeconfig, "reconnect_max_seconds": 0.5},
            **args)))
        try:
            await scenario(recorder)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())
    return recorder.events


def bind(cluster, name, node, namespace="default"):
    """Binds a pending pod to a node through pods/binding, as the scheduler does (a pod's
    spec.nodeName cannot be patched)."""
    cluster._call("post", cluster.path("Pod", name, namespace, "binding"), body={
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })


def pending(name, limits):
    """A pod no node offers the devices of: the scheduler leaves it Pending, unbound."""
    return seed.pod(name, limits=limits)


def resource_version(cluster):
    """The cluster's current resourceVersion (of a list)."""
    return int(cluster._call("get", PODS, limit=1)["metadata"]["resourceVersion"])


def listings(proxy, path=PODS):
    """The source's listings of `path` through the proxy that the server answered (not its
    watches)."""
    return [q for method, p, q, status in proxy.requests
            if method == "GET" and p == path and "watch=" not in q and status == 200]


def pod_watches(proxy):
    return [q for method, path, q, _status in proxy.requests
            if method == "GET" and path == PODS and "watch=" in q]


def test_one_event_per_settled_demand_not_per_pod(cluster, demand_kubeconfig):
    cluster.seed(seed.node("gpu-a"), pending("already", {MIG_1G: 1}),
                 seed.pod("running", node="gpu-a", limits={MIG_1G: 1}))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        for i in range(5):   # a burst inside the settle window
            await _call(cluster.create, pending("burst-%d" % i, {MIG_3G: 1}))
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await asyncio.sleep(1)
        await _call(bind, cluster, "already", "gpu-a")   # bound: no longer demand
        assert await _until(lambda: len(recorder.events) == 3, 15)
        await asyncio.sleep(1)

    events = run_source(demand_kubeconfig, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 5},
                                               {MIG_3G: 5}]
    assert [e["pods"] for e in events] == [1, 6, 5]
    assert len({e["fingerprint"] for e in events}) == 3


def test_the_api_going_away_resumes_without_a_repeated_event(
        cluster, demand_kubeconfig, fault_proxy, tmp_path, capsys):
    cluster.seed(pending("first", {MIG_1G: 2}))
    kubeconfig = fault_proxy.kubeconfig_from(demand_kubeconfig, tmp_path / "via-proxy")

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        fault_proxy.stop()          # connections refused, the watches cut
        await asyncio.sleep(1.5)    # reconnect attempts fail meanwhile
        await _call(cluster.create, pending("while-down", {MIG_3G: 1}))
        fault_proxy.start()
        assert await _until(lambda: len(recorder.events) == 2, 15)   # resumed
        faulted = fault_proxy.faulted
        fault_proxy.fail_for("500", 1.5, cut=True)   # nothing changed meanwhile: no event
        await asyncio.sleep(3)
        assert fault_proxy.faulted > faulted, "the source did not try while the API failed"

    events = run_source(kubeconfig, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 2}, {MIG_1G: 2, MIG_3G: 1}]
    # Resumed from its resourceVersion both times: the pods were listed once, every watch
    # after that went on from where the last one was.
    assert len(listings(fault_proxy)) == 1, fault_proxy.requests
    watches = pod_watches(fault_proxy)
    assert len(watches) >= 3 and all("resourceVersion=" in q for q in watches), watches
    # Which failure a watch reports for the 500s depends on when it reconnects: under load the cut
    # itself ("Response ended prematurely") may be all it sees before the API recovers; the
    # proxy's count above shows the source met the fault.
    err = capsys.readouterr().err
    assert "watching pods (v1) failed" in err, err


def test_410_gone_lists_again(cluster, demand_kubeconfig, fault_proxy, tmp_path):
    cluster.seed(pending("first", {MIG_1G: 1}))
    kubeconfig = fault_proxy.kubeconfig_from(demand_kubeconfig, tmp_path / "via-proxy")

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 15)
        fault_proxy.stop()
        await _call(cluster.delete, "Pod", "first")
        await _call(cluster.create, pending("second", {MIG_3G: 2}))
        await _call(cluster.create, pending("third", {MIG_3G: 1}))
        # The history no longer reaches the watch's resourceVersion: 410 Gone from then on.
        fault_proxy.expire_before(await _call(resource_version, cluster))
        fault_proxy.start()
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await asyncio.sleep(1)

    events = run_source(kubeconfig, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_3G: 3}]
    assert len(listings(fault_proxy)) == 2, fault_proxy.requests   # listed again once


READY_SOURCE = os.path.join(os.path.dirname(SOURCE), "mig_ready.py")


@pytest.mark.parametrize("source, args, message", [
    (SOURCE, {"settle_seconds": "soon"}, "settle_seconds must be a number"),
    # Issue 36: negative, NaN and infinite values, and other digits than ASCII, stop the source
    # before its watches start (they were float() and int() of what was given).
    (SOURCE, {"reconnect_max_seconds": "nan"}, "reconnect_max_seconds must be a number"),
    (SOURCE, {"watch_timeout_seconds": -5}, "watch_timeout_seconds must be a whole number"),
    (SOURCE, {"settle_seconds": "\uff13\uff10"}, "settle_seconds must be a number"),
    (READY_SOURCE, {"settle_seconds": float("nan")}, "settle_seconds must be between 0 and"),
    (READY_SOURCE, {"converge_seconds": "inf"}, "converge_seconds must be a number"),
    (READY_SOURCE, {"converge_seconds": -1}, "converge_seconds must be between 0 and"),
    (READY_SOURCE, {"reconnect_max_seconds": float("inf")}, "reconnect_max_seconds must be"),
    (READY_SOURCE, {"watch_timeout_seconds": "\u0663\u0660\u0660"}, "watch_timeout_seconds"),
], ids=["settle", "reconnect-nan", "timeout-negative", "settle-fullwidth", "ready-settle-nan",
        "ready-converge-inf", "ready-converge-negative", "ready-reconnect-inf",
        "ready-timeout-arabic-indic"])
def test_bad_options_stop_the_source_with_their_name(tmp_path, source, args, message):
    """Refused before any connection: no cluster is needed (the kubeconfig does not exist; a
    source that went on to watch would time out here instead)."""
    module = runpy.run_path(source)
    kubeconfig = str(tmp_path / "never-read")
    with pytest.raises(module["demand"].DemandError, match=message):
        asyncio.run(asyncio.wait_for(
            module["main"](Recorder(), dict(args, kubeconfig=kubeconfig)), 10))
