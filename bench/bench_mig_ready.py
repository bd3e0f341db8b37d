# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""How long a joining GPU node stays behind the MIG-ready taint: from the Node's registration
(its create request) to the taint lifted, with the watcher already running and settled.

A measurement on the real API server, not a model: the test control plane
(tests/support/controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok), the NVIDIA stand-ins (device plugin and GFD reading simulated GPUs, their pods made by the
real DaemonSet controller), and ansible-rulebook running the collection's source and rulebook
gpuops.mig.mig_ready (each decision is playbooks/mig_ready.yml), as
tests/integration/test_mig_ready.py runs them. Unlike that test, the watcher is started, and has
lifted the taint of one warm-up node, before any measured node registers; between repeats the
nodes are deleted and the watcher is left idle again.

Cases:
  a  the layout is in place at registration (a bootstrapped image): N nodes join at once;
  b  the layout is applied after registration (the boot-time restore finishing late): the node
     joins with one whole GPU, and once the gate has decided it is not ready, the layout is
     applied and the device plugin and GFD pods restarted;
  c  the node needs the workflow: it joins with MIG off and nothing on the host applies the
     layout; the watcher (gpuops_mig_ready_converge_seconds small) names it overdue, and, as the
     inventory names it as a reachable simulated host, runs the node workflow
     (gpuops.mig.mig_node) on it, which lifts the taint once the layout is validated.

Usage (from the repository root, after scripts/setup.sh and scripts/control-plane.sh; needs
Java 17 for ansible-rulebook):
    .venv/bin/python bench/bench_mig_ready.py [--nodes 1,8] [--repeat 3] [--converge 10]
        [--cases abc] [--keep]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
for path in (
    os.path.join(REPO, "tests", "integration"),
    os.path.join(REPO, "simulator"),
    os.path.join(REPO, ".build", "collections"),
    REPO,
):
    sys.path.insert(0, path)

import gpuops_mig_sim as sim  # noqa: E402
from test_eda_loop import stop_rulebook  # noqa: E402
from test_mig_ready import (  # noqa: E402
    TAINT,
    apply_layout,
    condition,
    plugin_daemonsets,
    restart_plugins,
    start_watcher,
    tainted,
)
from test_roles import Fleet  # noqa: E402
from tests.integration.conftest import RBAC, ROLLOUT_RBAC, client_env  # noqa: E402
from tests.support.controlplane.cluster import running  # noqa: E402
from tests.support.kubeapi import seed  # noqa: E402

BIN = os.path.dirname(os.path.abspath(sys.executable))
GPUS = "1xH100-SXM5-80GB"
LAYOUTS = [{"gpus": "all", "devices": {"1g.10gb": 7}}]
# The node pool: nodes register with its label only (no nvidia.com/mig.config label), so a node
# whose taint is lifted is no longer held.
POOLS = {"h100-1g": {"node_labels": {"pool": "h100-1g"}, "layouts": LAYOUTS, "gpus": 1}}
MIG_1G = "nvidia.com/mig-1g.10gb"
LABELS = {"pool": "h100-1g", "nvidia.com/gpu.present": "true"}
WAIT = 300  # seconds a node may take before the bench gives up on it


