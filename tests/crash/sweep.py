# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The crash sweep: site.yml is killed at every task boundary of the node workflow in turn (the
controller and every worker and module process it started, as a crashed controller or a killed AWX
job leaves them), then run again plainly. Three scenarios (--scenario):

rollout (the default): a static layout rolled out. After each re-run the fleet must be whole:

- the GPUs at the target layout, every GPU instance with its compute instances;
- /dev/nvidia-caps holding the capability nodes of those instances (under the host's root);
- no host GPU service left stopped, no GPU Operator operand label left paused;
- the device plugin advertising what the GPUs hold;
- the node the rollout cordoned uncordoned, an admin's cordon kept;
- no lease or change record of the collection left on a Node.

The fleet (`rollout_fleet`): node-a, an A100 whose MIG mode and geometry change, held by a host
service and a GPU Operator operand, with a GPU pod; node-b, an A30 an admin cordoned, whose geometry
changes.

handoff: the hand-off of node-h, an H100 at a static layout, to HAMi's dynamic MIG partitioner
(mig_node_operator_mode=dynamic-hami), whose ConfigMap holds an entry
of its own for the node and one for another node (`handoff_fleet`). After each re-run the node must
be handed off (MIG on, no static MIG device, HAMi's entry for it in mig mode, HAMi's registration,
the hand-off record keeping HAMi's entry as it was before the first run, no cordon, lease or other
record left); then a take-back run (mig_node_dynamic_take_back=true) must give it back whole: HAMi's
entries exactly as they were, the partitioner's labels and the record gone, the static layout back.

takeback: node-h handed off as above by an uninterrupted run (`handed_off_fleet`), then the take-back
is killed and run again; the node must come back whole as after the handoff scenario's take-back.

    .venv/bin/python tests/crash/sweep.py                 # every boundary (long: about a minute each)
    .venv/bin/python tests/crash/sweep.py --points 5,12   # chosen boundaries
    .venv/bin/python tests/crash/sweep.py --list          # the boundaries, numbered, and exit
    .venv/bin/python tests/crash/sweep.py --scenario handoff
    .venv/bin/python tests/crash/sweep.py --scenario takeback

Every scenario runs on the real test cluster (tests/support/controlplane: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok and the NVIDIA stand-ins), as the rollout's
ServiceAccount (rbac/). Run by hand, the sweep starts one and resets it before each point;
tests/integration/test_crash_sweep.py runs a subset of the first two in CI on its worker's cluster.
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
from tests.integration.conftest import ROLLOUT_RBAC, client_env  # noqa: E402
from tests.support.controlplane.cluster import running  # noqa: E402
from tests.support.kubeapi import hami, seed  # noqa: E402

PAUSED = "paused-for-mig-change"
# What the re-run may take: the variables a test of a crashed run needs so that nothing waits on
# real-cluster timeouts (a crashed holder's lease expires after its duration).
# A crashed run's lease is taken over once it has not been renewed for its duration: short here.
LEASE_SECONDS = 20
RERUN_VARS = {"mig_node_validate_delay": "1",
              "mig_node_lease_duration": str(LEASE_SECONDS)}
TARGET = {
    "node-a": {0: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}},   # all-balanced on an A100-40GB
    "node-b": {0: {"2g.12gb": 2}},
}

HANDOFF_NODE = "node-h"
HANDOFF_STATIC = {0: {"3g.40gb": 2}}   # the static layout before the hand-off and after the take-back
HANDED_OFF = "gpuops.mig/handed-off"
# HAMi's per-node config before the hand-off: the node's own entry (with a field besides its operating mode, so
# that "as it was" shows) and another node's, which neither run may touch.
HAMI_ENTRY = {"name": HANDOFF_NODE, "operatingmode": "hami-core", "devicesplitcount": 4}
HAMI_NODECONFIG = [{"name": "node-x", "operatingmode": "hami-core"}, HAMI_ENTRY]
HANDOFF_VARS = {"mig_node_operator_mode": "dynamic-hami"}
TAKE_BACK_VARS = {"mig_node_dynamic_take_back": True}


