# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What a converged fleet costs: playbooks/site.yml against N simulated hosts, next to a ping sweep.

Hosts are simulated GPU hosts with connection local (examples/simulated-fleet's
group_vars), registered as nodes of the real test cluster (tests/support/controlplane, kwok
nodes), as in the integration tests; the collection runs as the ServiceAccount bound to
rbac/rollout.yml and fleet-report.yml. Each host carries its simulation wiring (the environment that
points it at its simulated GPUs) as plain values: the example's templated wiring
(lookups and chained variables) costs every task on every host about 25 ms of
templating that no real inventory has, and the bare ping has no environment at
all. --example-wiring keeps the example's templates.

For each N, in one run: the first rollout (every node changes), then a bare
`ansible -m ping` of the hosts and a converged re-run, in turn, --repeat times
(medians reported), and with --drift K a rollout after K nodes were given another
layout (the other N - K are converged: they should cost their preview only, not
batches); the ratios of the rollout and the re-run to ping, and the controller's
peak RSS during the converged re-runs (getrusage of the children: the largest
single process, i.e. ansible-playbook itself, not the sum over its forks).

Usage (from the repository root, after scripts/setup.sh):
    .venv/bin/python bench/bench_fleet.py [--hosts 8,32,64] [--serial 25%] [--forks 16] [--drift 4] [--repeat 3]
        [--write-docs] [--profile] [--example-wiring]

--write-docs replaces the results section of docs/rollout.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import pathlib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "simulator"))

from tests.integration.test_roles import Fleet  # noqa: E402  (the integration tests' fleet, reused)
from tests.support.controlplane.cluster import running  # noqa: E402

BIN = os.path.dirname(sys.executable)
LAYOUT = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
DRIFTED = [{"gpus": "all", "devices": {"2g.20gb": 3}}]
DOCS = os.path.join(REPO, "docs", "rollout.md")
MARK_BEGIN = "<!-- bench_fleet results begin -->"
MARK_END = "<!-- bench_fleet results end -->"


def kube_env(kubeconfig, scratch):
    env = dict(os.environ)
    env.update(KUBECONFIG=kubeconfig, K8S_AUTH_KUBECONFIG=kubeconfig,
               KUBECACHEDIR=str(scratch / "kube-cache"), TMPDIR=str(scratch),
               PATH=BIN + os.pathsep + env.get("PATH", ""))
    return env


def timed(cmd, env):
    """(seconds, peak RSS in MiB of the children, completed process) for one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit("%s failed:\n%s" % (" ".join(cmd), (proc.stdout + proc.stderr)[-4000:]))
    return seconds, max(peak, before) / 1024.0, proc


def plain_wiring(fleet, name):
    """What examples/simulated-fleet/group_vars/all/simulation.yml templates for the host, as plain values."""
    state, root = fleet.state_path(name), str(fleet.dir / name)
    return {
        "ansible_python_interpreter": sys.executable,
        "gpuops_mig_environment": {
            "GPUOPS_MIG_SIMULATE": state,
            "PATH": os.pathsep.join([os.path.join(REPO, "simulator", "bin"), BIN, fleet.env["PATH"]]),
            "SYSTEMD_UNIT_PATH": os.path.join(root, "etc", "systemd", "system"),
        },
        "mig_node_persist_root": root,
        "mig_node_reboot_boot_time_command": "%s boot-id %s" % (os.path.join(REPO, "tools", "mig-sim"), state),
    }


@contextlib.contextmanager
def simulated_fleet(hosts, forks, prefix, example_wiring=False):
    """A Fleet of `hosts` simulated one-H100 hosts (gpu-000, ...) with LAYOUT declared, nodes of
    a test cluster that runs until the block ends, in a scratch directory removed then."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "scratch").mkdir()
        with running(tmp / "cluster") as cluster:
            kubeconfig = cluster.service_account_kubeconfig(
                tmp / "rollout.kubeconfig", "rollout",
                [os.path.join(REPO, "rbac", f) for f in ("rollout.yml", "fleet-report.yml")])
            fleet = Fleet(tmp, cluster, kube_env(kubeconfig, tmp / "scratch"))
            fleet.env["ANSIBLE_FORKS"] = str(forks)
            for i in range(hosts):
                name = "gpu-%03d" % i
                fleet.add(name, "1xH100-SXM5-80GB", mig_node_layouts=LAYOUT,
                          **({} if example_wiring else plain_wiring(fleet, name)))
            yield fleet


