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


def test_by_default_a_demand_is_said_three_settle_windows_after_it_first_changed():
    """A pod arriving every 5 s keeps the demand changing: without max_wait_seconds the event
    comes 30 s (three 10 s windows) after the first, not after the burst ends."""
    deb = d.Debouncer(10)
    assert deb.max_wait == 30
    ready = None
    for t in range(0, 90, 5):
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
    # Issue 36: the rulebook renders options as text; only ASCII digits make a number.
    (" 30", None, "settle_seconds must be a number of seconds, got ' 30'"),
    ("30\n", None, "settle_seconds must be a number of seconds, got '30\\n'"),
    ("\uff13\uff10", None, "settle_seconds must be a number of seconds, got '\uff13\uff10'"),
    ("nan", None, "settle_seconds must be a number of seconds, got 'nan'"),
    (float("nan"), None, "settle_seconds must be between 0 and 86400 seconds, got nan"),
    (float("inf"), None, "settle_seconds must be between 0 and 86400 seconds, got inf"),
    ("-5", None, "settle_seconds must be between 0 and 86400 seconds, got '-5'"),
    (10, "\u0664\u0660", "max_wait_seconds must be a number of seconds, got '\u0664\u0660'"),
])
def test_bad_source_options_are_refused_with_their_name(settle, most, message):
    with pytest.raises(d.DemandError) as err:
        d.Debouncer(settle, most)
    assert str(err.value) == message


def test_source_options_as_text_in_ascii_digits_are_taken():
    deb = d.Debouncer("30", "120.5")
    assert (deb.settle, deb.max_wait) == (30.0, 120.5)
    assert d.watch_settings({}) == {"reconnect_max_seconds": 30.0, "watch_timeout_seconds": 300}
    assert d.watch_settings({"reconnect_max_seconds": "5", "watch_timeout_seconds": "60"}) == {
        "reconnect_max_seconds": 5.0, "watch_timeout_seconds": 60}
    assert d.watch_settings({"reconnect_max_seconds": 0.5})["reconnect_max_seconds"] == 0.5


@pytest.mark.parametrize("args, message", [
    ({"reconnect_max_seconds": float("nan")}, "reconnect_max_seconds must be between 0 and 86400"),
    ({"reconnect_max_seconds": "inf"}, "reconnect_max_seconds must be a number of seconds"),
    ({"reconnect_max_seconds": -5}, "reconnect_max_seconds must be between 0 and 86400"),
    ({"reconnect_max_seconds": 0}, "reconnect_max_seconds must be more than 0, got 0"),
    ({"watch_timeout_seconds": -5}, "watch_timeout_seconds must be a whole number of seconds"),
    ({"watch_timeout_seconds": 0}, "watch_timeout_seconds must be a whole number of seconds"),
    ({"watch_timeout_seconds": "\u0663\u0660\u0660"}, "watch_timeout_seconds must be a whole"),
    ({"watch_timeout_seconds": "300\n"}, "watch_timeout_seconds must be a whole number"),
    ({"watch_timeout_seconds": 2.5}, "watch_timeout_seconds must be a whole number"),
    ({"watch_timeout_seconds": float("inf")}, "watch_timeout_seconds must be a whole number"),
    ({"watch_timeout_seconds": True}, "watch_timeout_seconds must be a whole number"),
])
def test_the_watch_options_refuse_negative_nan_infinite_and_other_digits(args, message):
    """Issue 36: the event sources' watch options were float() and int() of what was given, so
    NaN, infinite and negative values (and '\u0663\u0660\u0660') reached the watch."""
    with pytest.raises(d.DemandError) as err:
        d.watch_settings(args)
    assert str(err.value).startswith(message), str(err.value)


def test_a_pod_quantity_in_other_digits_or_with_white_space_is_no_request():
    for odd in ("\u0662", "\uff12", " 2", "2\n", "2.0", "-2", -2, True):
        assert d.pod_request(pod("a", limits={MIG_1G: odd})) == {}, odd
    assert d.pod_request(pod("a", limits={MIG_1G: "2"})) == {MIG_1G: 2}


def test_backoff_doubles_up_to_its_limit_and_resets():
    backoff = d.Backoff(1, 5)
    assert [backoff.failed() for _attempt in range(5)] == [1, 2, 4, 5, 5]
    backoff.succeeded()
    assert backoff.failed() == 1


