# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The crash sweep: site.yml is killed at every task boundary of the node workflow in turn (the
controller and every worker and module process it started, as a crashed controller or a killed AWX
job leaves them), then run again plainly. After each re-run the fleet must be whole:

- the GPUs at the target layout, every GPU instance with its compute instances;
- /dev/nvidia-caps holding the capability nodes of those instances (under the host's root);
- no host GPU service left stopped, no GPU Operator operand label left paused;
- the device plugin advertising what the GPUs hold;
- the node the rollout cordoned uncordoned, an admin's cordon kept;
- no lease or change record of the collection left on a Node.

    .venv/bin/python tests/crash/sweep.py                 # every boundary (long: about a minute each)
    .venv/bin/python tests/crash/sweep.py --points 5,12   # chosen boundaries
    .venv/bin/python tests/crash/sweep.py --list          # the boundaries, numbered, and exit

tests/integration/test_crash_sweep.py runs a subset in CI. The fleet (`scenario`): node-a, an
A100 whose MIG mode and geometry change, held by a host service and a GPU Operator operand, with a
GPU pod; node-b, an A30 an admin cordoned, whose geometry changes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in (REPO, REPO / ".build" / "collections", REPO / "simulator", REPO / "tests" / "integration"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gpuops_mig_sim as sim  # noqa: E402
from gpuops_mig_sim import models  # noqa: E402
from test_roles import CONFIG, DCGM_EXPORTER, EXAMPLE, STATE, Fleet, recap  # noqa: E402

from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_caps  # noqa: E402
from tests.support.kubeapi import KubeAPI, seed  # noqa: E402

PAUSED = "paused-for-mig-change"
# What the re-run may take: the variables a test of a crashed run needs so that nothing waits on
# real-cluster timeouts (a crashed holder's lease expires after its duration).
# A crashed run's lease is taken over once it has not been renewed for its duration: short here.
LEASE_SECONDS = 20
RERUN_VARS = {"mig_node_validate_delay": "1", "mig_node_drain_retry_delay": "1",
              "mig_node_lease_duration": str(LEASE_SECONDS)}
TARGET = {
    "node-a": {0: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},   # all-balanced on an A100-40GB
    "node-b": {0: {"2g.12gb": 2}},
}


def kube_env(api, scratch):
    env = dict(os.environ)
    env.update(KUBECONFIG=api.kubeconfig, K8S_AUTH_KUBECONFIG=api.kubeconfig,
               KUBECACHEDIR=str(scratch / "kube-cache"), HELM_CACHE_HOME=str(scratch / "helm" / "cache"),
               HELM_CONFIG_HOME=str(scratch / "helm" / "config"), HELM_DATA_HOME=str(scratch / "helm" / "data"),
               TMPDIR=str(scratch))
    return env


def scenario(workdir, extra_vars=None):
    """A started emulator and the fleet before the change. Returns (api, fleet)."""
    api = KubeAPI().start()
    api.write_kubeconfig(workdir / "kubeconfig")
    (workdir / "client-tmp").mkdir()
    fleet = Fleet(workdir, api, kube_env(api, workdir / "client-tmp"))
    a = fleet.add("node-a", "1xA100-SXM4-40GB", node_labels={DCGM_EXPORTER: "true", CONFIG: "all-balanced"},
                  mig_node_config_file=os.path.join(EXAMPLE, "mig-parted-config.yaml"))
    sim.set_host(a, add_clients=["nvidia-dcgm"])
    fleet.add("node-b", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}])
    api.patch("Node", "node-b", {"spec": {"unschedulable": True}})   # an admin's cordon
    api.seed(   # site.yml deploys the device plugin chart itself
        seed.daemonset("dcgm-exporter", namespace="gpu-operator", labels={"app": "nvidia-dcgm-exporter"},
                       node_selector={DCGM_EXPORTER: "true"}),
        seed.replicaset("train-7d9f", 1, namespace="ml", labels={"app": "train"}),
        seed.pod("train-0", node="node-a", namespace="ml", labels={"app": "train"},
                 owner=("ReplicaSet", "train-7d9f"), limits={"nvidia.com/gpu": 1}),
        seed.pdb("train", {"app": "train"}, namespace="ml", max_unavailable=1),
    )
    fleet.extra_vars = dict(RERUN_VARS, **(extra_vars or {}))
    return api, fleet


def run_site(fleet, crash_at=0, log=None):
    """site.yml in its own process group (so the crash kills it, not us). Returns the process."""
    env = dict(fleet.env, ANSIBLE_CALLBACK_PLUGINS=str(HERE / "callback_plugins"), ANSIBLE_CALLBACKS_ENABLED="crash_at",
               GPUOPS_CRASH_AT=str(crash_at))
    if log:
        env["GPUOPS_CRASH_LOG"] = str(log)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", fleet.inventory(),
           str(REPO / "playbooks" / "site.yml"), "-e", json.dumps(fleet.extra_vars)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False,
                          start_new_session=True)
    proc.recap = recap(proc.stdout)
    fleet.runs = getattr(fleet, "runs", 0) + 1
    (fleet.dir / ("run-%d.log" % fleet.runs)).write_text(proc.stdout + proc.stderr)
    return proc