class Watcher(object):
    """ansible-rulebook with gpuops.mig.mig_ready, run as the ServiceAccount rbac/ready.yml and
    the rollout's rules make, in a directory of its own (``workdir``)."""

    def __init__(self, cluster, kubeconfig, workdir, converge, workflow_hosts=()):
        self.cluster, self.workdir = cluster, workdir
        workdir.mkdir()
        env = client_env(kubeconfig, workdir, cluster.control_plane.bin_dir)
        self.fleet = Fleet(workdir, cluster, env)
        # The hosts the workflow may reach: simulated hosts (connection local, their GPUs in
        # fleet/<name>.json, simulator/bin first on PATH: group_vars/all/simulation.yml).
        hosts = dict((name, {"mig_node_layouts": LAYOUTS}) for name in workflow_hosts)
        began = time.time()
        self.proc, self.log = start_watcher(workdir, self.fleet.env, POOLS, converge, hosts,
                                            self.fleet.dir / "group_vars")
        # Settled: the watcher has lifted the taint of a warm-up node (its first playbook run is
        # behind it) and runs nothing.
        name = "warmup-" + workdir.name
        node = Node(self, name, applied=True)
        node.register()
        node.wait_lifted(self, "the watcher to lift the warm-up node's taint")
        node.delete()
        self.wait_idle()
        self.started = time.time() - began

    def busy(self):
        """Whether a playbook the watcher started is running (ansible-runner's private data
        directory lies under the watcher's TMPDIR, inside workdir)."""
        marker = str(self.workdir).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if marker in cmdline and b"ansible-playbook" in cmdline:
                return True
        return False

    def wait_idle(self, quiet=3.0):
        """Until no playbook has run for ``quiet`` seconds (past the source's 2 s settle)."""
        since = time.time()
        deadline = since + WAIT
        while time.time() - since < quiet:
            if self.proc.poll() is not None:
                raise SystemExit("ansible-rulebook ended: see %s" % self.log.name)
            if time.time() > deadline:
                raise SystemExit("the watcher never went idle: see %s" % self.log.name)
            if self.busy():
                since = time.time()
            time.sleep(0.2)

    def stop(self):
        stop_rulebook(self.proc, self.workdir)
        self.log.close()


class Seen(object):
    """When the harness's watch of Nodes first saw each Node advertise the pool's layout (the
    device plugin's allocatable and GFD's count label), cordoned (the node workflow holding it),
    and without the taint."""

    def __init__(self, cluster):
        self.advertised, self.cordoned, self.lifted = {}, {}, {}
        cluster.on("modified", self._seen, kind="Node")

    def _seen(self, event):
        now, node = time.time(), event.obj
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        if allocatable.get(MIG_1G) == "7" and labels.get(MIG_1G + ".count") == "7":
            self.advertised.setdefault(name, now)
        if (node.get("spec") or {}).get("unschedulable"):
            self.cordoned.setdefault(name, now)
        if not tainted(node):
            self.lifted.setdefault(name, now)


class Node(object):
    """One joining node and its simulated GPUs (fleet/<name>.json of the watcher's fleet)."""

    seen = None

    def __init__(self, watcher, name, applied):
        self.cluster, self.name = watcher.cluster, name
        self.state = watcher.fleet.state_path(name)
        if applied:  # the boot-time restore ran before kubelet
            apply_layout(self.state, 7)
        else:  # MIG off: one whole GPU (with the driver's /proc where root may make device nodes)
            root = str(watcher.fleet.dir / name) if os.geteuid() == 0 else None
            sim.create_state(self.state, GPUS, seed=name, root=root)
        self.registered = None

    def register(self):
        self.registered = time.time()  # the kubelet's create request
        self.cluster.seed(
            seed.node(self.name, LABELS, taints=[TAINT], nvml_state=self.state), wait=False
        )

    def lifted(self):
        return Node.seen.lifted.get(self.name)

    def since(self, what, until=None):
        """Seconds from ``what`` (a time, or a Seen record's name) to ``until`` (a Seen
        record's name, the lift by default)."""
        start = getattr(Node.seen, what)[self.name] if isinstance(what, str) else what
        return getattr(Node.seen, until or "lifted")[self.name] - start

    def wait_lifted(self, watcher, what=None):
        self.cluster.wait_for(
            lambda: self.lifted() or watcher.proc.poll() is not None,
            what or "the taint of %s lifted" % self.name,
            timeout=WAIT,
            interval=0.05,
        )
        if self.lifted() is None:
            raise SystemExit("ansible-rulebook ended: see %s" % watcher.log.name)
        return self.lifted() - self.registered

    def ready_condition(self):
        """The MIG-ready condition once it says MIGLayoutReady (written just after the lift)."""
        return self.cluster.wait_for(
            lambda: (condition(self.cluster.get("Node", self.name)) or {}).get("reason")
            == "MIGLayoutReady"
            and condition(self.cluster.get("Node", self.name)),
            "the MIG-ready condition of %s" % self.name,
            timeout=30,
        )

    def delete(self):
        self.cluster.delete("Node", self.name)
        for pod in self.cluster.list("Pod", field_selector="spec.nodeName=" + self.name):
            meta = pod["metadata"]
            self.cluster.delete("Pod", meta["name"], meta["namespace"], grace_period=0)


