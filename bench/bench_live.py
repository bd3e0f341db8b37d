# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Live reconfiguration against the whole-node drain, side by side in one run: pods evicted and the cordoned
window per node.

A fleet of N simulated H100 nodes (the integration tests' Fleet on the real test cluster, kwok
nodes, one PodResources gRPC server per node) is rolled out to three 2g.20gb devices; then three
ReplicaSet pods hold one device each, and the fleet changes to 2g.20gb x2 + 3g.40gb x1, which
keeps two of the three devices. Once with mig_node_drain=node, once with devices, each on a fresh
cluster. A watcher polls every node's spec.unschedulable every 50 ms: the window is the time from
cordon to uncordon. kwok ends an evicted pod as soon as the API server marks it terminating (no
container to stop), so the window here is the workflow's own cost plus the API's graceful
deletion; on a real node each evicted pod adds its container's termination time, and a drain
blocked by a PodDisruptionBudget adds its wait.

Usage (from the repository root, after scripts/setup.sh):
    .venv/bin/python bench/bench_live.py [--nodes 4] [--write-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "simulator"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tests.integration.test_roles import Fleet  # noqa: E402
from tests.support.controlplane.cluster import running  # noqa: E402
from tests.support.kubeapi import seed  # noqa: E402
from tests.support.podresources_server import PodResourcesServer, node_source  # noqa: E402
from bench_fleet import kube_env  # noqa: E402  (the client environment, as bench_fleet sets it)

THREE = [{"gpus": "all", "devices": {"2g.20gb": 3}}]
KEEP_TWO = [{"gpus": "all", "devices": {"2g.20gb": 2, "3g.40gb": 1}}]
FAST = {"mig_node_validate_delay": "1"}
DOCS = os.path.join(REPO, "docs", "rollout.md")
MARK_BEGIN = "<!-- bench_live results begin -->"
MARK_END = "<!-- bench_live results end -->"


class Windows(threading.Thread):
    """Polls the nodes' spec.unschedulable; windows[node] = seconds cordoned (summed)."""

    def __init__(self, api, nodes):
        super().__init__(daemon=True)
        self.api, self.nodes = api, nodes
        self.windows = dict((n, 0.0) for n in nodes)
        self.since = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            now = time.monotonic()
            for name in self.nodes:
                cordoned = bool(self.api.get("Node", name)["spec"].get("unschedulable"))
                if cordoned and name not in self.since:
                    self.since[name] = now
                elif not cordoned and name in self.since:
                    self.windows[name] += now - self.since.pop(name)
            time.sleep(0.05)


def one_mode(mode, nodes, scratch):
    scratch.mkdir()
    with running(scratch / "cluster") as api:
        kubeconfig = api.service_account_kubeconfig(
            scratch / "rollout.kubeconfig", "rollout",
            [os.path.join(REPO, "rbac", f) for f in ("rollout.yml", "fleet-report.yml",
                                                     "device-plugin.yml")])
        (scratch / "client").mkdir()
        fleet = Fleet(scratch, api, kube_env(kubeconfig, scratch / "client"))
        names = ["node-%02d" % i for i in range(nodes)]
        with contextlib.ExitStack() as stack:
            for name in names:
                sock = str(scratch / ("%s.sock" % name))
                fleet.add(name, "1xH100-SXM5-80GB", pod_resources=sock, mig_node_layouts=THREE,
                          mig_node_pod_resources_socket=sock)
                stack.enter_context(PodResourcesServer(sock, node_source(api.stand_ins.view, name)))
            first = fleet.run("playbooks/site.yml", FAST)
            if first.returncode != 0:
                raise SystemExit("the first rollout failed:\n" + first.stdout[-4000:])
            for name in names:
                api.seed(*[seed.pod("%s-train-%d" % (name, i), node=name, namespace="ml",
                                    labels={"app": name}, owner=("ReplicaSet", "train-" + name),
                                    limits={"nvidia.com/mig-2g.20gb": 1})
                           for i in range(3)])
            api.stand_ins.sync()
            before = set(p["metadata"]["uid"] for p in api.list("Pod", "ml"))
            for name in names:
                fleet.hosts[name]["mig_node_layouts"] = KEEP_TWO
            watcher = Windows(api, names)
            watcher.start()
            started = time.monotonic()
            proc = fleet.run("playbooks/site.yml", dict(FAST, mig_node_drain=mode))
            seconds = time.monotonic() - started
            watcher.stop.set()
            watcher.join()
            if proc.returncode != 0:
                raise SystemExit("the %s rollout failed:\n%s" % (mode, proc.stdout[-4000:]))
            after = set(p["metadata"]["uid"] for p in api.list("Pod", "ml"))
        windows = list(watcher.windows.values())
        return {"mode": mode, "pods": len(before), "evicted": len(before - after), "rollout": seconds,
                "window_mean": statistics.mean(windows), "window_max": max(windows)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuops-bench-live-") as tmp:
        rows = [one_mode(mode, args.nodes, pathlib.Path(tmp) / mode) for mode in ("node", "devices")]
    lines = ["| `mig_node_drain` | pods running | pods evicted | cordoned window per node, mean (max) | rollout |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| `%s` | %d | %d | %.1f s (%.1f s) | %.1f s |" % (
            r["mode"], r["pods"], r["evicted"], r["window_mean"], r["window_max"], r["rollout"]))
    text = "\n".join(lines)
    command = ".venv/bin/python bench/bench_live.py --nodes %d" % args.nodes
    where = "%s, %s, %d CPUs" % (platform.python_version(), platform.machine(), os.cpu_count() or 0)
    print(text)
    if args.write_docs:
        block = "%s\n%s\n\n`%s` (Python %s; %s)\n%s" % (
            MARK_BEGIN, text, command, where, time.strftime("%Y-%m-%d"), MARK_END)
        docs = pathlib.Path(DOCS).read_text()
        start, end = docs.index(MARK_BEGIN), docs.index(MARK_END) + len(MARK_END)
        pathlib.Path(DOCS).write_text(docs[:start] + block + docs[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