def measure(hosts, serial, forks, profile=False, drift=0, example_wiring=False, repeat=3):
    with simulated_fleet(hosts, forks, "bench-fleet-", example_wiring) as fleet:
        inventory = fleet.inventory()
        extra = ["-e", '{"gpuops_mig_serial": "%s", "gpuops_mig_deploy_device_plugin": false, '
                       '"mig_node_validate": false}' % serial]
        ping_cmd = [os.path.join(BIN, "ansible"), "-i", inventory, "gpu_nodes", "-m", "ping"]
        site = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", "site.yml")]
        first = timed(site + extra, fleet.env)[0]
        env = dict(fleet.env)
        if profile:  # where the re-run's time goes, per task (printed, not part of the results)
            env.update(ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", PROFILE_TASKS_TASK_OUTPUT_LIMIT="40")
        # A ping sweep, then the converged re-run, `repeat` times in turn: the medians (a single
        # ping sweep on a shared 2-core machine varies by a fifth between runs).
        pings, agains, rss = [], [], 0.0
        for _round in range(repeat):
            pings.append(timed(ping_cmd, fleet.env)[0])
            seconds, peak, proc = timed(site + extra, env)
            agains.append(seconds)
            rss = max(rss, peak)
            if profile:
                print(proc.stdout[proc.stdout.rfind("PLAY RECAP"):], flush=True)
            if not re.search(r"changed=0 ", proc.stdout) or re.search(r"changed=[1-9]", proc.stdout):
                raise SystemExit("the re-run changed something:\n" + proc.stdout[-3000:])
        ping, again = statistics.median(pings), statistics.median(agains)
        drifted = None
        if drift:
            for i in range(min(drift, hosts)):
                fleet.hosts["gpu-%03d" % i]["mig_node_layouts"] = DRIFTED
            fleet.inventory()   # rewritten in place
            drifted, _rss, proc = timed(site + extra, env)
            if profile:
                print(proc.stdout[proc.stdout.rfind("PLAY RECAP"):], flush=True)
            changed = set(re.findall(r"^(gpu-\d+) +: .*changed=[1-9]", proc.stdout, flags=re.M))
            if len(changed) != min(drift, hosts):
                raise SystemExit("expected %d node(s) to change, %d did" % (min(drift, hosts), len(changed)))
    return {"hosts": hosts, "ping": ping, "first": first, "converged": again, "rss": rss, "drift": drift,
            "drifted": drifted, "example_wiring": example_wiring, "pings": pings, "agains": agains}


def table(rows, serial, forks):
    drift = rows[0].get("drift") if rows else 0
    example = rows[0].get("example_wiring") if rows else False
    head = "| hosts | ping | first rollout | converged re-run | converged / ping | first / ping |"
    lines = [head + (" %d drifted, the rest converged |" % drift if drift else ""),
             "|---|---|---|---|---|---|" + ("---|" if drift else "")]
    for r in rows:
        lines.append("| %d | %.1f s | %.1f s | %.1f s | %.2f | %.1f |" % (
            r["hosts"], r["ping"], r["first"], r["converged"], r["converged"] / r["ping"], r["first"] / r["ping"])
            + (" %.1f s |" % r["drifted"] if drift else ""))
    lines.append("")
    lines.append("Ping and converged re-run are medians of %d runs each, in turn: " % len(rows[0]["pings"])
                 + "; ".join("%d hosts, pings %s s, re-runs %s s" % (
                     r["hosts"], " / ".join("%.1f" % x for x in r["pings"]), " / ".join("%.1f" % x for x in r["agains"]))
                     for r in rows) + ".")
    lines.append("")
    lines.append("Peak RSS of the controller's largest process (ansible-playbook) during the converged re-runs: "
                 + ", ".join("%d hosts %.0f MiB" % (r["hosts"], r["rss"]) for r in rows) + ".")
    lines.append("")
    lines.append("Measured %s on %s, Python %s, %d CPU(s); `gpuops_mig_serial=%s`, forks %d, one H100 per host "
                 "(layout `3g.40gb: 2`), device-plugin validation off, the simulation wiring %s. Command: "
                 "`.venv/bin/python bench/bench_fleet.py --hosts %s --serial %s --forks %d%s --repeat %d%s --write-docs`."
                 % (time.strftime("%Y-%m-%d"), platform.platform(terse=True), platform.python_version(),
                    os.cpu_count() or 0, serial, forks,
                    "templated (examples/simulated-fleet)" if example else "as plain host variables",
                    ",".join(str(r["hosts"]) for r in rows), serial, forks,
                    " --drift %d" % drift if drift else "", len(rows[0]["pings"]), " --example-wiring" if example else ""))
    return "\n".join(lines)


def write_docs(text):
    with open(DOCS) as handle:
        doc = handle.read()
    block = "%s\n%s\n%s" % (MARK_BEGIN, text, MARK_END)
    if MARK_BEGIN in doc:
        doc = re.sub(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), lambda _m: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n## What a converged fleet costs (bench/bench_fleet.py)\n\n" + block + "\n"
    with open(DOCS, "w") as handle:
        handle.write(doc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8,32,64")
    parser.add_argument("--serial", default="25%")
    parser.add_argument("--forks", type=int, default=16)
    parser.add_argument("--drift", type=int, default=0, metavar="K",
                        help="then give K nodes another layout and time the rollout (the rest stay converged)")
    parser.add_argument("--repeat", type=int, default=3, metavar="R",
                        help="ping sweeps and converged re-runs, in turn, R times each (the medians are reported)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print the slowest tasks of the re-run (and of the drift)")
    parser.add_argument("--example-wiring", action="store_true",
                        help="keep examples/simulated-fleet's templated simulation wiring on every host")
    args = parser.parse_args()
    rows = []
    for hosts in [int(h) for h in args.hosts.split(",")]:
        row = measure(hosts, args.serial, args.forks, args.profile, args.drift, args.example_wiring, args.repeat)
        runs = " (pings %s, re-runs %s)" % (" ".join("%.1f" % x for x in row["pings"]),
                                            " ".join("%.1f" % x for x in row["agains"]))
        drifted = ", %d drifted %.1f s" % (row["drift"], row["drifted"]) if row["drift"] else ""
        print("%(hosts)d hosts: ping %(ping).1f s, first %(first).1f s, converged %(converged).1f s, "
              "peak RSS %(rss).0f MiB" % row + runs + drifted, flush=True)
        rows.append(row)
    text = table(rows, args.serial, args.forks)
    print(text)
    if args.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