def case_a(cluster, kubeconfig, root, counts, repeat):
    """{n: [{metric: seconds}]}: n nodes with the layout in place join at once."""
    watcher = Watcher(cluster, kubeconfig, root / "case-a", converge=3600)
    out = {}
    try:
        for count in counts:
            out[count] = []
            for run in range(repeat):
                nodes = [
                    Node(watcher, "a%d-r%d-n%d" % (count, run, i), True) for i in range(count)
                ]
                for node in nodes:
                    node.register()
                for node in nodes:
                    node.wait_lifted(watcher)
                    node.ready_condition()
                    out[count].append(
                        {
                            "registered": node.since(node.registered),
                            "advertised": node.since("advertised"),
                            "to_advertised": node.since(node.registered, "advertised"),
                        }
                    )
                for node in nodes:
                    node.delete()
                watcher.wait_idle()
                print(
                    "  a: %d node(s) at once, run %d: registration -> lifted %s s"
                    % (
                        count,
                        run + 1,
                        " ".join("%.1f" % m["registered"] for m in out[count][-count:]),
                    ),
                    flush=True,
                )
    finally:
        watcher.stop()
    return out, watcher.started


def case_b(cluster, kubeconfig, root, repeat):
    """[{metric: seconds}]: the layout comes after the gate's first decision (not ready), the
    device plugin and GFD restarted."""
    watcher = Watcher(cluster, kubeconfig, root / "case-b", converge=3600)
    out = []
    try:
        for run in range(repeat):
            node = Node(watcher, "b-r%d" % run, False)
            node.register()
            cluster.wait_for(
                lambda n=node: condition(cluster.get("Node", n.name)),
                "the gate's first decision on %s" % node.name,
                timeout=WAIT,
            )
            verdict = condition(cluster.get("Node", node.name))
            assert verdict["reason"] == "MIGLayoutNotAdvertised", verdict
            applied = time.time()
            apply_layout(node.state, 7)
            restart_plugins(cluster, node.name)
            node.wait_lifted(watcher)
            node.ready_condition()
            out.append(
                {
                    "registered": node.since(node.registered),
                    "applied": node.since(applied),
                    "advertised": node.since("advertised"),
                }
            )
            node.delete()
            watcher.wait_idle()
            print(
                "  b: run %d: registration -> lifted %.1f s, applied -> lifted %.1f s"
                % (run + 1, out[-1]["registered"], out[-1]["applied"]),
                flush=True,
            )
    finally:
        watcher.stop()
    return out, watcher.started


def case_c(cluster, kubeconfig, root, repeat, converge):
    """[{metric: seconds}]: the node needs the workflow; the inventory names it (a simulated
    host)."""
    names = ["c-r%d" % run for run in range(repeat)]
    watcher = Watcher(
        cluster, kubeconfig, root / "case-c", converge=converge, workflow_hosts=names
    )
    out = []
    try:
        for name in names:
            node = Node(watcher, name, False)
            node.register()
            node.wait_lifted(watcher)
            # The workflow lifted it: its condition, its labels, the layout on the host.
            verdict = node.ready_condition()
            assert "validated by gpuops.mig run" in verdict["message"], verdict
            labels = cluster.get("Node", name)["metadata"].get("labels") or {}
            assert labels.get("nvidia.com/mig.config.state") == "success", labels
            devices = sim.load_state(node.state)["gpus"][0]["gpu_instances"]
            assert len(devices) == 7, "%s: %d GPU instances" % (name, len(devices))
            out.append(
                {
                    "registered": node.since(node.registered),
                    "to_cordon": node.since(node.registered, "cordoned"),
                    "cordoned": node.since("cordoned"),
                }
            )
            node.delete()
            watcher.wait_idle()
            print(
                "  c: %s: registration -> lifted %.1f s (cordoned after %.1f s)"
                % (name, out[-1]["registered"], out[-1]["to_cordon"]),
                flush=True,
            )
    finally:
        watcher.stop()
    return out, watcher.started