def empty_fleet(workdir, api):
    """An empty fleet on `api`, a TestCluster with its stand-ins as a test left it (the caller
    resets it), run as the rollout's ServiceAccount."""
    kubeconfig = api.service_account_kubeconfig(workdir / "rollout.kubeconfig", "rollout", ROLLOUT_RBAC)
    return Fleet(workdir, api, client_env(kubeconfig, workdir, api.control_plane.bin_dir))


def fresh(api):
    """`api` as it started: what an earlier point made deleted, the stand-ins' memory forgotten."""
    api.reset()
    api.stand_ins.reset()
    return api


def rollout_fleet(workdir, api, extra_vars=None):
    """The rollout scenario on `api`: the fleet before the change."""
    fleet = empty_fleet(workdir, api)
    a = fleet.add("node-a", "1xA100-SXM4-40GB", node_labels={DCGM_EXPORTER: "true", CONFIG: "all-balanced"},
                  mig_node_config_file=os.path.join(EXAMPLE, "mig-parted-config.yaml"))
    sim.set_host(a, add_clients=["nvidia-dcgm"])
    fleet.add("node-b", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}])
    api.patch("Node", "node-b", {"spec": {"unschedulable": True}})   # an admin's cordon
    api.seed(   # site.yml deploys the device plugin chart itself
        seed.daemonset("dcgm-exporter", namespace="gpu-operator", labels={"app": "nvidia-dcgm-exporter"},
                       node_selector={DCGM_EXPORTER: "true"}),
        # Its ReplicaSet is made for it (tests/support/controlplane/client.py). A short grace
        # period: an evicted pod stays Terminating for it, which the sweep need not wait out.
        train_pod(),
        seed.pdb("train", {"app": "train"}, namespace="ml", max_unavailable=1),
    )
    fleet.extra_vars = dict(RERUN_VARS, **(extra_vars or {}))
    return fleet


def train_pod():
    pod = seed.pod("train-0", node="node-a", namespace="ml", labels={"app": "train"},
                   owner=("ReplicaSet", "train-7d9f"), limits={"nvidia.com/gpu": 1})
    pod["spec"]["terminationGracePeriodSeconds"] = 2
    return pod


def handoff_fleet(workdir, api, extra_vars=None):
    """The handoff scenario on `api`: node-h at its static layout (applied by a first run), HAMi
    installed with its per-node config (HAMI_NODECONFIG), nothing handed over yet."""
    fleet = empty_fleet(workdir, api)
    fleet.add(HANDOFF_NODE, "1xH100-SXM5-80GB",
              mig_node_layouts=[{"gpus": "all", "devices": HANDOFF_STATIC[0]}])
    # No device plugin of ours (HAMi's is the node's), so nothing of ours to validate through.
    fleet.extra_vars = dict(RERUN_VARS, mig_node_validate_timeout="60", gpuops_mig_deploy_device_plugin="false",
                            mig_node_validate="false")
    fleet.extra_vars.update(extra_vars or {})
    static = run_site(fleet)
    if static.returncode != 0 or fleet.devices(HANDOFF_NODE) != HANDOFF_STATIC:
        raise SystemExit("the static layout before the hand-off was not applied:\n" + static.stdout[-6000:])
    api.seed(*hami.manifests(nodeconfig=HAMI_NODECONFIG))
    return fleet


def handed_off_fleet(workdir, api, extra_vars=None):
    """The takeback scenario on `api`: the handoff scenario's node, handed to HAMi by an
    uninterrupted run."""
    fleet = handoff_fleet(workdir, api, extra_vars)
    handed = run_site(fleet, run_vars=HANDOFF_VARS)
    found = handed_off_problems(api, fleet, host_clients(fleet, [HANDOFF_NODE]))
    if handed.returncode != 0 or found:
        why = "; ".join(found)
        raise SystemExit("the hand-off before the take-back failed: %s\n%s" % (why, handed.stdout[-6000:]))
    return fleet


