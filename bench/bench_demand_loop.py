# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The demand loop, measured: how long pods that wait for MIG devices take to run when
ansible-rulebook runs the collection's source and rulebook (gpuops.mig.mig_demand) and each round
is the real playbooks/demand_round.yml.

A measurement, not a model (bench/bench_demand.py is the model): the test control plane
(tests/support/controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok), the NVIDIA stand-ins (device plugin and GFD reading simulated GPUs, the kubelet's device
assignments served over PodResources gRPC on each node's socket), and the loop run as a
ServiceAccount bound to the rules the collection ships (rbac/demand.yml, plan.yml and the
rollout's). Four simulated nodes of 2 x H100-SXM5-80GB start at all-balanced (per GPU 3g.40gb,
2g.20gb and two 1g.10gb).

The trace (seeded): a burst of 1g.10gb pods, then 7g.80gb pods that need a whole GPU reshaped,
then a mix in which about a third ask for profiles the fleet lacks at the start (7g.80gb,
4g.40gb, 1g.20gb). Each pod runs for a while once Running and is then deleted, as a job ends.

Per run: creation to Running (the bench's create request to the first poll that sees Running,
polled every 0.5 s) p50/p95/max, overall and for the pods whose profile had to be created;
pods never served; running pods evicted or whose device was destroyed; rounds, nodes applied,
nodes held and why, failed rounds.

Usage (from the repository root, after scripts/setup.sh and scripts/control-plane.sh; needs
Java 17 for ansible-rulebook):
    .venv/bin/python bench/bench_demand_loop.py [--pods 30] [--minutes 10] [--tail 600]
        [--settings defaults,responsive] [--seed 7] [--json FILE] [--keep]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import pathlib
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for path in (
    os.path.join(REPO, "tests", "integration"),
    os.path.join(REPO, "simulator"),
    os.path.join(REPO, ".build", "collections"),
    REPO,
):
    sys.path.insert(0, path)

import yaml  # noqa: E402

import gpuops_mig_sim as sim  # noqa: E402
from test_eda_loop import inventory_dir, rounds, stop_rulebook  # noqa: E402
from test_mig_ready import plugin_daemonsets  # noqa: E402
from test_roles import Fleet  # noqa: E402
from tests.integration.conftest import RBAC, ROLLOUT_RBAC, client_env  # noqa: E402
from tests.support.controlplane.cluster import running  # noqa: E402
from tests.support.kubeapi import seed  # noqa: E402
from tests.support.podresources_server import PodResourcesServer, node_source  # noqa: E402
from tests.support.simhost import nvml_on  # noqa: E402

BIN = os.path.dirname(os.path.abspath(sys.executable))
NODES = 4
GPUS = "2xH100-SXM5-80GB"
# all-balanced on an H100-80GB: (GI profile id, placement start, size, CI profile constant).
ALL_BALANCED = ((9, 4, 4, 2), (14, 0, 2, 1), (19, 2, 1, 0), (19, 3, 1, 0))
AT_START = ("1g.10gb", "2g.20gb", "3g.40gb")
LACKING = ("7g.80gb", "4g.40gb", "1g.20gb")
# The loop's settings (docs/dynamic.md): the collection's defaults, and the responsive ones.
SETTINGS = {
    "defaults": {},
    "responsive": {
        "gpuops_mig_demand_settle_seconds": 5,
        "gpuops_mig_round_cooldown": 0,
        "gpuops_mig_round_max_nodes": 4,
        "gpuops_mig_round_serial": 4,
    },
}


def trace(pods, minutes, rng):
    """[(seconds after the start, name, profile, seconds it runs)]: a burst of 1g.10gb pods, then
    7g.80gb pods, then a mix (a third of the trace asks for a profile the fleet lacks)."""
    span = minutes * 60.0
    burst, big = max(1, pods * 4 // 10), max(1, pods // 5)
    out = []
    for _pod in range(burst):
        out.append((rng.uniform(0, span * 0.1), "1g.10gb"))
    for _pod in range(big):
        out.append((rng.uniform(span * 0.3, span * 0.4), "7g.80gb"))
    lacking = max(0, pods // 3 - big)
    for i in range(pods - burst - big):
        profile = rng.choice(LACKING[1:]) if i < lacking else rng.choice(AT_START)
        out.append((rng.uniform(span * 0.5, span), profile))
    out.sort()
    return [(at, "p%02d-%s" % (i, profile.replace(".", "-")), profile, rng.uniform(120, 300))
            for i, (at, profile) in enumerate(out)]


def all_balanced(state, root):
    """The host at all-balanced (before its device plugin starts: it reads the GPUs then)."""
    sim.create_state(state, GPUS, seed=os.path.basename(state), mig="enabled", force=True,
                     root=root if os.geteuid() == 0 else None)
    with nvml_on(state) as nvml:
        for gpu in (0, 1):
            for profile, start, size, ci in ALL_BALANCED:
                gi = nvml.create_gpu_instance(gpu, profile, start, size)
                nvml.create_compute_instance(gpu, gi, ci, 0)


class Watch(object):
    """Polls the pods every half second: when each was first seen Running, which were deleted
    by someone other than the bench (evicted) or failed with their device destroyed."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.created, self.running, self.ours, self.node = {}, {}, set(), {}
        self.evicted, self.destroyed = set(), set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stopping.wait(0.5):
            try:
                pods = self.cluster.list("Pod", namespace="default")
            except Exception:  # pylint: disable=broad-except
                continue
            now = time.time()
            present = set(p["metadata"]["name"] for p in pods)
            for name in list(self.created):
                if name in self.running and name not in present and name not in self.ours:
                    self.evicted.add(name)     # gone between two polls
            for pod in pods:
                name = pod["metadata"]["name"]
                if name not in self.created:
                    continue
                status = pod.get("status") or {}
                if status.get("phase") == "Running" and name not in self.running:
                    self.running[name] = now
                    self.node[name] = (pod.get("spec") or {}).get("nodeName")
                if pod["metadata"].get("deletionTimestamp") and name not in self.ours:
                    self.evicted.add(name)
                if status.get("reason") == "DeviceDestroyed":
                    self.destroyed.add(name)

    def stop(self):
        self.stopping.set()
        self.thread.join(5)


STAMP = re.compile(r"^\w+ \d+ \w+ \d{4}\s+(\d\d):(\d\d):(\d\d) [+-]\d{4} \(")


def breakdown(text):
    """{(play, task): seconds over all rounds} from a log written with ansible.posix.profile_tasks
    (its banner line after each TASK gives the time the task started)."""
    play, task, last, pending, out = None, None, None, None, {}
    for line in text.splitlines():
        if line.startswith("PLAY RECAP"):
            task = last = pending = None    # the time until the next round is no task's
        elif line.startswith("PLAY ["):
            play = line[6:line.rindex("]")]
        elif line.startswith("TASK ["):
            pending = line[6:line.rindex("]")]
        else:
            stamp = STAMP.match(line)
            if not stamp:
                continue
            now = int(stamp.group(1)) * 3600 + int(stamp.group(2)) * 60 + int(stamp.group(3))
            if last is not None and task is not None and 0 <= now - last < 3600:
                out[task] = out.get(task, 0) + now - last
            task, last = ((play, pending), now) if pending else (None, None)
    return out


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def run(plane_root, name, settings, pods, tail, workdir, profile=False):
    """One loop run on a control plane of its own; returns its numbers."""
    with running(plane_root) as cluster:
        return _run(cluster, name, settings, pods, tail, workdir, profile)


def _run(cluster, name, settings, pods, tail, workdir, profile):
    """The loop run on `cluster`; stops what it started there (the rulebook, the servers)."""
    stand_ins = cluster.stand_ins
    proc = log = watch = None
    servers = []
    try:
        kubeconfig = cluster.service_account_kubeconfig(
            workdir / "demand.kubeconfig",
            "demand",
            ROLLOUT_RBAC + [os.path.join(RBAC, f) for f in ("plan.yml", "demand.yml")],
        )
        env = client_env(kubeconfig, workdir, cluster.control_plane.bin_dir)
        fleet = Fleet(workdir, cluster, env)
        for i in range(NODES):
            node = "gpu-%d" % i
            sock = str(workdir / ("%s.sock" % node))
            all_balanced(
                fleet.add(node, GPUS, pod_resources=sock, mig_node_pod_resources_socket=sock),
                str(fleet.dir / node),
            )
            servers.append(PodResourcesServer(sock, node_source(stand_ins.view, node)).start())
        cluster.seed(*plugin_daemonsets())
        cluster.wait_for(
            lambda: all(
                (cluster.get("Node", "gpu-%d" % i)["status"].get("allocatable") or {}).get(
                    "nvidia.com/mig-3g.40gb"
                )
                == "2"
                for i in range(NODES)
            ),
            "the device plugin to advertise every node",
            timeout=120,
        )
        if profile:
            fleet.env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.profile_tasks"
        round_dir = workdir / "rounds"
        loop_vars = workdir / "loop-vars.yml"
        loop_vars.write_text(yaml.safe_dump(dict(settings, gpuops_mig_round_dir=str(round_dir))))
        log = open(str(workdir / "rulebook.log"), "w")
        proc = subprocess.Popen(
            [os.path.join(BIN, "ansible-rulebook"), "-i", inventory_dir(fleet, workdir),
             "--rulebook", "gpuops.mig.mig_demand", "--vars", str(loop_vars), "-v"],
            env=fleet.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir),
        )
        time.sleep(15)  # the source's first list and watch (no demand yet: no round)
        watch = Watch(cluster)
        began = time.time()
        ends = []   # (time to delete, name)
        pending = list(pods)
        deadline = None
        while True:
            now = time.time() - began
            while pending and pending[0][0] <= now:
                _at, pod, profile, runs = pending.pop(0)
                watch.created[pod] = time.time()
                cluster.seed(seed.pod(pod, limits={"nvidia.com/mig-%s" % profile: 1}), wait=False)
                ends.append((pod, runs))
            for pod, runs in list(ends):
                started = watch.running.get(pod)
                if started and time.time() - started >= runs:
                    watch.ours.add(pod)
                    cluster.delete("Pod", pod, "default", grace_period=0)
                    ends.remove((pod, runs))
            if not pending and deadline is None:
                deadline = time.time() + tail
            if deadline and (time.time() >= deadline
                             or all(p in watch.running for p in watch.created)):
                break
            if proc.poll() is not None:
                raise SystemExit("ansible-rulebook ended: see %s" % log.name)
            time.sleep(0.5)
        watch.stop()
        out = summary(name, settings, pods, watch, rounds(round_dir))
        if profile:
            log.flush()
            out["breakdown"] = sorted(
                ([play, task, secs] for (play, task), secs in
                 breakdown((workdir / "rulebook.log").read_text()).items()),
                key=lambda row: -row[2])
        return out
    finally:
        if watch is not None:
            watch.stop()
        if proc is not None:
            stop_rulebook(proc, workdir)
        if log is not None:
            log.close()
        for server in servers:
            server.stop()


ROUND_ID = re.compile(r"^(\d{8}T\d{6}Z)-")


def round_starts(reports):
    """[(start time, applied nodes)] of the rounds that changed nodes; the round's ID begins with
    the second it started (gpuops.mig.mig_rollout_identity)."""
    out = []
    for report in reports:
        stamp = ROUND_ID.match(str(report.get("round") or ""))
        if stamp and report.get("applied"):
            start = calendar.timegm(time.strptime(stamp.group(1), "%Y%m%dT%H%M%SZ"))
            out.append((start, set(report["applied"])))
    return sorted(out, key=lambda r: r[0])


def serving_round(starts, created, running, node):
    """When the round that made the pod's device began: the last round that changed its node,
    started after the pod was created (to the second) and before it ran; None without one."""
    found = [s for s, nodes in starts if node in nodes and created - 1 <= s <= running]
    return found[-1] if found else None


def summary(name, settings, pods, watch, reports):
    waits, reshaped, before, during = [], [], [], []
    starts = round_starts(reports)
    for _at, pod, profile, _runs in pods:
        if pod in watch.running:
            waits.append(watch.running[pod] - watch.created[pod])
            if profile in LACKING:
                reshaped.append(waits[-1])
                start = serving_round(starts, watch.created[pod], watch.running[pod],
                                      watch.node.get(pod))
                if start is not None:
                    before.append(max(0.0, start - watch.created[pod]))
                    during.append(watch.running[pod] - max(start, watch.created[pod]))
    held = {}
    for report in reports:
        for node in report.get("held") or []:
            why = "; ".join((report.get("nodes") or {}).get(node, {}).get("reasons") or [])
            held.setdefault(why or "(no reason given)", []).append(node)
    return {
        "settings": name,
        "values": settings,
        "pods": len(pods),
        "served": len(waits),
        "never_served": sorted(p for _a, p, _pr, _r in pods if p not in watch.running),
        "all": [percentile(waits, 0.5), percentile(waits, 0.95), max(waits or [0])],
        "reshaped": [percentile(reshaped, 0.5), percentile(reshaped, 0.95),
                     max(reshaped or [0]), len(reshaped)],
        # Of those served by a round's change: creation to that round's start (the settle window,
        # rounds before it, capacity held by running pods), and its start to Running.
        "reshaped_before_round": [percentile(before, 0.5), percentile(before, 0.95),
                                  max(before or [0]), len(before)],
        "reshaped_round_to_running": [percentile(during, 0.5), percentile(during, 0.95),
                                      max(during or [0]), len(during)],
        "evicted": sorted(watch.evicted),
        "device_destroyed": sorted(watch.destroyed),
        "rounds": len(reports),
        "applied": sum(len(r.get("applied") or []) for r in reports),
        "held": held,
        "failed_rounds": sum(1 for r in reports if r.get("failed")),
    }


def seconds(value):
    return "-" if value is None else "%.0f s" % value


def table(results):
    rows = [
        "| settings | served (of N) | never served | creation→Running p50 / p95 / max "
        "| profile created: p50 / p95 / max (pods) | evicted | rounds | nodes applied "
        "| nodes held | failed rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows.append(
            "| %s | %d (of %d) | %d | %s | %s (%d) | %d | %d | %d | %d | %d |"
            % (
                r["settings"], r["served"], r["pods"], len(r["never_served"]),
                " / ".join(seconds(v) for v in r["all"]),
                " / ".join(seconds(v) for v in r["reshaped"][:3]), r["reshaped"][3],
                len(r["evicted"]) + len(r["device_destroyed"]), r["rounds"], r["applied"],
                sum(len(v) for v in r["held"].values()), r["failed_rounds"],
            )
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--tail", type=float, default=600.0,
                        help="seconds to wait after the last arrival for pods still pending")
    parser.add_argument("--settings", default="defaults,responsive")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="time the rounds' tasks (ansible.posix.profile_tasks) and print "
                        "where the seconds go")
    args = parser.parse_args(argv)
    names = [n for n in args.settings.split(",") if n]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or args.pods < 1 or args.minutes <= 0 or args.tail < 0:
        raise SystemExit("--settings takes %s; --pods, --minutes and --tail must be positive"
                         % ",".join(SETTINGS))
    if not shutil.which("java"):
        raise SystemExit("ansible-rulebook needs Java 17: install openjdk-17-jre-headless")
    command = " ".join([os.path.relpath(sys.executable, REPO), "bench/bench_demand_loop.py"]
                       + list(sys.argv[1:] if argv is None else argv))
    pods = trace(args.pods, args.minutes, random.Random(args.seed))
    began, load = time.time(), os.getloadavg()[0]
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-demand-loop-"))
    results = []
    try:
        for name in names:
            workdir = root / name
            workdir.mkdir()
            print("%s: %d pods over %.0f min ..." % (name, len(pods), args.minutes), flush=True)
            results.append(run(root / ("plane-" + name), name, SETTINGS[name], pods, args.tail,
                               workdir, args.profile))
            print("  " + json.dumps(dict((k, v) for k, v in results[-1].items()
                                         if k != "breakdown")), flush=True)
    finally:
        if args.keep:
            print("Kept %s" % root)
        else:
            shutil.rmtree(str(root), ignore_errors=True)
    print("\n".join(table(results)))
    for r in results:
        print("%s, pods whose profile was created, served by a round's change (%d): creation to "
              "the round's start p50/p95/max %s; the round's start to Running %s" % (
                  r["settings"], r["reshaped_round_to_running"][3],
                  " / ".join(seconds(v) for v in r["reshaped_before_round"][:3]),
                  " / ".join(seconds(v) for v in r["reshaped_round_to_running"][:3])))
    for r in results:
        for why, nodes in sorted(r["held"].items()):
            print("%s: held %d time(s): %s" % (r["settings"], len(nodes), why))
    for r in results:
        if "breakdown" in r:
            plays = {}
            for play, _task, secs in r["breakdown"]:
                plays[play] = plays.get(play, 0) + secs
            print("%s, seconds per play over %d round(s): %s" % (
                r["settings"], r["rounds"], "; ".join(
                    "%s %d" % (p, s) for p, s in sorted(plays.items(), key=lambda i: -i[1]))))
            print("%s, the slowest tasks: %s" % (r["settings"], "; ".join(
                "%s %d" % (t, s) for _p, t, s in r["breakdown"][:15])))
    print("Produced by `%s` in %.0f s (Python %s, %s, %d CPUs, load average %.1f at the start, "
          "%.1f at the end)." % (command, time.time() - began, platform.python_version(),
                                 platform.machine(), os.cpu_count() or 0, load,
                                 os.getloadavg()[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "trace": pods, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
