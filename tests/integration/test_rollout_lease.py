"""Rollouts that survive each other (docs/rollout.md, "Two rollouts at once"): the per-node Lease (a lock
file without Kubernetes) of gpuops.mig.mig_node_lease, and the reason of a failure on the Node
(annotation gpuops.mig/last-error, Events). Simulated hosts and the real test cluster
(tests/support/controlplane), the collection running as the rollout's ServiceAccount, as in
test_roles.py."""

import datetime
import json
import os
import subprocess
import threading

import pytest

import gpuops_mig_sim as sim
from tests.integration.test_roles import BIN, CONFIG, EXAMPLE, REPO, STATE, Fleet, device_plugin_daemonsets, output, recap
from tests.integration.test_roles import wait_device_plugin_running

pytestmark = pytest.mark.playbook

PLAYBOOK = "tests/integration/playbooks/mig_node.yml"
CONFIG_FILE = os.path.join(EXAMPLE, "mig-parted-config.yaml")
LAYOUTS = {"all-balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, "all-3g": {"3g.20gb": 2}}
FAST = {"mig_node_validate_delay": 1, "mig_node_validate_timeout": 30}
LAST_ERROR = "gpuops.mig/last-error"


def utc(seconds_ago=0):
    moment = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def foreign_lease(node, renewed_ago=0, duration=3600):
    """A Lease another rollout holds on `node`."""
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "gpuops-mig-%s" % node, "namespace": "default",
                         "annotations": {"gpuops.mig/lease-run-id": "other-run", "gpuops.mig/lease-controller": "ctl-9"}},
            "spec": {"holderIdentity": "gpuops.mig run other-run on ctl-9, started 2026-01-01T00:00:00Z",
                     "leaseDurationSeconds": duration, "acquireTime": utc(renewed_ago + 60),
                     "renewTime": utc(renewed_ago)}}


def released(cluster, name):
    """Nothing holds the node: its Lease is released (kept, spec.holderIdentity empty) or gone."""
    lease = cluster.find("Lease", name)
    return lease is None or not (lease.get("spec") or {}).get("holderIdentity")


def collection_events(cluster, node=None):
    """The Events in namespace default that the collection created (its POSTs in the audit log),
    about `node` if given: kube-controller-manager writes its own about every Node
    (RegisteredNode)."""
    created = {r.resource.get("name") for r in cluster.requests
               if r.method == "POST" and r.resource.get("resource") == "events" and r.code == 201}
    return [e for e in cluster.list("Event", "default") if e["metadata"]["name"] in created
            and (node is None or e["involvedObject"]["name"] == node)]


def node_view(cluster, name):
    """What a rollout writes on a Node (labels, annotations, spec), as text; kwok rewrites its
    status (heartbeats), and so its resourceVersion, while the test runs."""
    node = cluster.get("Node", name)
    return json.dumps([node["metadata"].get("labels"), node["metadata"].get("annotations"),
                       node["spec"]], sort_keys=True)


def collection_writes(cluster):
    """What the collection changed in the cluster, from the audit log (its access checks, reviews
    the API server answers without storing anything, left out)."""
    return [r for r in cluster.requests if r.method in ("POST", "PUT", "PATCH", "DELETE")
            and r.resource.get("apiGroup") != "authorization.k8s.io"]


# The collection keeps its Leases in namespace default; kwok renews each node's Lease in
# kube-node-lease (named after the node) and the controllers hold theirs in kube-system.
LEASE_NAMESPACE = "default"


def _version(obj):
    return int(obj["metadata"]["resourceVersion"])


