"""A hold renewed while the run lives (plugins/module_utils/_keep_alive.py)."""

import os
import subprocess
import sys

from ansible_collections.gpuops.mig.plugins.module_utils import _keep_alive as keep


def fake_proc(tmp_path, processes):
    """A /proc with `processes`: {pid: (ppid, start, argv)}."""
    for pid, (ppid, start, argv) in processes.items():
        directory = tmp_path / str(pid)
        directory.mkdir()
        fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5
        (directory / "stat").write_text("%d (py (x) thon) %s\n" % (pid, " ".join(fields)))
        (directory / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return str(tmp_path)


def test_the_run_is_the_topmost_ansible_playbook_above_the_module(tmp_path):
    playbook = ["/venv/bin/python", "/venv/bin/ansible-playbook", "site.yml"]
    proc = fake_proc(
        tmp_path,
        {
            10: (1, 100, ["/usr/bin/ansible-runner", "run", "/tmp/job"]),
            20: (10, 200, playbook),  # the run
            30: (20, 300, playbook),  # a worker: a fork of it, ending with its task
            40: (30, 400, ["/bin/sh", "-c", "python AnsiballZ_mig_node_lease.py"]),
            50: (40, 500, ["/venv/bin/python", "AnsiballZ_mig_node_lease.py"]),
        },
    )
    assert keep.run_process(50, proc) == (20, 200)
    assert keep.alive((20, 200), proc)
    assert not keep.alive((20, 999), proc)  # the pid reused by a later process
    assert not keep.alive((77, 200), proc)


def test_under_a_runner_alone_the_runner_is_the_run_and_nothing_else_is_none(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            10: (1, 100, ["/usr/bin/python3", "/usr/bin/ansible-runner", "run", "/tmp/job"]),
            50: (10, 500, ["/venv/bin/python", "AnsiballZ_mig_node_lease.py"]),
            60: (1, 600, ["/usr/bin/python3", "-m", "pytest"]),
            61: (60, 610, ["/venv/bin/python", "module.py"]),
        },
    )
    assert keep.run_process(50, proc) == (10, 100)
    assert keep.run_process(61, proc) is None


def test_this_process_is_alive_and_a_finished_one_is_not():
    me = keep.run_process()  # pytest is no ansible run
    assert me is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = keep._stat(child.pid)
    child.wait()
    assert stat is not None and not keep.alive((child.pid, stat[1]))
    assert keep.alive((os.getpid(), keep._stat(os.getpid())[1]))


class Clock(object):
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds

    def time(self):
        return self.now


def test_renewed_every_third_of_the_duration_until_the_run_ends():
    clock, calls = Clock(), []
    lives = iter([True] * 5 + [False])

    def step():
        calls.append(clock.now)
        return "renewed"

    why = keep.renew_while((1, 1), 30, step, clock.sleep, clock.time, lambda run: next(lives))
    assert why == "run ended" and calls == [10.0, 20.0, 30.0, 40.0, 50.0]


def test_it_stops_when_the_hold_is_not_ours_or_renewals_fail_for_a_duration():
    clock = Clock()
    answers = iter(["renewed", "stop"])
    assert (
        keep.renew_while(
            (1, 1), 9, lambda: next(answers), clock.sleep, clock.time, lambda run: True
        )
        == "not ours"
    )
    clock = Clock()
    answers = iter(["renewed", "failed", "failed", "renewed", "failed", "failed", "failed"])
    assert (
        keep.renew_while(
            (1, 1), 9, lambda: next(answers), clock.sleep, clock.time, lambda run: True
        )
        == "failing"
    )
    assert clock.now == 21.0  # three failed renewals after the last good one (at 12 s)


def test_one_keep_alive_per_hold(tmp_path):
    first = keep.exclusive("default/gpuops-mig-gpu-1/run-1", str(tmp_path))
    assert first is not None
    assert keep.exclusive("default/gpuops-mig-gpu-1/run-1", str(tmp_path)) is None
    other = keep.exclusive("default/gpuops-mig-gpu-2/run-1", str(tmp_path))
    assert other is not None
    os.close(first)
    again = keep.exclusive("default/gpuops-mig-gpu-1/run-1", str(tmp_path))
    assert again is not None
    os.close(again)
    os.close(other)


def test_a_keep_alive_that_ends_leaves_no_file_and_the_hold_can_be_kept_again(tmp_path):
    key = "default/gpuops-mig-gpu-1/run-1"
    first = keep.exclusive(key, str(tmp_path))
    keep.release(first, key, str(tmp_path))
    assert os.listdir(str(tmp_path)) == []
    again = keep.exclusive(key, str(tmp_path))
    assert again is not None and keep.exclusive(key, str(tmp_path)) is None
    keep.release(again, key, str(tmp_path))
    keep.release(os.open(os.devnull, os.O_RDONLY), key, str(tmp_path))   # already gone: no error
    assert os.listdir(str(tmp_path)) == []


def test_a_lock_on_a_file_its_holder_removed_is_taken_again_on_the_new_one(tmp_path, monkeypatch):
    key = "default/gpuops-mig-gpu-1/run-1"
    path = keep.lock_path(key, str(tmp_path))
    real_open, calls = os.open, []

    def open_then_lose_the_race(name, *args):
        handle = real_open(name, *args)
        calls.append(name)
        if len(calls) == 1:       # the holder releases between this open and our flock
            os.unlink(name)
        return handle
    monkeypatch.setattr(os, "open", open_then_lose_the_race)
    handle = keep.exclusive(key, str(tmp_path))
    monkeypatch.undo()
    assert calls == [path, path] and os.stat(path).st_ino == os.fstat(handle).st_ino
    keep.release(handle, key, str(tmp_path))