def run_site(fleet, crash_at=0, log=None, run_vars=None):
    """site.yml in its own process group (so the crash kills it, not us), with the fleet's variables and
    run_vars. Returns the process."""
    env = dict(fleet.env, ANSIBLE_CALLBACK_PLUGINS=str(HERE / "callback_plugins"), ANSIBLE_CALLBACKS_ENABLED="crash_at",
               GPUOPS_CRASH_AT=str(crash_at))
    if log:
        env["GPUOPS_CRASH_LOG"] = str(log)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", fleet.inventory(),
           str(REPO / "playbooks" / "site.yml"), "-e", json.dumps(dict(fleet.extra_vars, **(run_vars or {})))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False,
                          start_new_session=True)
    proc.recap = recap(proc.stdout)
    fleet.runs = getattr(fleet, "runs", 0) + 1
    (fleet.dir / ("run-%d.log" % fleet.runs)).write_text(proc.stdout + proc.stderr)
    return proc


def gpu_problems(fleet, name, want):
    """The node's GPUs against the layout `want`: the devices, their compute instances, /dev/nvidia-caps."""
    found = []
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
    return found


def host_clients(fleet, names):
    """{node: the host's GPU services} (what a run may stop and must start again)."""
    return dict((name, list(sim.load_state(fleet.state_path(name))["host"]["clients"])) for name in names)


def clients_problems(fleet, name, clients_before):
    clients = sim.load_state(fleet.state_path(name))["host"]["clients"]
    if clients != clients_before[name]:
        return ["%s: host GPU services %s, were %s" % (name, clients, clients_before[name])]
    return []


def records_left(name, node, keep=()):
    """The collection's annotations on the Node other than `keep` (leases' and runs' records, owed restores)."""
    records = sorted(k for k in (node["metadata"].get("annotations") or {})
                     if k.startswith("gpuops.mig/") and k not in keep)
    return ["%s: annotations left: %s" % (name, ", ".join(records))] if records else []


def cordon_problems(name, node, admin_cordoned=False):
    cordoned = bool(node["spec"].get("unschedulable"))
    if cordoned != admin_cordoned:
        return ["%s: %s" % (name, "still cordoned" if cordoned else "the admin's cordon was lifted")]
    return []


def leases_left(api):
    leases = [
        lease["metadata"]["name"]
        for lease in api.list("Lease")
        if lease["metadata"]["name"].startswith("gpuops-mig")
        and (lease.get("spec") or {}).get("holderIdentity")
    ]  # a released one is kept, emptied
    return ["leases left: %s" % ", ".join(leases)] if leases else []


def problems(api, fleet, clients_before):
    """What is not whole on the rollout scenario's fleet, as sentences (empty: whole)."""
    found = []
    for name, want in TARGET.items():
        found += gpu_problems(fleet, name, want)
        found += clients_problems(fleet, name, clients_before)
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
        found += records_left(name, node)
        found += cordon_problems(name, node, admin_cordoned=name == "node-b")
    return found + leases_left(api)


def hami_nodeconfig(api):
    """HAMi's per-node config: {node name: its nodeconfig entry}."""
    config = api.get("ConfigMap", hami.CONFIGMAP, "kube-system")["data"]["config.json"]
    return dict((e.get("name"), e) for e in json.loads(config).get("nodeconfig") or [])


def hami_selector(api):
    """The labels of HAMi's DaemonSet's nodeSelector: what the hand-off puts on the node."""
    daemonset = api.get("DaemonSet", "hami-device-plugin", "kube-system")
    return daemonset["spec"]["template"]["spec"]["nodeSelector"]