class Timeline(object):
    """(kind, event, name) of every change of a Lease in LEASE_NAMESPACE and of every Node
    change that cordons or labels state, in the order the API server stored them
    (resourceVersion: one etcd revision for every kind here). A watch event carries no old
    object: each change is compared with the previous one of that name, the first with what the
    cluster held when the timeline started."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._lock = threading.Lock()
        self._entries = []
        self._last = {}
        for kind, obj in self._current():
            self._last[(kind, obj["metadata"]["name"])] = obj
        for kind in ("Lease", "Node"):
            for kind_event in ("added", "modified", "deleted"):
                cluster.on(kind_event, self._record, kind=kind)

    def _current(self):
        for kind, namespace in (("Node", None), ("Lease", LEASE_NAMESPACE)):
            for obj in self.cluster.list(kind, namespace):
                yield kind, obj

    def _record(self, event):
        obj = event.obj
        meta = obj["metadata"]
        if event.kind == "Lease" and meta.get("namespace") != LEASE_NAMESPACE:
            return
        with self._lock:
            old = self._last.get((event.kind, meta["name"])) or {}
            self._last[(event.kind, meta["name"])] = None if event.type == "deleted" else obj
            if event.kind == "Node":
                labels = meta.get("labels") or {}
                old_labels = old.get("metadata", {}).get("labels") or {}
                cordon = bool((obj.get("spec") or {}).get("unschedulable"))
                old_cordon = bool((old.get("spec") or {}).get("unschedulable"))
                if labels.get(STATE) == old_labels.get(STATE) and cordon == old_cordon \
                        and labels.get(CONFIG) == old_labels.get(CONFIG):
                    return
                entry = ("Node", labels.get(STATE), meta["name"], labels.get(CONFIG))
            else:
                # A released Lease is kept with its holder emptied: its release reads as
                # "deleted", a take of it as "added", a renewal as "modified".
                holder = (obj.get("spec") or {}).get("holderIdentity")
                held_before = (old.get("spec") or {}).get("holderIdentity")
                kind_of = event.type
                if event.type == "modified" and not holder:
                    kind_of = "deleted"
                elif event.type == "modified" and not held_before:
                    kind_of = "added"
                entry = (event.kind, kind_of, meta["name"])
            self._entries.append((_version(obj), entry))

    def entries(self):
        """The entries in the order the server stored them, once the watches have delivered every
        change of the Nodes and Leases stored until now."""

        def caught_up():
            current = dict(((kind, obj["metadata"]["name"]), obj) for kind, obj in self._current())
            with self._lock:
                gone = [key for key, obj in self._last.items()
                        if obj is not None and key not in current]
                return not gone and all(self._last.get(key) is not None and
                                        _version(self._last[key]) >= _version(obj)
                                        for key, obj in current.items())
        self.cluster.wait_for(caught_up, "the watches to deliver the last Node and Lease changes")
        with self._lock:
            return [entry for _version_, entry in sorted(self._entries, key=lambda e: e[0])]


def test_lease_taken_renewed_released_and_the_failure_on_the_node(cluster, cluster_env, tmp_path):
    """A good node: its Lease is taken before the cordon, renewed between steps, released at the end. A node
    that fails: released too, and the Node says why (annotation, Warning Event); the next good run clears it."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    cluster.seed(*device_plugin_daemonsets())
    fleet.add("node-a", "1xA100-SXM4-40GB", mig_node_config_file=CONFIG_FILE, mig_node_config_name="all-3g",
              mig_node_persist=False)
    bad = fleet.add("node-c", "1xA100-SXM4-40GB", mig_node_config_file=CONFIG_FILE, mig_node_config_name="all-3g",
                    mig_node_persist=False)
    sim.add_fault(bad, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    timeline = Timeline(cluster)

    proc = fleet.run(PLAYBOOK, dict(FAST, awx_job_id=4711))
    assert proc.recap["node-a"]["failed"] == 0 and proc.recap["node-c"]["failed"] == 1, output(proc)
    seen = timeline.entries()

    a = [entry for entry in seen if entry[2] in ("node-a", "gpuops-mig-node-a")]
    assert a[0] == ("Lease", "added", "gpuops-mig-node-a")               # taken before the cordon
    assert a[1][:3] == ("Node", "pending", "node-a")
    assert a.count(("Lease", "modified", "gpuops-mig-node-a")) == 3       # mode, geometry, device plugin + validate
    assert a[-1] == ("Lease", "deleted", "gpuops-mig-node-a")             # released after the uncordon
    released = cluster.get("Lease", "gpuops-mig-node-a")
    assert released["spec"]["holderIdentity"] == ""  # kept, naming its last holder
    assert released["metadata"]["annotations"]["gpuops.mig/lease-job-id"] == "4711"
    assert a[-2][:3] == ("Node", "success", "node-a")
    assert (
        cluster.get("Lease", "gpuops-mig-node-c")["spec"]["holderIdentity"] == ""
    )  # released after the failure too
    assert ("Lease", "added", "gpuops-mig-node-c") in seen
    lease_writes = [r for r in cluster.requests
                    if "/leases" in r.path and r.method in ("PUT", "POST", "DELETE")]
    assert {r.method for r in lease_writes} == {"POST", "PUT"}

    # The failure, on the Node: the annotation and a Warning Event.
    node = cluster.get("Node", "node-c")
    assert node["metadata"]["labels"][STATE] == "failed"
    note = json.loads(node["metadata"]["annotations"][LAST_ERROR])
    assert note["step"] == "Apply the MIG geometry" and note["layout"] == "all-3g" and note["job"] == "4711"
    assert "insufficient resources" in note["message"].lower() and note["run"]
    events = collection_events(cluster, "node-c")
    assert [(e["reason"], e["type"]) for e in events] == [("MigReconfigureFailed", "Warning")]
    assert events[0]["involvedObject"]["kind"] == "Node" and note["run"] in events[0]["message"]
    assert "failed at 'Apply the MIG geometry'" in events[0]["message"]
    assert LAST_ERROR not in (cluster.get("Node", "node-a")["metadata"].get("annotations") or {})
    done = collection_events(cluster, "node-a")
    assert [(e["reason"], e["type"]) for e in done] == [("MigReconfigured", "Normal")]

    # Fixed: the next run succeeds, the annotation goes, a Normal Event supersedes the Warning.
    sim.clear_faults(bad)
    again = fleet.run(PLAYBOOK, FAST, limit="node-c")
    assert again.recap["node-c"]["failed"] == 0, output(again)
    node = cluster.get("Node", "node-c")
    assert node["metadata"]["labels"][STATE] == "success" and LAST_ERROR not in (node["metadata"].get("annotations") or {})
    events = sorted((e["reason"], e["type"]) for e in collection_events(cluster, "node-c"))
    assert events == [("MigReconfigureFailed", "Warning"), ("MigReconfigured", "Normal")]
    assert cluster.get("Lease", "gpuops-mig-node-c")["spec"]["holderIdentity"] == ""


def test_a_held_node_is_refused_before_any_change_or_waited_for(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    cluster.seed(*device_plugin_daemonsets())
    fleet.add("node-a", "1xA100-SXM4-40GB", mig_node_config_file=CONFIG_FILE, mig_node_config_name="all-3g",
              mig_node_persist=False)
    wait_device_plugin_running(cluster)  # GFD labels node-a before `before`, not after
    cluster.seed(foreign_lease("node-a", renewed_ago=5))
    before = (fleet.digest("node-a"), node_view(cluster, "node-a"),
              json.dumps(cluster.get("Lease", "gpuops-mig-node-a"), sort_keys=True))

    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["node-a"]["failed"] == 1, output(proc)
    assert "node-a: another MIG rollout holds this node: gpuops.mig run other-run on ctl-9" in proc.stdout, output(proc)
    assert "Nothing was changed on the node" in proc.stdout
    assert (fleet.digest("node-a"), node_view(cluster, "node-a"),
            json.dumps(cluster.get("Lease", "gpuops-mig-node-a"), sort_keys=True)) == before
    assert collection_writes(cluster) == [], collection_writes(cluster)
    assert collection_events(cluster) == []

    # Waiting: the other rollout releases the node after a while, this one then takes it.
    release = threading.Timer(4, cluster.delete, ("Lease", "gpuops-mig-node-a", "default"))
    release.start()
    try:
        waited = fleet.run(PLAYBOOK, dict(FAST, mig_node_lease_wait=60))
    finally:
        release.cancel()
    assert waited.recap["node-a"]["failed"] == 0, output(waited)
    assert fleet.devices("node-a") == {0: LAYOUTS["all-3g"]}
    assert released(cluster, "gpuops-mig-node-a")


def test_an_abandoned_lease_is_taken_over_and_said(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    cluster.seed(*device_plugin_daemonsets())
    fleet.add("node-a", "1xA100-SXM4-40GB", mig_node_config_file=CONFIG_FILE, mig_node_config_name="all-3g",
              mig_node_persist=False)
    # its run crashed 1 min ago
    cluster.seed(foreign_lease("node-a", renewed_ago=120, duration=60))
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["node-a"]["failed"] == 0, output(proc)
    assert "node-a: took the lease over from gpuops.mig run other-run on ctl-9" in proc.stdout, output(proc)
    assert fleet.devices("node-a") == {0: LAYOUTS["all-3g"]}
    assert released(cluster, "gpuops-mig-node-a")


def test_lock_file_without_kubernetes(cluster, cluster_env, tmp_path):
    """A host that is no Kubernetes node: the lock file refuses a second rollout, is taken over when stale,
    and is gone after the run."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    cluster.seed(*device_plugin_daemonsets())
    fleet.add("box-a", "1xA100-SXM4-40GB", kubernetes=False, mig_node_persist=False,
              mig_node_config_file=CONFIG_FILE, mig_node_config_name="all-3g")
    lock = fleet.dir / "box-a" / "run" / "gpuops-mig" / "lock"
    lock.parent.mkdir(parents=True)
    held = {"holder": {"run_id": "other-run", "controller": "ctl-9", "job_id": "", "started": ""},
            "holder_identity": "gpuops.mig run other-run on ctl-9, started 2026-01-01T00:00:00Z",
            "acquire_time": utc(30), "renew_time": utc(10), "duration": 3600}
    lock.write_text(json.dumps(held))
    before = fleet.digest("box-a")

    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["box-a"]["failed"] == 1, output(proc)
    assert "box-a: another MIG rollout holds this node: gpuops.mig run other-run on ctl-9" in proc.stdout
    assert fleet.digest("box-a") == before and json.loads(lock.read_text()) == held

    lock.write_text(json.dumps(dict(held, renew_time=utc(7200))))          # stale: its run crashed
    again = fleet.run(PLAYBOOK, FAST)
    assert again.recap["box-a"]["failed"] == 0, output(again)
    assert "box-a: took the lease over from gpuops.mig run other-run on ctl-9" in again.stdout
    assert fleet.devices("box-a") == {0: LAYOUTS["all-3g"]}
    assert not lock.exists()


def start_site(fleet, layout, name):
    log = open(str(fleet.dir / ("%s.log" % name)), "w")
    extra = dict(FAST, mig_node_config_file=CONFIG_FILE, mig_node_config_name=layout, gpuops_mig_serial="100%",
                 mig_node_persist=False, gpuops_mig_deploy_device_plugin=False)
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", fleet.inventory(), os.path.join(REPO, "playbooks", "site.yml"),
           "-e", json.dumps(extra)]
    return subprocess.Popen(cmd, env=fleet.env, stdout=log, stderr=subprocess.STDOUT, text=True), log


@pytest.mark.parametrize("layouts", [("all-3g", "all-3g"), ("all-balanced", "all-3g")], ids=["same", "different"])
def test_two_rollouts_at_once_leave_one_truthful_layout_per_node(
    cluster, cluster_env, tmp_path, layouts
):
    """Two site.yml runs started together on the same nodes: every node is changed by one of them
    only, and ends with the GPUs holding what its nvidia.com/mig.config label says, labelled
    success.
    The rollout is one decision (the fleet's Lease gpuops-mig-rollout): the batch is never split
    across the two layouts, and a run that finds the fleet held stops whole before any change."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    cluster.seed(*device_plugin_daemonsets())
    nodes = ("node-1", "node-2", "node-3")
    for name in nodes:
        fleet.add(name, "1xA100-SXM4-40GB", mig_node_persist=False)
    fleet.env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
    timeline = Timeline(cluster)
    first, first_log = start_site(fleet, layouts[0], "run-a")
    second, second_log = start_site(fleet, layouts[1], "run-b")
    try:
        codes = (first.wait(600), second.wait(600))
    finally:
        first_log.close()
        second_log.close()
    logs = [(fleet.dir / name).read_text() for name in ("run-a.log", "run-b.log")]
    seen = timeline.entries()

    truth = {}
    for name in nodes:
        labels = cluster.get("Node", name)["metadata"]["labels"]
        truth[name] = (labels.get(STATE), labels.get(CONFIG), fleet.devices(name))
    assert truth == dict((name, ("success", labels, {0: LAYOUTS[labels]}))
                         for name, (_state, labels, _devices) in truth.items()), logs
    # One writer at a time: each change of a node (pending with a layout) ends (success with that layout)
    # before the next one starts; no rollout labels a node another one is changing.
    for name in nodes:
        changes = [(entry[1], entry[3]) for entry in seen if entry[0] == "Node" and entry[2] == name and entry[1]]
        assert changes and len(changes) % 2 == 0, (name, changes, logs)
        for start, end in zip(changes[0::2], changes[1::2]):
            assert start[0] == "pending" and end == ("success", start[1]), (name, changes, logs)
    for name in nodes:
        assert released(cluster, "gpuops-mig-%s" % name)
        # Between a Lease's take and its release, no second take.
        takes = [entry[1] for entry in seen if entry[0] == "Lease" and entry[2] == "gpuops-mig-%s" % name]
        assert takes.count("added") == takes.count("deleted") >= 1
        assert "".join("+" if t == "added" else "-" if t == "deleted" else "" for t in takes) \
            == "+-" * takes.count("added")
    # One layout for the whole batch: never split between the two runs.
    assert len(set(labels for _state, labels, _devices in truth.values())) == 1, truth
    # The loser stopped whole at the fleet's hold (or came after the winner was done).
    for code, log in zip(codes, logs):
        assert code == 0 or "Another gpuops.mig rollout holds this fleet" in log, log[-6000:]
        if code:
            assert "Cordon" not in log.split("Hold the fleet for this rollout")[-1], log[-6000:]
    assert recap(logs[0]) and recap(logs[1])
    assert released(cluster, "gpuops-mig-rollout")


def test_a_mig_manager_failure_on_the_node_and_its_clearing(cluster, cluster_env, tmp_path):
    """The GPU Operator's mig-manager path: the lease is released after the failure, and the Node carries why
    (annotation, Warning Event) until a later run succeeds."""
    from tests.integration.test_gpu_operator import FAST as OPERATOR_FAST, operator_fleet
    fleet = operator_fleet(tmp_path, cluster, cluster_env, models=("1xA100-SXM4-40GB",))
    sim.add_fault(fleet.state_path("gpu-0"), "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    failed = fleet.run(PLAYBOOK, dict(OPERATOR_FAST, mig_node_config_name="layout-b"))
    assert failed.recap["gpu-0"]["failed"] == 1 and "mig-manager failed" in failed.stdout, output(failed)
    note = json.loads(cluster.get("Node", "gpu-0")["metadata"]["annotations"][LAST_ERROR])
    assert note["layout"] == "layout-b" and note["step"] == "Fail when mig-manager did not apply the layout", note
    assert "nvidia.com/mig.config.state=failed" in note["message"]
    events = [(e["reason"], e["type"]) for e in collection_events(cluster, "gpu-0")]
    assert events == [("MigReconfigureFailed", "Warning")]
    assert released(cluster, "gpuops-mig-gpu-0")

    sim.clear_faults(fleet.state_path("gpu-0"))
    again = fleet.run(PLAYBOOK, dict(OPERATOR_FAST, mig_node_config_name="layout-b"))
    assert again.recap["gpu-0"]["failed"] == 0, output(again)
    assert LAST_ERROR not in (cluster.get("Node", "gpu-0")["metadata"].get("annotations") or {})
    events = sorted((e["reason"], e["type"]) for e in collection_events(cluster, "gpu-0"))
    assert events == [("MigReconfigureFailed", "Warning"), ("MigReconfigured", "Normal")]
    assert released(cluster, "gpuops-mig-gpu-0")


def test_a_converged_pass_all_refused_still_changes_the_free_nodes_and_summarizes(
    cluster, cluster_env, tmp_path
):
    """Every node of site.yml's converged pass refused (another run holds it): the nodes that
    change still get their turn, the summary is printed with the refusal, and the rollout fails at
    its end."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    layout = [{"gpus": "all", "devices": {"2g.12gb": 2}}]
    fast = {"mig_node_validate_delay": "1"}
    fleet.add("node-a", "1xA30-24GB", mig_node_layouts=layout)
    assert fleet.run("playbooks/site.yml", fast).returncode == 0
    cluster.patch(
        "Node", "node-a", {"metadata": {"labels": {STATE: None}}}
    )  # steady work: its label
    cluster.seed(foreign_lease("node-a", renewed_ago=5))
    fleet.add("node-b", "1xA30-24GB", mig_node_layouts=layout)

    proc = fleet.run("playbooks/site.yml", fast)
    assert proc.returncode != 0
    assert (
        "node-a: another MIG rollout holds this node: gpuops.mig run other-run" in proc.stdout
    ), output(proc)
    assert cluster.get("Node", "node-b")["metadata"]["labels"][STATE] == "success", output(proc)
    assert "node-a  refused" in proc.stdout and "node-b  changed" in proc.stdout, output(proc)
    assert "Fail the rollout for the converged nodes that could not be put right" in proc.stdout