def problems(api, fleet, clients_before):
    """What is not whole on the fleet, as sentences (empty: whole)."""
    found = []
    for name, want in TARGET.items():
        state = sim.load_state(fleet.state_path(name))
        if fleet.devices(name) != want:
            found.append("%s: GPUs hold %s, not %s" % (name, fleet.devices(name), want))
        for gpu in state["gpus"]:
            for gi in gpu["gpu_instances"]:
                if not gi["compute_instances"]:
                    profile = models.gi_profile_by_id(models.MODELS[gpu["model"]], gi["profile_id"]).name
                    found.append("%s: GPU %d instance %d (%s) has no compute instance"
                                 % (name, gpu["index"], gi["id"], profile))
        # The host's root (examples/simulated-fleet gpuops_sim_root): its /dev/nvidia-caps must list the new devices.
        caps = _nvidia_caps.plan(os.path.splitext(fleet.state_path(name))[0])
        if caps:
            found.append("%s: /dev/nvidia-caps not current, still to do: %s" % (name, "; ".join(_nvidia_caps.describe(caps))))
        if state["host"]["clients"] != clients_before[name]:
            found.append("%s: host GPU services %s, were %s" % (name, state["host"]["clients"], clients_before[name]))
        node = api.get("Node", name)
        labels = node["metadata"].get("labels") or {}
        paused = sorted(k for k, v in labels.items() if v == PAUSED)
        if paused:
            found.append("%s: operand labels still paused: %s" % (name, ", ".join(paused)))
        if labels.get(STATE) != "success":
            found.append("%s: %s=%s" % (name, STATE, labels.get(STATE)))
        advertised = dict((k[len("nvidia.com/mig-"):], int(v)) for k, v in node["status"].get("allocatable", {}).items()
                          if k.startswith("nvidia.com/mig-") and int(v))
        held = {}
        for counts in want.values():
            for profile, n in counts.items():
                held[profile] = held.get(profile, 0) + n
        if advertised != held:
            found.append("%s: the device plugin advertises %s, the GPUs hold %s" % (name, advertised, held))
        records = sorted(k for k in (node["metadata"].get("annotations") or {}) if k.startswith("gpuops.mig/"))
        if records:
            found.append("%s: annotations left: %s" % (name, ", ".join(records)))
        cordoned = bool(node["spec"].get("unschedulable"))
        if cordoned != (name == "node-b"):
            found.append("%s: %s" % (name, "still cordoned" if cordoned else "the admin's cordon was lifted"))
    try:
        leases = [lease["metadata"]["name"] for lease in api.list("Lease")
                  if lease["metadata"]["name"].startswith("gpuops-mig")]
    except Exception:  # an emulator without Leases: nothing to leave behind
        leases = []
    if leases:
        found.append("leases left: %s" % ", ".join(leases))
    return found


def boundaries(workdir, extra_vars=None):
    """[(n, task, file)] of an uninterrupted rollout of the scenario."""
    api, fleet = scenario(workdir, extra_vars)
    try:
        log = workdir / "boundaries.jsonl"
        proc = run_site(fleet, 0, log)
        if proc.returncode != 0:
            raise SystemExit("the uninterrupted rollout failed:\n" + proc.stdout[-6000:])
        return [(e["n"], e["task"], e["file"]) for e in map(json.loads, log.read_text().splitlines())]
    finally:
        api.stop()


def crash_and_rerun(workdir, point, extra_vars=None, settle=LEASE_SECONDS + 1):
    """Kill site.yml at boundary `point`, wait until its lease has lapsed, run it again, and say what
    is not whole."""
    api, fleet = scenario(workdir, extra_vars)
    try:
        clients = dict((name, list(sim.load_state(fleet.state_path(name))["host"]["clients"])) for name in TARGET)
        crashed = run_site(fleet, point)
        if crashed.returncode != -9:
            return ["the run was not killed at boundary %d (rc %s)" % (point, crashed.returncode)]
        time.sleep(settle)
        rerun = run_site(fleet)
        found = problems(api, fleet, clients)
        if rerun.returncode != 0:
            found.insert(0, "the re-run failed (rc %d), see %s" % (rerun.returncode, fleet.dir / ("run-%d.log" % fleet.runs)))
        return found
    finally:
        api.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--points", help="comma-separated boundaries (default: all)")
    parser.add_argument("--list", action="store_true", help="print the boundaries and exit")
    parser.add_argument("-e", "--extra-vars", default="{}", help="JSON variables for both runs")
    parser.add_argument("--settle", type=float, default=LEASE_SECONDS + 1,
                        help="seconds between the crash and the re-run (default: the crashed run's lease lapses)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    extra = json.loads(args.extra_vars)
    with tempfile.TemporaryDirectory(prefix="gpuops-crash-") as tmp:
        tmp = Path(tmp)
        (tmp / "list").mkdir()
        points = boundaries(tmp / "list", extra)
        if args.list:
            for n, task, path in points:
                print("%3d  %-22s %s" % (n, path, task))
            return 0
        chosen = [int(p) for p in args.points.split(",")] if args.points else [point[0] for point in points]
        names = dict((n, "%s: %s" % (path, task)) for n, task, path in points)
        results = []
        for n in chosen:
            (tmp / str(n)).mkdir()
            started = time.monotonic()
            found = crash_and_rerun(tmp / str(n), n, extra, args.settle)
            results.append({"point": n, "task": names.get(n, "?"), "whole": not found, "problems": found,
                            "seconds": round(time.monotonic() - started, 1)})
            print("%3d %-5s %-60s %s" % (n, "ok" if not found else "FAIL", names.get(n, "?")[:60], "; ".join(found)),
                  flush=True)
    whole = sum(1 for r in results if r["whole"])
    print("crash sweep: %d kill points tried, %d converged, %d not" % (len(results), whole, len(results) - whole))
    if args.json:
        Path(args.json).write_text(json.dumps({"points": len(points), "results": results}, indent=1))
    return 0 if whole == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