def row(case, what, records, metric):
    values = [r[metric] for r in records]
    return "| %s | %s | %d | %.1f s | %.1f s |" % (
        case,
        what,
        len(values),
        statistics.median(values),
        max(values),
    )


def table(results, converge):
    lines = [
        "| case | from -> to | nodes measured | median | max |",
        "|---|---|---|---|---|",
    ]
    for count, records in (results.get("a") or ({}, 0))[0].items():
        case = "a: layout in place at registration, %d node(s) joining at once" % count
        lines.append(row(case, "registration -> taint lifted", records, "registered"))
        lines.append(row(case, "registration -> layout advertised", records, "to_advertised"))
        lines.append(row(case, "layout advertised -> taint lifted", records, "advertised"))
    if "b" in results:
        records = results["b"][0]
        case = "b: layout applied after registration (after the gate's first decision)"
        lines.append(
            row(case, "layout applied, plugin restarted -> taint lifted", records, "applied")
        )
        lines.append(row(case, "layout advertised -> taint lifted", records, "advertised"))
        lines.append(row(case, "registration -> taint lifted", records, "registered"))
    if "c" in results:
        records = results["c"][0]
        case = (
            "c: needs the workflow (gpuops_mig_ready_converge_seconds %g, the watcher runs "
            "mig_node)" % converge
        )
        lines.append(row(case, "registration -> taint lifted", records, "registered"))
        lines.append(
            row(case, "registration -> cordoned (overdue, workflow started)", records, "to_cordon")
        )
        lines.append(row(case, "cordoned -> taint lifted (the workflow)", records, "cordoned"))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument(
        "--nodes", default="1,8", help="case a: how many nodes join at once, comma-separated (1,8)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (3)")
    parser.add_argument(
        "--converge", type=float, default=10, help="case c: gpuops_mig_ready_converge_seconds (10)"
    )
    parser.add_argument("--cases", default="abc", help="which cases to run (abc)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the working directory (logs, inventories)"
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.nodes.split(",") if n.strip()]
    if not shutil.which("java"):
        raise SystemExit("ansible-rulebook needs Java 17: install openjdk-17-jre-headless")
    command = " ".join(
        [os.path.relpath(sys.executable, REPO), "bench/bench_mig_ready.py"]
        + list(sys.argv[1:] if argv is None else argv)
    )
    began, load = time.time(), os.getloadavg()[0]
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench-mig-ready-"))
    results = {}
    with running(root / "control-plane") as cluster:
        Node.seen = Seen(cluster)
        cluster.seed(*plugin_daemonsets())
        kubeconfig = cluster.service_account_kubeconfig(
            root / "ready.kubeconfig", "ready", ROLLOUT_RBAC + [os.path.join(RBAC, "ready.yml")]
        )
        print(
            "control plane up in %.0f s; working in %s" % (time.time() - began, root), flush=True
        )
        if "a" in args.cases:
            results["a"] = case_a(cluster, kubeconfig, root, counts, args.repeat)
        if "b" in args.cases:
            results["b"] = case_b(cluster, kubeconfig, root, args.repeat)
        if "c" in args.cases:
            results["c"] = case_c(cluster, kubeconfig, root, args.repeat, args.converge)
        if cluster.errors:
            raise SystemExit("errors in the harness's hooks: %r" % cluster.errors)

    print(
        "\nMIG-ready gate, registration to taint lifted (the watcher running and settled "
        "before the nodes register):"
    )
    print("\n".join(table(results, args.converge)))
    print(
        "\nWatcher start to settled (ansible-rulebook up, a warm-up node's taint lifted), "
        "not in the numbers above: %s."
        % ", ".join("%s %.0f s" % (case, results[case][1]) for case in sorted(results))
    )
    print(
        "Produced by `%s` in %.0f s (Python %s, %s, %d CPUs, load average %.1f at the start)."
        % (
            command,
            time.time() - began,
            platform.python_version(),
            platform.machine(),
            os.cpu_count() or 0,
            load,
        )
    )
    if args.keep:
        print("Kept %s" % root)
    else:
        shutil.rmtree(str(root), ignore_errors=True)


if __name__ == "__main__":
    main()
