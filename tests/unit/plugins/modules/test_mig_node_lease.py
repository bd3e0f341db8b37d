"""gpuops.mig.mig_node_lease: the lock file on a host, and what a lost write (409) leads to."""

import json
import os

from ansible_collections.gpuops.mig.plugins.module_utils import _lease
from ansible_collections.gpuops.mig.plugins.modules import mig_node_lease
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.test__input import no_hang

US = {"run_id": "run-a", "controller": "ctl-1"}
THEM = {"run_id": "run-b", "controller": "ctl-2", "job_id": "7"}


def args(lock, state, holder=None, **extra):
    return dict(dict(state=state, node="box-1", holder=holder or US, lock_file=str(lock)), **extra)


def test_lock_file_taken_renewed_refused_and_released(run_module, tmp_path):
    lock = tmp_path / "run" / "gpuops-mig" / "lock"
    taken = run_module(mig_node_lease, args(lock, "acquired"))
    assert taken["changed"] and taken["action"] == "create", taken
    held = json.loads(lock.read_text())
    assert held["holder"]["run_id"] == "run-a" and held["holder_identity"].startswith("gpuops.mig run run-a on ctl-1")

    renewed = run_module(mig_node_lease, args(lock, "renewed"))
    assert renewed["action"] == "renew" and json.loads(lock.read_text())["acquire_time"] == held["acquire_time"]

    refused = run_module(mig_node_lease, args(lock, "acquired", THEM))
    assert refused["failed"] and refused["msg"].startswith("box-1: another MIG rollout holds this node: "
                                                           "gpuops.mig run run-a on ctl-1")
    lost = run_module(mig_node_lease, args(lock, "renewed", THEM))
    assert lost["failed"] and lost["lost"] is True
    assert run_module(mig_node_lease, args(lock, "released", THEM))["action"] == "nothing" and lock.exists()

    released = run_module(mig_node_lease, args(lock, "released"))
    assert released["changed"] and released["action"] == "release" and not lock.exists()


def test_check_mode_writes_nothing_and_bad_settings_are_refused(run_module, tmp_path):
    lock = tmp_path / "lock"
    assert run_module(mig_node_lease, args(lock, "acquired"), check_mode=True)["action"] == "create"
    assert not lock.exists()
    bad = run_module(mig_node_lease, args(lock, "acquired", duration=0))
    assert bad["failed"] and "Nothing was changed" in bad["msg"] and not lock.exists()
    node_lease = run_module(mig_node_lease, dict(state="acquired", node="n", holder=US, namespace="kube-node-lease"))
    assert node_lease["failed"] and "kubelets' heartbeats" in node_lease["msg"]


def test_an_unreadable_lock_file_is_held_until_it_is_stale(run_module, tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("garbage")
    refused = run_module(mig_node_lease, args(lock, "acquired"))
    assert refused["failed"] and "an unreadable lock file" in refused["msg"]
    os.utime(lock, (0, 1000))        # not written to since 1970: stale
    taken = run_module(mig_node_lease, args(lock, "acquired"))
    assert taken["action"] == "take-over" and json.loads(lock.read_text())["holder"]["run_id"] == "run-a"


def test_a_lock_file_that_is_not_a_regular_file_is_refused_before_opening(run_module, tmp_path):
    """Issue 36: open() of a FIFO waited for a writer for ever, /dev/zero was read without end."""
    fifo = tmp_path / "fifo-lock"
    os.mkfifo(str(fifo))
    zero = tmp_path / "zero-lock"        # the guard file is made beside the lock file
    zero.symlink_to("/dev/zero")
    directory = tmp_path / "dir-lock"
    directory.mkdir()
    for path, kind in ((fifo, "a FIFO (named pipe)"), (zero, "a character device"),
                       (directory, "a directory")):
        with no_hang(10):
            refused = run_module(mig_node_lease, args(path, "acquired"))
        assert refused["failed"], refused
        assert refused["msg"] == ("lock_file %s is %s, not a regular file; nothing was read "
                                  "from it" % (path, kind))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dir-lock", "dir-lock.guard", "fifo-lock", "fifo-lock.guard", "zero-lock",
        "zero-lock.guard"]
    assert list(directory.iterdir()) == []


def test_a_lock_file_larger_than_a_record_can_be_is_refused(run_module, tmp_path):
    lock = tmp_path / "lock"
    with open(str(lock), "wb") as handle:      # sparse: nothing is read
        handle.truncate(10 ** 10)
    refused = run_module(mig_node_lease, args(lock, "acquired"))
    assert refused["failed"] and refused["msg"] == (
        "lock_file %s: %d bytes, more than the %d it may have"
        % (lock, 10 ** 10, mig_node_lease.LOCK_FILE_LIMIT))
    assert lock.stat().st_size == 10 ** 10


class RacingStore(object):
    """A Lease store whose first write loses to another rollout (409), which then holds the node."""

    def __init__(self):
        self.current = None
        self.writes = []

    def guarded(self):
        import contextlib
        return contextlib.nullcontext()

    def body(self, node, rec):
        return rec

    def read(self):
        return self.current

    def write(self, action, current, rec):
        self.writes.append(action)
        if len(self.writes) == 1:
            self.current = _lease.record(THEM, _lease.utc_now(), 3600)
            return False
        self.current = rec
        return True


class FakeModule(object):
    check_mode = False


def params(state, wait=0):
    return dict(state=state, node="gpu-1", holder=US, duration=3600, wait=wait, wait_delay=1)


def test_a_lost_create_reads_again_and_refuses():
    store = RacingStore()
    try:
        mig_node_lease.settle(FakeModule(), store, params("acquired"))
    except _lease.LeaseHeld as err:
        assert "gpuops.mig run run-b on ctl-2 (AWX job 7)" in str(err)
    else:
        raise AssertionError("a node another rollout won was not refused")
    assert store.writes == ["create"]


def test_a_lost_renewal_reads_again_and_reports_the_node_lost():
    store = RacingStore()
    store.current = _lease.record(US, _lease.utc_now(), 3600)
    # This run's renewal loses to run-b, which then holds it: this run has lost the node.
    try:
        mig_node_lease.settle(FakeModule(), store, params("renewed"))
    except _lease.LeaseHeld as err:
        assert err.details["lost"] is True
    else:
        raise AssertionError("a lost lease was not reported")
