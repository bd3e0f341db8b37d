"""The event source gpuops.mig.mig_demand against the Kubernetes API emulator, without ansible-rulebook.

Its `main(queue, args)` runs in an event loop here, as ansible-rulebook runs it; the emulator is
stopped and started again on the same port to play an API that goes away mid-watch.
"""

import asyncio
import os
import runpy

import pytest

from tests.support.kubeapi import seed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The path ansible-rulebook finds in the collections path (.build/collections links this checkout).
SOURCE = os.path.join(REPO, ".build", "collections", "ansible_collections", "gpuops", "mig", "extensions", "eda",
                      "plugins", "event_source", "mig_demand.py")
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


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


def run_source(kube_api, scenario, **args):
    """Run the source while ``scenario(recorder)`` (a coroutine function) acts; returns the events."""
    module = runpy.run_path(SOURCE)
    recorder = Recorder()

    async def go():
        task = asyncio.ensure_future(module["main"](recorder, dict(
            {"settle_seconds": 0.3, "kubeconfig": kube_api.kubeconfig, "reconnect_max_seconds": 0.5}, **args)))
        try:
            await scenario(recorder)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(go())
    return recorder.events


def test_one_event_per_settled_demand_not_per_pod(kube_api, tmp_path):
    kube_api.seed(seed.pod("already", limits={MIG_1G: 1}, phase="Pending"),
                  seed.pod("running", node="gpu-a", limits={MIG_1G: 1}, phase="Running"))

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 10)
        for i in range(5):   # a burst inside the settle window
            kube_api.create(seed.pod("burst-%d" % i, limits={MIG_3G: 1}, phase="Pending"))
        assert await _until(lambda: len(recorder.events) == 2, 10)
        await asyncio.sleep(1)
        kube_api.patch("Pod", "already", {"spec": {"nodeName": "gpu-a"}})   # bound: no longer demand
        assert await _until(lambda: len(recorder.events) == 3, 10)
        await asyncio.sleep(1)

    events = run_source(kube_api, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_1G: 1, MIG_3G: 5}, {MIG_3G: 5}]
    assert [e["pods"] for e in events] == [1, 6, 5]
    assert len({e["fingerprint"] for e in events}) == 3


def test_the_api_going_away_resumes_without_a_repeated_event(kube_api, tmp_path):
    kube_api.seed(seed.pod("first", limits={MIG_1G: 2}, phase="Pending"))
    port = kube_api.port

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 10)
        kube_api.stop()
        await asyncio.sleep(1.5)   # reconnect attempts fail meanwhile
        kube_api.create(seed.pod("while-down", limits={MIG_3G: 1}, phase="Pending"))
        kube_api.start(port=port)
        assert await _until(lambda: len(recorder.events) == 2, 15)   # resumed from its resourceVersion
        kube_api.stop()
        kube_api.start(port=port)   # nothing changed while away: no event
        await asyncio.sleep(2.5)

    events = run_source(kube_api, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 2}, {MIG_1G: 2, MIG_3G: 1}]


def test_410_gone_lists_again(kube_api, tmp_path):
    kube_api.seed(seed.pod("first", limits={MIG_1G: 1}, phase="Pending"))
    port = kube_api.port

    async def scenario(recorder):
        assert await _until(lambda: len(recorder.events) == 1, 10)
        kube_api.stop()
        kube_api.delete("Pod", "first")
        kube_api.create(seed.pod("second", limits={MIG_3G: 2}, phase="Pending"))
        with kube_api.lock:
            kube_api._history.clear()   # the watch's resourceVersion is now too old: 410 Gone
            kube_api.create(seed.pod("third", limits={MIG_3G: 1}, phase="Pending"))
        kube_api.start(port=port)
        assert await _until(lambda: len(recorder.events) == 2, 15)
        await asyncio.sleep(1)

    events = run_source(kube_api, scenario)
    assert [e["profiles"] for e in events] == [{MIG_1G: 1}, {MIG_3G: 3}]


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
def test_bad_options_stop_the_source_with_their_name(kube_api, source, args, message):
    module = runpy.run_path(source)
    with pytest.raises(module["demand"].DemandError, match=message):
        asyncio.run(module["main"](Recorder(), dict(args, kubeconfig=kube_api.kubeconfig)))