def test_handoff_delivers_until_the_source_stops_then_drops_quietly():
    """A watch that ends or fails after ansible-rulebook stopped the source (seen on a real API
    server, whose watches stay open) had its thread die with "Event loop is closed"."""
    import asyncio
    import threading

    stop = threading.Event()

    async def run():
        inbox = asyncio.Queue()
        handoff = d.Handoff(asyncio.get_running_loop(), inbox, stop)
        sent = []
        thread = threading.Thread(target=lambda: sent.append(handoff("pods", "listed", [])))
        thread.start()
        thread.join()
        return handoff, await asyncio.wait_for(inbox.get(), 5), sent

    handoff, item, sent = asyncio.run(run())
    assert item == ("pods", "listed", []) and sent == [True]
    assert handoff("pods", "error", "cut") is False     # the loop is closed: dropped, no raise
    assert stop.is_set()                                # and the watch thread told to end
    stopped = threading.Event()
    stopped.set()
    assert d.Handoff(None, None, stopped)("x") is False   # stopped: not even tried


# ----- ResourceClaims and Kueue Workloads beside pods (one demand) -----------------------------------------

MIG_7G = "nvidia.com/mig-7g.999gb"


def claim(name, profile="1g.10gb", count=1, device_class="mig.nvidia.com", allocated=False,
          created="2026-11-25T08:00:00Z"):
    exactly = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if profile:
        exactly["selectors"] = [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '%s'"
                                                       % profile}}]
    manifest = {"metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if allocated:
        manifest["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "device": "gpu-0-mig"}]}}}
    return manifest


def workload(name, count, requests, admitted=False, created="2026-11-25T08:00:00Z"):
    conditions = [{"type": "QuotaReserved", "status": "True" if admitted else "False"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    return {"metadata": {"name": name, "namespace": "default", "creationTimestamp": created,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name}]},
            "spec": {"podSets": [{"name": "main", "count": count, "template": {"spec": {"containers": [
                {"name": "c", "resources": {"limits": dict(requests)}}]}}}]},
            "status": {"conditions": conditions}}


def test_claim_request_reads_pending_mig_claims_as_the_planner_does():
    assert d.claim_request(claim("a", count=2)) == ({MIG_1G: 2}, None)
    assert d.claim_request(claim("me", profile="1g.10gb+me")) == ({"nvidia.com/mig-1g.10gb.me": 1}, None)
    assert d.claim_request(claim("done", allocated=True)) == ({}, None)
    assert d.claim_request(claim("whole", device_class="gpu.nvidia.com")) == ({}, None)
    assert d.claim_request(claim("any", profile=None)) == ({}, None)     # unresolved for the planner too
    going = claim("going")
    going["metadata"]["deletionTimestamp"] = "2026-11-25T08:00:00Z"
    assert d.claim_request(going) == ({}, None)
    bad = claim("bad")
    bad["spec"]["devices"]["requests"] = "gpu"
    asked, warning = d.claim_request(bad)
    assert asked == {} and "claim default/bad" in warning and "spec.devices.requests must be a list" in warning


def test_workload_request_reads_waiting_pod_sets_times_their_count():
    assert d.workload_request(workload("train", 3, {MIG_3G: 1, "cpu": 2})) == ({MIG_3G: 3}, None)
    assert d.workload_request(workload("in", 3, {MIG_3G: 1}, admitted=True)) == ({}, None)
    asked, warning = d.workload_request(workload("odd", "3", {MIG_3G: 1}))
    assert asked == {} and warning.startswith("Kueue Workload default/odd skipped") and "count" in warning


def test_tracker_aggregates_pods_claims_and_workloads_into_one_demand():
    tracker = d.DemandTracker()
    tracker.replace([pod("p", limits={MIG_1G: 1}, created="2026-11-25T08:00:30Z")], d.PODS)
    tracker.replace([claim("c", count=2, created="2026-11-25T08:00:00Z"), claim("done", allocated=True)], d.CLAIMS)
    tracker.replace([workload("w", 2, {MIG_3G: 1}, created="2026-11-25T08:01:00Z")], d.WORKLOADS)
    now = 1795593600 + 90
    snap_all = tracker.snapshot(now)
    assert snap_all["profiles"] == {MIG_1G: 3, MIG_3G: 2}
    assert (snap_all["pods"], snap_all["claims"], snap_all["workloads"], snap_all["waiting"]) == (1, 1, 1, 3)
    assert snap_all["oldest_pending_seconds"] == 90          # the claim is the oldest
    assert snap_all["fingerprint"] == d.fingerprint({MIG_1G: 3, MIG_3G: 2}, 1, 1, 1)
    # The claim is allocated, the Workload admitted: both leave; a re-listing of pods keeps the others.
    assert tracker.apply("MODIFIED", claim("c", count=2, allocated=True), d.CLAIMS) is True
    assert tracker.apply("MODIFIED", workload("w", 2, {MIG_3G: 1}, admitted=True), d.WORKLOADS) is True
    tracker.replace([pod("p", limits={MIG_1G: 1})], d.PODS)
    after = tracker.snapshot(now)
    assert after["profiles"] == {MIG_1G: 1} and (after["claims"], after["workloads"], after["waiting"]) == (0, 0, 1)
    # A pod-only demand has the fingerprint it had before claims and Workloads were watched.
    assert after["fingerprint"] == d.fingerprint({MIG_1G: 1}, 1)
    # A pod and a claim with the same name are two objects.
    tracker.apply("ADDED", claim("p"), d.CLAIMS)
    assert tracker.snapshot(now)["profiles"] == {MIG_1G: 2}


def test_unreadable_objects_are_skipped_with_one_warning_each():
    tracker = d.DemandTracker()
    bad = workload("odd", -1, {MIG_3G: 1})
    tracker.replace([bad, workload("ok", 1, {MIG_3G: 1})], d.WORKLOADS)
    assert [w.split(":")[0] for w in tracker.take_warnings()] == ["Kueue Workload default/odd skipped, its demand "
                                                                  "is not counted"]
    tracker.apply("MODIFIED", bad, d.WORKLOADS)
    tracker.replace([bad, workload("ok", 1, {MIG_3G: 1})], d.WORKLOADS)   # a re-listing says nothing again
    assert tracker.take_warnings() == []
    assert tracker.snapshot(0)["profiles"] == {MIG_3G: 1}


def test_demand_for_a_profile_no_gpu_offers_is_reported_once_per_fingerprint():
    tracker, deb = d.DemandTracker(), d.Debouncer(5)
    tracker.replace([claim("huge", profile="7g.999gb")], d.CLAIMS)
    deb.observe(tracker.snapshot(0), 0)
    assert deb.due(5)["profiles"] == {MIG_7G: 1}
    for t in (10, 20, 30):   # re-listings after reconnects, the same claim modified: nothing new
        tracker.replace([claim("huge", profile="7g.999gb")], d.CLAIMS)
        tracker.apply("MODIFIED", claim("huge", profile="7g.999gb"), d.CLAIMS)
        deb.observe(tracker.snapshot(t), t)
        assert deb.due(t + 6) is None


def test_watched_kinds_follow_the_options():
    assert d.watched_kinds({}) == {d.PODS: ("", "v1", "pods"),
                                   d.CLAIMS: ("resource.k8s.io", "v1", "resourceclaims"),
                                   d.WORKLOADS: ("kueue.x-k8s.io", "v1beta2", "workloads")}
    assert list(d.watched_kinds({"claims": False, "workloads": "False"})) == [d.PODS]
    assert d.watched_kinds({"kueue_api_version": "kueue.x-k8s.io/v1beta1"})[d.WORKLOADS][1] == "v1beta1"


@pytest.mark.parametrize("args, message", [
    ({"claims": "maybe"}, "claims must be true or false, got 'maybe'"),
    ({"workloads": 1}, "workloads must be true or false, got 1"),
    ({"kueue_api_version": "v1beta2"}, "kueue_api_version must be one of kueue.x-k8s.io/v1beta2, "
                                       "kueue.x-k8s.io/v1beta1, got 'v1beta2'"),
])
def test_bad_kind_options_are_refused_with_their_name(args, message):
    with pytest.raises(d.DemandError) as err:
        d.watched_kinds(args)
    assert str(err.value) == message


def test_the_demand_is_complete_once_every_watched_kind_has_been_listed():
    """Issue 33: the first event must not come before every kind has been listed once; a kind
    whose API keeps failing holds the others back for ``patience`` seconds at most, said once."""
    kinds = d.watched_kinds({})
    tracker = d.DemandTracker(kinds, patience=120, now=1000)
    assert not tracker.complete(1000)
    tracker.replace([], d.CLAIMS)
    tracker.replace([], d.WORKLOADS)   # a kind the cluster does not serve lists as none
    assert not tracker.complete(1001)       # pods not listed yet: their demand would be missing
    tracker.replace([pod("p", {MIG_1G: 1})], d.PODS)
    assert tracker.complete(1002) and tracker.take_warnings() == []

    slow = d.DemandTracker(kinds, patience=120, now=1000)
    slow.replace([], d.PODS)
    assert not slow.complete(1119)
    assert slow.complete(1120) and slow.complete(1121)
    assert slow.take_warnings() == ["claims, workloads not listed 120 s after the start: the "
                                    "demand is emitted without them until they are"]
    assert d.DemandTracker().complete(0)   # no kinds named: nothing to wait for
