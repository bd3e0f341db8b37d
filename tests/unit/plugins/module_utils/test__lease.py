"""One writer per node: the lease decisions (plugins/module_utils/_lease.py)."""

import datetime

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _lease as lease

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
US = dict(run_id="20260101T115500Z-aaaa", controller="ctl-1", job_id="", started="2026-01-01T11:55:00Z")
THEM = dict(run_id="20260101T114000Z-bbbb", controller="ctl-2", job_id="4711", started="2026-01-01T11:40:00Z")


SLICE_1 = dict(US, run_id="20260101T115500Z-cccc", job_id="41", workflow_id="40")
SLICE_2 = dict(US, run_id="20260101T115500Z-dddd", job_id="42", workflow_id="40")


def held_by(holder, renewed_ago, duration=600):
    moment = NOW - datetime.timedelta(seconds=renewed_ago)
    return lease.record(holder, moment, duration, acquire_time="2026-01-01T11:40:00.000000Z")


@pytest.mark.parametrize("state, current, expected", [
    ("acquired", None, lease.CREATE),
    ("acquired", held_by(US, 10), lease.RENEW),               # re-entrant: this run holds it already
    ("acquired", held_by(THEM, 10), lease.REFUSE),
    ("acquired", held_by(THEM, 600), lease.REFUSE),           # renew + duration == now: not yet expired
    ("acquired", held_by(THEM, 601), lease.TAKE_OVER),
    ("acquired", dict(held_by(THEM, 10), holder_identity=""), lease.TAKE),   # released, not deleted
    ("renewed", held_by(US, 10), lease.RENEW),
    ("renewed", None, lease.CREATE),
    ("renewed", held_by(THEM, 10), lease.LOST),
    ("renewed", held_by(THEM, 9999), lease.TAKE_OVER),
    ("released", held_by(US, 10), lease.RELEASE),
    ("released", held_by(THEM, 10), lease.NOTHING),
    ("released", None, lease.NOTHING),
])
def test_decide(state, current, expected):
    assert lease.decide(state, current, US, NOW) == expected


@pytest.mark.parametrize("state, current, expected", [
    ("acquired", held_by(SLICE_1, 10), lease.SHARE),        # slices of one AWX sliced job: one rollout
    ("renewed", held_by(SLICE_1, 10), lease.SHARE),
    ("renewed", dict(held_by(SLICE_1, 10), holder_identity=""), lease.TAKE),  # slice 1 is done
    ("released", held_by(SLICE_1, 10), lease.NOTHING),      # slice 1's hold is slice 1's to release
    ("acquired", held_by(SLICE_1, 9999), lease.TAKE_OVER),
    ("acquired", held_by(THEM, 10), lease.REFUSE),
    ("acquired", held_by(dict(THEM, workflow_id="39"), 10), lease.REFUSE),
])
def test_slices_of_one_awx_workflow_job_share_a_hold(state, current, expected):
    assert lease.decide(state, current, SLICE_2, NOW) == expected
    assert lease.decide("acquired", held_by(SLICE_1, 10), US, NOW) == lease.REFUSE  # no workflow


def test_a_record_without_time_or_duration_never_expires_by_itself():
    assert not lease.expired(dict(holder_identity="x", renew_time="", acquire_time="", duration=600), NOW)
    assert not lease.expired(dict(holder_identity="x", renew_time="2020-01-01T00:00:00Z", duration=0), NOW)
    assert lease.expired(dict(holder_identity="x", renew_time="", acquire_time="2020-01-01T00:00:00Z",
                              duration=5), NOW)


def test_unknown_state_is_refused():
    with pytest.raises(ValueError):
        lease.decide("taken", None, US, NOW)


def test_lease_object_round_trip_keeps_holder_and_times():
    rec = lease.record(THEM, NOW, 3600)
    obj = lease.lease_object("gpuops-mig-gpu-1", "default", "gpu-1", rec, resource_version="42")
    assert obj["apiVersion"] == "coordination.k8s.io/v1" and obj["kind"] == "Lease"
    assert obj["spec"] == {"holderIdentity": "gpuops.mig run 20260101T114000Z-bbbb on ctl-2 (AWX job 4711), "
                                             "started 2026-01-01T11:40:00Z",
                           "leaseDurationSeconds": 3600, "acquireTime": "2026-01-01T12:00:00.000000Z",
                           "renewTime": "2026-01-01T12:00:00.000000Z"}
    assert obj["metadata"]["annotations"]["gpuops.mig/lease-job-id"] == "4711"
    assert obj["metadata"]["resourceVersion"] == "42"
    back = lease.from_lease(obj)
    assert back.pop("resource_version") == "42"
    assert back == rec
    assert lease.decide("acquired", back, THEM, NOW) == lease.RENEW


def test_renewal_keeps_the_acquire_time():
    first = lease.record(US, NOW, 60)
    later = lease.record(US, NOW + datetime.timedelta(seconds=30), 60, first["acquire_time"])
    assert later["acquire_time"] == first["acquire_time"] and later["renew_time"] > first["renew_time"]


def test_messages_name_the_holder_and_since_when():
    current = held_by(THEM, 10)
    text = lease.held_message("gpu-1", current, waited=30)
    assert text.startswith("gpu-1: another MIG rollout holds this node after waiting 30 s: gpuops.mig run "
                           "20260101T114000Z-bbbb on ctl-2 (AWX job 4711)")
    assert "holds it since 2026-01-01T11:40:00.000000Z" in text and "Nothing was changed" in text
    assert "mig_node_lease_duration" in lease.lost_message("gpu-1", current)
    taken = lease.outcome(lease.TAKE_OVER, current, "gpu-1")
    assert taken["changed"] and "took the lease over from gpuops.mig run 20260101T114000Z-bbbb" in taken["msg"]
    assert taken["taken_over_from"].startswith("gpuops.mig run 20260101T114000Z-bbbb")
    assert lease.outcome(lease.NOTHING, None, "gpu-1")["changed"] is False


def test_times_parse_with_and_without_fraction():
    assert lease.parse_time("2026-01-01T12:00:00.000000Z") == NOW
    assert lease.parse_time("2026-01-01T12:00:00Z") == NOW
    assert lease.parse_time("2026-01-01T12:00:00+00:00") == NOW
    assert lease.parse_time("soon") is None and lease.parse_time(None) is None


def test_a_stranger_s_lease_is_not_called_another_mig_rollout():
    """A Lease gpuops.mig did not write (no gpuops.mig/lease-run-id) is named as someone else's."""
    stranger = dict(held_by(THEM, 10), holder={}, holder_identity="kured on node-7")
    text = lease.held_message("gpu-1", stranger)
    assert text.startswith("gpu-1: the node's lease is held by kured on node-7 (holds it since")
    assert "which is not a gpuops.mig rollout" in text and "another MIG rollout" not in text


@pytest.mark.parametrize(
    "settings, problem",
    [
        ((3600, 0, 5, "default"), None),
        (
            (0, 0, 5, "default"),
            "duration and wait_delay must be at least 1 and wait at least 0 (got 0, 5, 0",
        ),
        ((60, -1, 5, "default"), "wait at least 0"),
        (
            (60, 0, 5, "kube-node-lease"),
            "namespace kube-node-lease holds the kubelets' heartbeats",
        ),
    ],
)
def test_lease_settings_are_checked_on_their_own(settings, problem):
    got = lease.settings_problem("gpu-1", *settings)
    assert got is None if problem is None else problem in got
    assert lease.settings_problem("gpu-1", 60, 0, 5, "kube-node-lease", lock_file=True) is None