def handed_off_problems(api, fleet, clients_before):
    """What is not handed off on node-h after the re-run, as sentences (empty: handed off)."""
    name = HANDOFF_NODE
    found = clients_problems(fleet, name, clients_before)
    if fleet.devices(name) != {0: {}}:
        found.append("%s: GPUs hold static MIG devices %s after the hand-off" % (name, fleet.devices(name)))
    off = [gpu["index"] for gpu in sim.load_state(fleet.state_path(name))["gpus"] if gpu["mig"]["current"] != 1]
    if off:
        found.append("%s: MIG mode off on GPU %s after the hand-off" % (name, ", ".join(map(str, off))))
    entry = hami_nodeconfig(api).get(name)
    if entry != dict(HAMI_ENTRY, operatingmode="mig"):
        found.append("%s: HAMi's entry for the node is %s, not %s in mig mode" % (name, entry, HAMI_ENTRY))
    node = api.get("Node", name)
    labels = node["metadata"].get("labels") or {}
    missing = dict((k, v) for k, v in hami_selector(api).items() if labels.get(k) != v)
    if missing:
        found.append("%s: the partitioner's labels %s are not on the node" % (name, missing))
    annotations = node["metadata"].get("annotations") or {}
    registered = json.loads(annotations.get(hami.REGISTER) or "[]")
    if not registered or any(d.get("mode") != "mig" or not d.get("migProfiles") for d in registered):
        found.append("%s: HAMi's registration (%s) does not list the GPUs in mig mode: %s"
                     % (name, hami.REGISTER, registered))
    if HANDED_OFF not in annotations:
        found.append("%s: no hand-off record (%s)" % (name, HANDED_OFF))
    else:
        kept = json.loads(annotations[HANDED_OFF]).get("hami_entry")
        if kept != HAMI_ENTRY:
            found.append("%s: the hand-off record says HAMi's entry for the node was %s, it was %s"
                         % (name, kept, HAMI_ENTRY))
    found += records_left(name, node, keep=(HANDED_OFF,))
    found += cordon_problems(name, node)
    return found + leases_left(api)


def taken_back_problems(api, fleet, clients_before):
    """What is not whole on node-h after the take-back, as sentences (empty: whole)."""
    name = HANDOFF_NODE
    found = gpu_problems(fleet, name, HANDOFF_STATIC) + clients_problems(fleet, name, clients_before)
    before = dict((e["name"], e) for e in HAMI_NODECONFIG)
    for entry_name in sorted(set(before) | set(hami_nodeconfig(api))):
        now = hami_nodeconfig(api).get(entry_name)
        if now != before.get(entry_name):
            found.append("%s: HAMi's entry for %s is %s after the take-back, it was %s"
                         % (name, entry_name, now, before.get(entry_name)))
    node = api.get("Node", name)
    labels = node["metadata"].get("labels") or {}
    left = sorted(k for k in hami_selector(api) if k in labels)
    if left:
        found.append("%s: the partitioner's labels left after the take-back: %s" % (name, ", ".join(left)))
    found += records_left(name, node)
    found += cordon_problems(name, node)
    return found + leases_left(api)


class Scenario:
    """What differs between the scenarios: the fleet, the variables of the run that is killed, the nodes whose
    host services are compared, the check after the re-run, and an optional last run with its own check."""

    def __init__(self, fleet, run_vars, nodes, check, last_vars=None, last_check=None, last_what=""):
        self.fleet, self.run_vars, self.nodes, self.check = fleet, run_vars, nodes, check
        self.last_vars, self.last_check, self.last_what = last_vars, last_check, last_what


SCENARIOS = {
    "rollout": Scenario(rollout_fleet, {}, list(TARGET), problems),
    "handoff": Scenario(handoff_fleet, HANDOFF_VARS, [HANDOFF_NODE], handed_off_problems,
                        TAKE_BACK_VARS, taken_back_problems, "take-back"),
    # The take-back killed instead, then run again: the node must come back whole.
    "takeback": Scenario(handed_off_fleet, TAKE_BACK_VARS, [HANDOFF_NODE], taken_back_problems),
}


def boundaries(workdir, api, extra_vars=None, scenario="rollout"):
    """[(n, task, file)] of an uninterrupted run of the scenario on `api` (as the caller left it)."""
    chosen = SCENARIOS[scenario]
    fleet = chosen.fleet(workdir, api, extra_vars)
    log = workdir / "boundaries.jsonl"
    proc = run_site(fleet, 0, log, chosen.run_vars)
    if proc.returncode != 0:
        raise SystemExit("the uninterrupted %s failed:\n" % scenario + proc.stdout[-6000:])
    return [(e["n"], e["task"], e["file"]) for e in map(json.loads, log.read_text().splitlines())]


