"""The event source's decisions: pending MIG demand, its fingerprint and the settle window (_demand.py)."""

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand as d

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"


def pod(name, limits=None, requests=None, node=None, phase="Pending", created="2026-11-25T08:00:00Z", **meta):
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    spec = {"containers": [{"name": "c", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": dict({"name": name, "namespace": "default", "creationTimestamp": created}, **meta),
            "spec": spec, "status": {"phase": phase}}


def test_pod_request_reads_pending_mig_limits_else_requests():
    assert d.pod_request(pod("a", limits={MIG_1G: 2, "cpu": "1"})) == {MIG_1G: 2}
    assert d.pod_request(pod("a", requests={MIG_1G: "1"})) == {MIG_1G: 1}
    two = pod("a", limits={MIG_1G: 1})
    two["spec"]["containers"].append({"name": "b", "resources": {"limits": {MIG_1G: 1, MIG_3G: 1}}})
    assert d.pod_request(two) == {MIG_1G: 2, MIG_3G: 1}


@pytest.mark.parametrize("other", [
    pod("bound", limits={MIG_1G: 1}, node="gpu-a"),
    pod("done", limits={MIG_1G: 1}, phase="Succeeded"),
    pod("failed", limits={MIG_1G: 1}, phase="Failed"),
    pod("going", limits={MIG_1G: 1}, deletionTimestamp="2026-11-25T08:00:00Z"),
    pod("whole", limits={"nvidia.com/gpu": 1}),
    pod("odd", limits={MIG_1G: "1.5"}),
    pod("zero", limits={MIG_1G: 0}),
    "not a pod",
])
def test_pods_that_wait_for_no_mig_device_add_no_demand(other):
    assert d.pod_request(other) == {}


def test_tracker_aggregates_and_follows_watch_events():
    tracker = d.DemandTracker()
    tracker.replace([pod("a", limits={MIG_1G: 2}, created="2026-11-25T08:00:00Z"),
                     pod("b", limits={MIG_3G: 1}, created="2026-11-25T08:00:30Z"),
                     pod("c", limits={MIG_1G: 1}, node="gpu-a")])
    now = 1795593600 + 90  # 2026-11-25T08:01:30Z
    snap = tracker.snapshot(now)
    assert snap["profiles"] == {MIG_1G: 2, MIG_3G: 1} and snap["pods"] == 2
    assert snap["oldest_pending_seconds"] == 90
    # a is bound: it leaves the demand; b is deleted; d arrives.
    assert tracker.apply("MODIFIED", pod("a", limits={MIG_1G: 2}, node="gpu-b")) is True
    assert tracker.apply("DELETED", pod("b", limits={MIG_3G: 1})) is True
    assert tracker.apply("ADDED", pod("d", limits={MIG_3G: 2})) is True
    assert tracker.apply("MODIFIED", pod("d", limits={MIG_3G: 2})) is False
    assert tracker.snapshot(now)["profiles"] == {MIG_3G: 2}
    assert tracker.snapshot(now)["fingerprint"] != snap["fingerprint"]


def test_fingerprint_is_the_aggregate_not_the_pods_or_their_age():
    one, other = d.DemandTracker(), d.DemandTracker()
    one.replace([pod("a", limits={MIG_1G: 1}), pod("b", limits={MIG_3G: 1})])
    other.replace([pod("x", limits={MIG_3G: 1}, created="2026-11-25T07:00:00Z"), pod("y", limits={MIG_1G: 1})])
    assert one.snapshot(0)["fingerprint"] == other.snapshot(100)["fingerprint"]
    merged = d.DemandTracker()
    merged.replace([pod("a", limits={MIG_1G: 1, MIG_3G: 1})])   # the same devices from one pod
    assert merged.snapshot(0)["fingerprint"] != one.snapshot(0)["fingerprint"]
    assert d.DemandTracker().snapshot(0)["fingerprint"] == d.EMPTY_FINGERPRINT


def snap(profiles, pods=1):
    return {"profiles": profiles, "pods": pods, "oldest_pending_seconds": 0,
            "fingerprint": d.fingerprint(profiles, pods)}


def test_debouncer_waits_for_the_settle_window_and_emits_once():
    deb = d.Debouncer(10, 100)
    deb.observe(snap({MIG_1G: 1}), 0)
    assert deb.due(5) is None and deb.wait(5) == 5
    deb.observe(snap({MIG_1G: 2}), 6)             # a burst: the window starts again
    assert deb.due(15) is None
    assert deb.due(16)["profiles"] == {MIG_1G: 2}
    assert deb.due(17) is None                    # emitted once
    deb.observe(snap({MIG_1G: 2}), 30)            # the same demand seen again (a re-listing)
    assert deb.due(100) is None and deb.wait(100) == 60


def test_debouncer_says_nothing_when_demand_returns_to_what_was_said():
    deb = d.Debouncer(10, 100)
    deb.observe(snap({MIG_1G: 2}), 0)
    assert deb.due(10) is not None
    deb.observe(snap({MIG_1G: 3}), 11)
    deb.observe(snap({MIG_1G: 2}), 12)            # back within the window
    assert deb.due(50) is None
    deb.observe(snap({}, 0), 60)                  # the last pod went: said once
    assert deb.due(70)["pods"] == 0
    deb.observe(snap({MIG_1G: 2}), 80)            # the same demand again after it was gone: a new event
    assert deb.due(90)["profiles"] == {MIG_1G: 2}


def test_nothing_is_emitted_at_start_without_demand():
    deb = d.Debouncer(0)
    deb.observe(snap({}, 0), 0)
    assert deb.due(1000) is None


def test_debouncer_emits_after_max_wait_under_constant_churn():
    deb = d.Debouncer(10, 30)
    for t in range(0, 40, 5):
        deb.observe(snap({MIG_1G: t + 1}), t)
        ready = deb.due(t)
        if ready is not None:
            break
    assert t == 30 and ready["profiles"] == {MIG_1G: 31}


@pytest.mark.parametrize("settle, most, message", [
    ("soon", None, "settle_seconds must be a number of seconds, got 'soon'"),
    (True, None, "settle_seconds must be a number of seconds, got True"),
    (-1, None, "settle_seconds must be between 0 and 86400 seconds, got -1"),
    (10, 5, "max_wait_seconds (5.0) must be at least settle_seconds (10.0)"),
])
def test_bad_source_options_are_refused_with_their_name(settle, most, message):
    with pytest.raises(d.DemandError) as err:
        d.Debouncer(settle, most)
    assert str(err.value) == message


def test_backoff_doubles_up_to_its_limit_and_resets():
    backoff = d.Backoff(1, 5)
    assert [backoff.failed() for _attempt in range(5)] == [1, 2, 4, 5, 5]
    backoff.succeeded()
    assert backoff.failed() == 1
