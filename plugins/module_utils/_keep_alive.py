# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""A hold renewed for as long as the run lives: the process behind mig_node_lease's keep_alive.

A Lease renewed only between a role's steps must outlast the longest step (a drain, a reboot, a
mig-manager run), so a run that died held the node for an hour. client-go's leader election
renews in the background instead, and its Leases last seconds. Here a process on the controller,
detached from the module that took the hold, renews it every third of its duration while the
`ansible-playbook` process that took it lives; it stops when that process is gone, when the hold
is no longer this run's (released, or taken over), or when renewing it fails for a whole
duration. A run that dies then blocks the node for one duration at most.

Private to the collection; no Ansible imports."""

from __future__ import annotations

import os
import select
import time
from typing import Any, Callable

# The processes whose life a hold follows, in order of preference: the playbook run (under
# ansible-runner or AWX too), else the runner itself.
RUN_PROGRAMS = ("ansible-playbook", "ansible-runner")


def _stat(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, or None when it is gone."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[1]), int(fields[19])


def _program(pid: int, proc: str = "/proc") -> str:
    """The program a process runs: the base name of its script (python's argv[1]) or argv[0]."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
            argv = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return ""
    names = [os.path.basename(arg) for arg in argv[:2] if arg]
    return next((name for name in names if name in RUN_PROGRAMS), names[0] if names else "")


def run_process(pid: int | None = None, proc: str = "/proc") -> tuple[int, int] | None:
    """(pid, start time) of the run above process `pid` (default: this one): the topmost
    ansible-playbook process among its ancestors (Ansible's workers are forks of it, with the same
    command line, and end with each task), else the topmost ansible-runner; None when neither."""
    pid = os.getpid() if pid is None else pid
    found = {}
    for dummy in range(64):
        stat = _stat(pid, proc)
        if stat is None or pid <= 1:
            break
        program = _program(pid, proc)
        if program in RUN_PROGRAMS:
            found[program] = (pid, stat[1])
        pid = stat[0]
    return next((found[program] for program in RUN_PROGRAMS if program in found), None)


def alive(run: tuple[int, int], proc: str = "/proc") -> bool:
    """Whether the run's process still runs (the same process: a reused pid starts later)."""
    stat = _stat(run[0], proc)
    return stat is not None and stat[1] == run[1]


def renew_while(
    run: tuple[int, int],
    duration: int,
    step: Callable[[], str],
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    is_alive: Callable[[tuple[int, int]], bool] = alive,
) -> str:
    """Call step() every third of `duration` while `run` lives. step() renews the hold and answers
    "renewed", "stop" (no longer ours) or "failed" (the API did not answer). Returns why it ended:
    "run ended", "not ours" or "failing" (no renewal got through for a whole duration)."""
    interval = max(1.0, duration / 3.0)
    last_renewed = clock()
    while True:
        sleep(interval)
        if not is_alive(run):
            return "run ended"
        answer = step()
        if answer == "stop":
            return "not ours"
        if answer == "renewed":
            last_renewed = clock()
        elif clock() - last_renewed >= duration:
            return "failing"


def detach(ready_timeout: float, warm_up: Callable[[], bool], work: Callable[[], Any]) -> str:
    """Run work() in a process of its own that outlives this one (double fork, new session,
    standard streams on /dev/null, so the caller's pipes close when this process exits). Before
    this returns, the new process runs warm_up() (imports and one API call, done while the
    module's files still exist): False means another process keeps the hold already, and this one
    ends. Returns "started", "kept already" or "failed" (warm_up raised, or did not answer within
    ready_timeout seconds)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        os.waitpid(pid, 0)
        ready = select.select([read_end], [], [], ready_timeout)[0]
        answer = os.read(read_end, 1) if ready else b""
        os.close(read_end)
        return {b"1": "started", b"2": "kept already"}.get(answer, "failed")
    # The first child: a new session, then the worker, and out.
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):
        os.dup2(null, stream)
    os.closerange(3, write_end)
    os.closerange(write_end + 1, 4096)
    try:
        go_on = warm_up()
    except Exception:  # pylint: disable=broad-except
        os.write(write_end, b"0")
        os._exit(1)
    os.write(write_end, b"1" if go_on else b"2")
    os.close(write_end)
    if not go_on:
        os._exit(0)
    try:
        work()
    finally:
        os._exit(0)


def lock_path(key: str, directory: str = "/tmp") -> str:
    """The file whose flock marks the keep-alive of hold `key` (namespace/lease/run)."""
    import hashlib

    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    return os.path.join(directory, "gpuops-mig-keep-alive-%s.lock" % digest)


def exclusive(key: str, directory: str = "/tmp") -> Any:
    """An flock that one keep-alive process per hold holds for its life (a second one for the same
    hold and run ends at once); None when another process holds it. release() removes the file,
    so a lock taken on a file just removed is not one: it is taken again on the new file."""
    import fcntl

    path = lock_path(key, directory)
    for dummy in range(8):
        handle = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(handle)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(handle).st_ino:
                return handle
        except FileNotFoundError:
            pass
        os.close(handle)   # its holder removed the file as we opened it
    return None


def release(handle: int, key: str, directory: str = "/tmp") -> None:
    """Ends the keep-alive's flock and removes its file (one per run and hold would otherwise
    stay in /tmp for good); removed while still locked, so exclusive() sees the change."""
    try:
        os.unlink(lock_path(key, directory))
    except FileNotFoundError:
        pass
    os.close(handle)