def crash_and_rerun(workdir, api, point, extra_vars=None, settle=LEASE_SECONDS + 1, scenario="rollout"):
    """Kill site.yml at boundary `point`, wait until its lease has lapsed, run it again (and the scenario's
    last run, the take-back), and say what is not whole. `api` is the cluster as the caller left it
    (reset it first)."""
    chosen = SCENARIOS[scenario]
    fleet = chosen.fleet(workdir, api, extra_vars)
    clients = host_clients(fleet, chosen.nodes)
    crashed = run_site(fleet, point, run_vars=chosen.run_vars)
    if crashed.returncode != -9:
        return ["the run was not killed at boundary %d (rc %s)" % (point, crashed.returncode)]
    time.sleep(settle)
    rerun = run_site(fleet, run_vars=chosen.run_vars)
    found = chosen.check(api, fleet, clients)
    if rerun.returncode != 0:
        found.insert(0, "the re-run failed (rc %d), see %s" % (rerun.returncode, fleet.dir / ("run-%d.log" % fleet.runs)))
    if chosen.last_check:
        last = run_site(fleet, run_vars=chosen.last_vars)
        if last.returncode != 0:
            log = fleet.dir / ("run-%d.log" % fleet.runs)
            found.append("the %s failed (rc %d), see %s" % (chosen.last_what, last.returncode, log))
        found += chosen.last_check(api, fleet, clients)
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="rollout",
                        help="rollout (a static layout rolled out, the default) or handoff (a node handed to HAMi "
                             "and taken back)")
    parser.add_argument("--points", help="comma-separated boundaries (default: all)")
    parser.add_argument("--list", action="store_true", help="print the boundaries and exit")
    parser.add_argument("-e", "--extra-vars", default="{}", help="JSON variables for every run")
    parser.add_argument("--settle", type=float, default=LEASE_SECONDS + 1,
                        help="seconds between the crash and the re-run (default: the crashed run's lease lapses)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    extra = json.loads(args.extra_vars)
    with tempfile.TemporaryDirectory(prefix="gpuops-crash-") as tmp:
        tmp = Path(tmp)
        (tmp / "list").mkdir()
        (tmp / "control-plane").mkdir()
        with running(tmp / "control-plane") as api:
            points = boundaries(tmp / "list", api, extra, args.scenario)
            if args.list:
                for n, task, path in points:
                    print("%3d  %-22s %s" % (n, path, task))
                return 0
            results = sweep_points(tmp, api, points, args, extra)
    whole = sum(1 for r in results if r["whole"])
    print("crash sweep: %d kill points tried, %d converged, %d not" % (len(results), whole, len(results) - whole))
    if args.json:
        Path(args.json).write_text(json.dumps({"scenario": args.scenario, "points": len(points), "results": results}, indent=1))
    return 0 if whole == len(results) else 1


def sweep_points(tmp, api, points, args, extra):
    """Each chosen point, on the cluster reset first: [{point, task, whole, problems, seconds}]."""
    chosen = [int(p) for p in args.points.split(",")] if args.points else [point[0] for point in points]
    names = dict((n, "%s: %s" % (path, task)) for n, task, path in points)
    results = []
    for n in chosen:
        (tmp / str(n)).mkdir()
        started = time.monotonic()
        found = crash_and_rerun(tmp / str(n), fresh(api), n, extra, args.settle, args.scenario)
        found += ["the stand-ins failed: %r" % exc for exc in api.errors]
        results.append({"point": n, "task": names.get(n, "?"), "whole": not found, "problems": found,
                        "seconds": round(time.monotonic() - started, 1)})
        print("%3d %-5s %-60s %s" % (n, "ok" if not found else "FAIL", names.get(n, "?")[:60], "; ".join(found)),
              flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
