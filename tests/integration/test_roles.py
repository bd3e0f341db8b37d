"""The roles (mig_preflight, mig_node, mig_device_plugin) run by ansible-playbook against simulated
GPU hosts (connection local) and the real test cluster (tests/support/controlplane).

Hosts are wired like the demo's: examples/simulated-fleet/group_vars (state file, simulator/bin on
PATH, boot-time restore under a per-host root). `Fleet` below is also used by test_playbooks.py.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import gpuops_mig_sim as sim
from tests.support.controlplane.cluster import daemonsets_rolled_out
from tests.support.kubeapi import seed

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)
EXAMPLE = os.path.join(REPO, "examples", "simulated-fleet")
CHART = os.path.join(REPO, "tests", "support", "charts", "nvidia-device-plugin")

pytestmark = pytest.mark.playbook

STATE = "nvidia.com/mig.config.state"
CONFIG = "nvidia.com/mig.config"
DCGM_EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
GFD_DEPLOY = "nvidia.com/gpu.deploy.gpu-feature-discovery"


class Fleet(object):
    """Simulated GPU hosts, their Kubernetes nodes and an inventory for them."""

    def __init__(self, tmp_path, cluster=None, kube_env=None):
        self.dir = tmp_path / "fleet"
        self.dir.mkdir()
        shutil.copytree(os.path.join(EXAMPLE, "group_vars"), str(self.dir / "group_vars"))
        self.cluster = cluster
        self.env = dict(kube_env or os.environ)
        self.env.update(
            ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
            ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
            ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-tmp"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            GPUOPS_SIM_DIR=str(self.dir),
            GPUOPS_SIM_REPO=REPO,
            PATH=BIN + os.pathsep + self.env.get("PATH", ""),
        )
        self.hosts = {}

    def state_path(self, name):
        return str(self.dir / ("%s.json" % name))

    def add(self, name, gpus, node_labels=None, kubernetes=True, driver=sim.DEFAULT_DRIVER_VERSION, pod_resources=None,
            **hostvars):
        """A simulated host; with kubernetes, also its node (linked to the GPUs for the plugin/GFD
        stand-ins; with pod_resources, a socket path, the kubelet's device manager stand-in
        (allocations.py) gives its pods devices, for a PodResources server the test starts there
        with podresources_server.node_source to list)."""
        # The driver's /proc under gpuops_sim_root, where mig_device_nodes makes /dev/nvidia-caps current; creating
        # character devices needs root, so an unprivileged run keeps none (the step then has nothing to do).
        sim.create_state(self.state_path(name), gpus, seed=name, driver_version=driver,
                         root=str(self.dir / name) if os.geteuid() == 0 else None)
        if kubernetes:
            labels = {"nvidia.com/gpu.present": "true"}
            labels.update(node_labels or {})
            self.cluster.seed(seed.node(name, labels, nvml_state=self.state_path(name),
                                        pod_resources=pod_resources))
            stand_ins = getattr(self.cluster, "stand_ins", None)
            if stand_ins is not None:  # real cluster: GFD labels the node after a watch event,
                stand_ins.sync()       # so a test starts from the node a rollout would meet
        else:
            hostvars.setdefault("mig_node_kubernetes", False)
            hostvars.setdefault("mig_preflight_kubernetes", False)
        self.hosts[name] = hostvars
        return self.state_path(name)

    def inventory(self):
        path = self.dir / "inventory.yml"
        path.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": self.hosts}}}}))
        return str(path)

    def run(self, playbook, extra_vars=None, check=False, limit=None):
        playbook = playbook if os.path.isabs(playbook) else os.path.join(REPO, playbook)
        cmd = [os.path.join(BIN, "ansible-playbook"), "-i", self.inventory(), playbook]
        if extra_vars:
            cmd += ["-e", json.dumps(extra_vars)]
        if check:
            cmd.append("--check")
        if limit:
            cmd += ["--limit", limit]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=900, check=False)
        proc.recap = recap(proc.stdout)
        self.runs = getattr(self, "runs", 0) + 1
        (self.dir / ("run-%d.log" % self.runs)).write_text(proc.stdout + proc.stderr)  # for post-mortems
        return proc

    def digest(self, name):
        with open(self.state_path(name), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    def devices(self, name):
        """{gpu index: {profile name: count}} from the simulated host."""
        from gpuops_mig_sim import models
        out = {}
        for gpu in sim.load_state(self.state_path(name))["gpus"]:
            counts = {}
            for gi in gpu["gpu_instances"]:
                profile = models.gi_profile_by_id(models.MODELS[gpu["model"]], gi["profile_id"]).name
                counts[profile] = counts.get(profile, 0) + 1
            out[gpu["index"]] = counts
        return out


def recap(stdout):
    """{host: {"ok": n, "changed": n, "failed": n, ...}} from the PLAY RECAP (last one wins)."""
    hosts = {}
    for host, fields in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.M):
        hosts[host] = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", fields))
    return hosts


def output(proc):
    return proc.stdout[-12000:] + proc.stderr[-4000:]


def device_plugin_daemonsets():
    """The plugin and GFD as the chart names them; the DaemonSet controller makes their pods, kwok
    starts them, and the deviceplugin.py stand-in plays both daemons (MIG strategy mixed)."""
    plugin = seed.daemonset("nvidia-device-plugin", namespace="nvidia-device-plugin",
                            labels={"app.kubernetes.io/name": "nvidia-device-plugin"}, env={"MIG_STRATEGY": "mixed"})
    gfd = seed.daemonset("nvidia-device-plugin-gpu-feature-discovery", namespace="nvidia-device-plugin",
                         labels={"app.kubernetes.io/name": "nvidia-device-plugin-gpu-feature-discovery"},
                         env={"MIG_STRATEGY": "mixed"})
    return [plugin, gfd]


def wait_device_plugin_running(cluster):
    """Returns once the plugin and GFD run on every node and their stand-ins have labelled the
    nodes (after a watch event, not inside the seed's write): the nodes a rollout would meet."""
    cluster.wait_for(lambda: daemonsets_rolled_out(cluster, "nvidia-device-plugin"),
                     "the device plugin and GFD to run")
    cluster.stand_ins.sync()


def node_history(cluster):
    """Records, per node, each change of the MIG state label, of the cordon and of the operand labels."""
    history = {}

    def record(event):
        labels = event.obj["metadata"].get("labels") or {}
        entry = (labels.get(STATE), bool((event.obj.get("spec") or {}).get("unschedulable")),
                 labels.get(DCGM_EXPORTER))
        seen = history.setdefault(event.obj["metadata"]["name"], [])
        if not seen or seen[-1] != entry:
            seen.append(entry)
    cluster.on("modified", record, kind="Node")
    return history


# --------------------------------------------------------------------------------------------------
# mig_node
# --------------------------------------------------------------------------------------------------

def test_node_workflow_end_to_end_then_converged_rerun(cluster, cluster_env, tmp_path):
    """Four nodes in one run: a full rollout with a budget that blocks evictions for a while, a node
    that needs a reboot, a node that fails part-way, and a single-strategy layout refused up front.
    Then a re-run of the two good nodes changes nothing and drains nothing."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    operand = {DCGM_EXPORTER: "true", GFD_DEPLOY: "false"}
    # node-a: GPU Operator style (config name from the node label), a host service holding the GPUs,
    # a GPU pod guarded by a budget that refuses the first evictions.
    a = fleet.add("node-a", "2xA100-SXM4-40GB", node_labels=dict(operand, **{CONFIG: "all-balanced"}),
                  mig_node_config_file=os.path.join(EXAMPLE, "mig-parted-config.yaml"), mig_node_smoke_test=True,
                  gpuops_mig_driver_root="")   # empty: not set (auto) to the role, though the modules refuse ""
    sim.set_host(a, add_clients=["nvidia-dcgm"])
    # node-b: a passthrough VM; the GPU reset is refused, so the node reboots (simulated), and the
    # boot-time restore recreates the layout at boot.
    # Only pods that use GPUs leave it, and an admin had cordoned it already: it stays cordoned.
    b = fleet.add("node-b", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}],
                  mig_node_drain_gpu_pods_only=True)
    sim.set_host(b, passthrough=True)
    cluster.patch("Node", "node-b", {"spec": {"unschedulable": True}})
    # node-c: creating a GPU instance fails (injected NVML fault) after the clients were paused.
    c = fleet.add("node-c", "1xH100-SXM5-80GB", node_labels=operand, mig_node_persist=False,
                  mig_node_layouts=[{"gpus": "all", "devices": {"3g.40gb": 2}}])
    sim.set_host(c, add_clients=["nvidia-dcgm"])
    sim.add_fault(c, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    # node-d: the single strategy cannot advertise two device types on one node.
    fleet.add("node-d", "1xA100-SXM4-40GB", mig_node_mig_strategy="single",
              mig_node_layouts=[{"gpus": "all", "devices": {"3g.20gb": 1, "2g.10gb": 1}}])
    d_before = fleet.digest("node-d")
    # box-g (no Kubernetes): a pending mode that even the reboot does not apply fails clearly.
    g = fleet.add("box-g", "1xA30-24GB", kubernetes=False, mig_node_persist=False,
                  mig_node_layouts=[{"gpus": "all", "devices": {}}])
    sim.set_host(g, passthrough=True, mode_change_survives_reboot=False)
    # node-h: a passthrough VM that never comes back from its reboot (the boot id never changes).
    h = fleet.add("node-h", "1xA30-24GB", node_labels=operand, mig_node_persist=False,
                  mig_node_layouts=[{"gpus": "all", "devices": {"4g.24gb": 1}}],
                  mig_node_reboot_command="/bin/true", mig_node_reboot_timeout=5)
    sim.set_host(h, passthrough=True, add_clients=["nvidia-dcgm"])

    cluster.seed(
        *device_plugin_daemonsets(),
        seed.daemonset("dcgm-exporter", namespace="gpu-operator", labels={"app": "nvidia-dcgm-exporter"},
                       node_selector={DCGM_EXPORTER: "true"}),
        seed.pod("train-0", node="node-a", namespace="ml", labels={"app": "train"},
                 owner=("ReplicaSet", "train-7d9f"), limits={"nvidia.com/gpu": 1}),
        seed.pdb("train", {"app": "train"}, namespace="ml", disruptions_allowed=0),
        seed.pod("web-0", node="node-b", owner=("ReplicaSet", "web-6c4f")),
        seed.pod("infer-0", node="node-b", owner=("ReplicaSet", "infer-6c4f"), limits={"nvidia.com/mig-1g.6gb": 1}),
    )
    refusals = []

    def budget(event):  # let the eviction through after two refusals (429s in the audit log)
        refusals.append(event.obj["metadata"]["name"])
        if len(refusals) == 2:
            cluster.patch("PodDisruptionBudget", "train", {"spec": {"maxUnavailable": 1}}, "ml")
    cluster.on("eviction-refused", budget)
    wait_device_plugin_running(cluster)  # the history starts from nodes at rest
    history = node_history(cluster)
    smoke = []

    def run_smoke(event):  # each smoke workload succeeds once kwok started it
        if "gpuops.mig/smoke-test" in (event.obj["metadata"].get("labels") or {}) \
                and event.obj["status"].get("phase") == "Running":
            limits = event.obj["spec"]["containers"][0]["resources"]["limits"]
            smoke.append(dict((k, str(v)) for k, v in limits.items()))
            cluster.set_status("Pod", event.obj["metadata"]["name"],
                               dict(event.obj["status"], phase="Succeeded"), "default")
    cluster.on("modified", run_smoke, kind="Pod")

    # Survey answers arrive as strings.
    awx = {"mig_node_pause_operands": "true", "mig_node_drain_timeout": "60",
           "mig_node_validate_timeout": "30", "mig_node_validate_delay": "1", "mig_node_reset_gpus": "true"}
    proc = fleet.run("tests/integration/playbooks/mig_node.yml", awx)
    out = proc.stdout + proc.stderr
    assert proc.recap["node-a"]["failed"] == 0 and proc.recap["node-b"]["failed"] == 0, output(proc)
    assert proc.recap["node-c"]["failed"] == 1 and proc.recap["node-d"]["failed"] == 1, output(proc)
    assert proc.recap["box-g"]["failed"] == 1, output(proc)

    # node-a: converged to all-balanced, the budget was respected, clients paused and restored.
    balanced = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    assert fleet.devices("node-a") == {0: balanced, 1: balanced}
    assert refusals == ["train-0", "train-0"]
    assert cluster.find("Pod", "train-0", "ml") is None
    assert any(
        r.method == "POST" and r.path.endswith("/pods/train-0/eviction") for r in cluster.requests
    )
    assert history["node-a"][0] == ("pending", True, "true")              # pending and cordoned at once
    assert ("pending", True, "paused-for-mig-change") in history["node-a"]  # operands paused
    assert history["node-a"][-1] == ("success", False, "true")             # restored, done, uncordoned
    node = cluster.get("Node", "node-a")
    assert node["metadata"]["labels"][GFD_DEPLOY] == "false"              # "false" is left alone
    assert "gpuops.mig/cordoned" not in (node["metadata"].get("annotations") or {})
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "4"
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.20gb"] == "2"
    assert sim.load_state(a)["host"]["clients"] == ["nvidia-dcgm"]        # stopped for the reset, back again
    # operand is back
    assert cluster.list("Pod", "gpu-operator", field_selector="spec.nodeName=node-a")
    assert sorted(smoke, key=str) == [{"nvidia.com/mig-1g.5gb": "1"}, {"nvidia.com/mig-2g.10gb": "1"},
                                      {"nvidia.com/mig-3g.20gb": "1"}]
    assert cluster.list("Pod", "default", label_selector="gpuops.mig/smoke-test") == []
    desired = json.loads((fleet.dir / "node-a" / "etc" / "gpuops-mig" / "desired.json").read_text())
    assert desired["config_name"] == "all-balanced" and "mig-configs" in desired["config"]

    # node-b: the reset was refused, the node rebooted once, the boot-time restore made the layout.
    assert fleet.devices("node-b") == {0: {"2g.12gb": 2}}
    assert sim.load_state(b)["boot_count"] == 1
    assert history["node-b"] == [("pending", True, None), ("rebooting", True, None), ("pending", True, None),
                                 ("success", True, None)]
    boot_log = open(b + ".boot.log").read()
    assert "gpuops-mig-restore.service: exit 0" in boot_log and "2g.12gb x2 (created)" in boot_log
    assert cluster.find("Pod", "infer-0") is None and cluster.find("Pod", "web-0")  # GPU pods only
    assert cluster.get("Node", "node-b")["spec"]["unschedulable"] is True  # not ours to uncordon

    # node-c: failed part-way: clients restored, state failed, still cordoned, the reason shown.
    node = cluster.get("Node", "node-c")
    assert node["metadata"]["labels"][STATE] == "failed"
    assert node["metadata"]["labels"][DCGM_EXPORTER] == "true"
    assert node["spec"]["unschedulable"] is True
    assert sim.load_state(c)["host"]["clients"] == ["nvidia-dcgm"]
    assert ("pending", True, "paused-for-mig-change") in history["node-c"]
    assert re.search(r"MIG reconfiguration of node-c failed at 'Apply the MIG geometry'.*insufficient resources",
                     out, re.S | re.I), output(proc)

    # node-d: refused before any change.
    assert fleet.digest("node-d") == d_before
    assert "node-d" not in history
    assert "with mig_node_mig_strategy=single every GPU of the node must be MIG-enabled with one and the same" in out
    assert "GPU 0 (NVIDIA A100-SXM4-40GB): 2g.10gb, 3g.20gb" in out

    # box-g: rebooted once, the mode is still pending: it fails and says so.
    assert sim.load_state(g)["boot_count"] == 1
    assert "box-g: the MIG mode is still wrong after the reboot on GPU 0 (NVIDIA A30: current disabled, " \
           "pending enabled" in out

    # node-h: gave up after the reboot timeout; the operands are unpaused through the API, but the
    # host services are not started on a host that is down, and the message says so.
    node = cluster.get("Node", "node-h")
    assert node["metadata"]["labels"][STATE] == "failed" and node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][DCGM_EXPORTER] == "true"
    assert sim.load_state(h)["host"]["clients"] == []
    assert re.search(r"MIG reconfiguration of node-h failed at 'Wait for the new boot': no new boot id[.] "
                     r"The host did not come back from its reboot within 5 s: bring it up", out), output(proc)
    assert "node-h failed at 'Wait for the new boot'" in out and "GPU clients were restored" not in \
        out.split("MIG reconfiguration of node-h")[1].split("\n")[0]

    # The converged nodes again: nothing changes, nothing is drained or patched.
    seen = len(cluster.requests)
    digests = {name: fleet.digest(name) for name in ("node-a", "node-b")}
    again = fleet.run("tests/integration/playbooks/mig_node.yml", awx, limit="node-a,node-b")
    assert again.recap["node-a"] == dict(again.recap["node-a"], changed=0, failed=0), output(again)
    assert again.recap["node-b"] == dict(again.recap["node-b"], changed=0, failed=0), output(again)
    writes = [r for r in cluster.requests[seen:] if r.method in ("POST", "PATCH", "PUT", "DELETE")]
    assert writes == []
    assert {name: fleet.digest(name) for name in digests} == digests


def test_a_failed_drain_leaves_the_boot_time_restore_of_the_layout_the_node_holds(
    cluster, cluster_env, tmp_path
):
    """The new restore comes only inside the window: a node whose drain fails keeps the restore of the
    layout its GPUs hold, so a reboot before the next run does not apply the new one under its pods."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("node-p", "1xA100-SXM4-40GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.20gb": 2}}],
              mig_node_validate=False, mig_node_device_plugin_restart=False)
    desired = fleet.dir / "node-p" / "etc" / "gpuops-mig" / "desired.json"
    first = fleet.run("tests/integration/playbooks/mig_node.yml")
    assert first.recap["node-p"]["failed"] == 0, output(first)
    old = desired.read_text()
    assert json.loads(old)["layouts"] == [{"gpus": "all", "devices": {"3g.20gb": 2}}]

    cluster.seed(seed.pod("db-0", node="node-p", labels={"app": "db"},
                          owner=("ReplicaSet", "db-1")),
                 seed.pdb("db", {"app": "db"}, disruptions_allowed=0))
    before = fleet.digest("node-p")
    proc = fleet.run("tests/integration/playbooks/mig_node.yml", {
        "mig_node_layouts": [{"gpus": "all", "devices": {"1g.5gb": 7}}],
        "mig_node_drain_timeout": 2, "mig_node_validate_delay": 1})
    assert proc.recap["node-p"]["failed"] == 1, output(proc)
    assert re.search(r"MIG reconfiguration of node-p failed at '[^']*'.*db-0", proc.stdout, re.S), output(proc)
    assert cluster.get("Node", "node-p")["metadata"]["labels"][STATE] == "failed"
    assert fleet.digest("node-p") == before                      # the GPUs are untouched
    assert desired.read_text() == old                            # and so is their restore

    # MIG off once the budget lets the pod go: the restore is removed inside the window too.
    cluster.patch("PodDisruptionBudget", "db", {"spec": {"maxUnavailable": 1}})
    off = fleet.run("playbooks/disable.yml", {"mig_node_validate_delay": 1})
    assert off.recap["node-p"]["failed"] == 0, output(off)
    assert [g["mig"] for g in sim.load_state(fleet.state_path("node-p"))["gpus"]] == [{"current": 0, "pending": 0}]
    assert not desired.exists() and not (fleet.dir / "node-p" / "etc" / "systemd" / "system" /
                                         "gpuops-mig-restore.service").exists()


def test_node_check_mode_changes_nothing(cluster, cluster_env, tmp_path):
    """--check predicts the change and touches neither the GPUs, the node, nor the host's files."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("node-e", "1xH100-SXM5-80GB", node_labels={DCGM_EXPORTER: "true"},
              mig_node_layouts=[{"gpus": "all", "devices": {"1g.10gb": 7}}])
    fleet.add("box-f", "1xA100-SXM4-40GB", kubernetes=False, mig_node_persist=False,
              mig_node_layouts=[{"gpus": "all", "devices": {"7g.40gb": 1}}],
              mig_node_reboot_post_delay=0)   # deprecated: accepted, and said once
    cluster.seed(seed.pod("web-0", node="node-e", owner=("ReplicaSet", "web-1")))
    before = {name: fleet.digest(name) for name in ("node-e", "box-f")}

    proc = fleet.run("tests/integration/playbooks/mig_node.yml", check=True)
    assert proc.returncode == 0, output(proc)
    said = "mig_node_reboot_post_delay is deprecated and goes in gpuops.mig 1.0.0"
    assert (proc.stdout + proc.stderr).count(said) == 1, output(proc)
    assert "layout 'custom' is not in place: MIG mode change and geometry change needed" in proc.stdout
    assert {name: fleet.digest(name) for name in before} == before
    writes = [r for r in cluster.requests if r.method in ("POST", "PATCH", "PUT", "DELETE")]
    assert writes == [], writes
    root = fleet.dir / "node-e"      # nothing under the host's root but the driver's /proc (the simulator's)
    assert not root.exists() or sorted(p.name for p in root.iterdir()) == ["proc"]


def test_preview_reads_a_configmap_named_in_play_vars_and_checks_the_role_variables(
    cluster, cluster_env, tmp_path
):
    """The batch's one cluster read covers a ConfigMap named by play vars (which other hosts' hostvars do not
    show), and the preview checks the role variables against the role's argument spec itself (site.yml
    imports it with rolespec_validate false)."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("node-g", "1xH100-SXM5-80GB")
    cluster.seed(seed.namespace("mig-configs"), {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fleet-mig", "namespace": "mig-configs"},
        "data": {"config.yaml": "version: v1\nmig-configs:\n  half: [{devices: all, mig-enabled: true, "
                                "mig-devices: {3g.40gb: 2}}]\n"}})
    playbook = tmp_path / "preview.yml"

    def preview(play_vars):
        playbook.write_text(yaml.safe_dump([{
            "name": "Preview", "hosts": "all", "gather_facts": False, "environment": "{{ gpuops_mig_environment }}",
            "vars": dict({"mig_node_config_configmap": "mig-configs/fleet-mig",
                          "mig_node_config_name": "half"}, **play_vars),
            "tasks": [{"ansible.builtin.import_role": {"name": "gpuops.mig.mig_node", "tasks_from": "preview",
                                                       "rolespec_validate": False}},
                      {"ansible.builtin.debug": {"msg": "SOURCE {{ mig_node_preview.source.origin"
                                                        " | default('inline') }}: {{ mig_node_preview.msg }}"}}]}]))
        return fleet.run(str(playbook))

    proc = preview({})
    assert proc.returncode == 0, output(proc)
    assert "SOURCE ConfigMap mig-configs/fleet-mig (key config.yaml)" in proc.stdout, output(proc)
    assert "layout 'half' is not in place" in proc.stdout
    # The namespace in its own variable, deprecated: still read, and said once.
    proc = preview({"mig_node_config_configmap": "fleet-mig", "mig_node_config_configmap_namespace": "mig-configs"})
    assert proc.returncode == 0, output(proc)
    assert "SOURCE ConfigMap mig-configs/fleet-mig (key config.yaml)" in proc.stdout, output(proc)
    said = "mig_node_config_configmap_namespace is deprecated and goes in gpuops.mig 1.0.0"
    assert (proc.stdout + proc.stderr).count(said) == 1, output(proc)
    # A namespace set where no ConfigMap is named (group_vars for a whole fleet) names no source.
    proc = preview({"mig_node_config_configmap": "", "mig_node_config_configmap_namespace": "mig-configs",
                    "mig_node_config_name": "", "mig_node_layouts": [{"gpus": "all", "devices": {"7g.80gb": 1}}]})
    assert proc.returncode == 0, output(proc)
    assert "SOURCE inline: " in proc.stdout, output(proc)

    before = fleet.digest("node-g")
    proc = preview({"mig_node_config_configmap": "Mig-Configs/fleet-mig"})
    assert proc.returncode != 0
    assert "node-g: mig_node_config_configmap must be a ConfigMap name or namespace/name" in proc.stdout, \
        output(proc)
    proc = preview({"mig_node_drain_timeout": "soon"})
    assert proc.returncode != 0
    assert "node-g: the mig_node role's variables are wrong, nothing was changed: argument " \
           "'mig_node_drain_timeout' is of type str" in proc.stdout, output(proc)
    assert fleet.digest("node-g") == before


# --------------------------------------------------------------------------------------------------
# mig_preflight
# --------------------------------------------------------------------------------------------------

def test_preflight_says_what_is_wrong_and_how_to_fix_it(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.add("good", "2xH100-SXM5-80GB", kubernetes=False, mig_preflight_kubernetes=True)
    fleet.add("no-mig", "1xA10", kubernetes=False)
    fleet.add("old-driver", "1xH200", kubernetes=False, driver="535.183.01")
    fleet.add("old-toolkit", "1xA100-SXM4-40GB", kubernetes=False, mig_preflight_kubernetes=True,
              gpuops_mig_environment_extra={"GPUOPS_SIM_CTK_VERSION": "1.14.0"})
    for name, skip in (("no-containers", {"mig_preflight_container_toolkit_command": ""}),
                       ("no-containers-old", {"mig_preflight_check_container_toolkit": False})):  # deprecated
        fleet.add(name, "1xA100-SXM4-40GB", kubernetes=False, mig_preflight_kubernetes=True,
                  gpuops_mig_environment_extra={"GPUOPS_SIM_CTK_VERSION": "1.14.0"}, **skip)
    fleet.add("no-nvml", "1xA100-SXM4-40GB", kubernetes=False, ansible_python_interpreter="/usr/bin/python3")
    # The modules refuse an empty driver_root; to the roles, as for their other settings, empty is not set.
    fleet.add("empty-root", "1xH100-SXM5-80GB", kubernetes=False, gpuops_mig_driver_root="")
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Preflight", "hosts": "all", "gather_facts": False,
        "environment": "{{ gpuops_mig_environment | combine(gpuops_mig_environment_extra | default({})) }}",
        "roles": [{"role": "gpuops.mig.mig_preflight"}]}]))
    proc = fleet.run(str(playbook))
    out = proc.stdout + proc.stderr
    assert proc.recap["good"]["failed"] == 0 and proc.recap["empty-root"]["failed"] == 0, output(proc)
    assert proc.recap["no-containers"]["failed"] == proc.recap["no-containers-old"]["failed"] == 0, output(proc)
    assert "good: driver 570.124.06, 2 MIG-capable GPU(s) of 2 (NVIDIA H100 80GB HBM3), NVIDIA Container " \
           "Toolkit 1.17.8." in out
    assert "no-mig: no MIG-capable GPU found (GPUs: NVIDIA A10)" in out
    assert "old-driver: driver 535.183.01 is too old for MIG on GPU 0 (NVIDIA H200), which needs 550.90.07 or newer" in out
    assert "old-toolkit: NVIDIA Container Toolkit 1.14.0 is older than 1.17.8" in out
    assert "set mig_preflight_container_toolkit_command to '' for hosts that run no containers" in out
    assert "no-nvml: nvidia-ml-py (import pynvml) is not importable by /usr/bin/python3" in out
    assert all(proc.recap[h]["failed"] == 1 for h in ("no-mig", "old-driver", "old-toolkit", "no-nvml")), output(proc)


# --------------------------------------------------------------------------------------------------
# mig_device_plugin
# --------------------------------------------------------------------------------------------------

def test_device_plugin_deployed_with_helm(cluster, admin_env, tmp_path):
    """The real helm binary installs the (stand-in) chart with the MIG strategy, GFD and merged values;
    a second run changes nothing; a strategy change upgrades the release."""
    cluster.seed(seed.node("gpu-1", {"nvidia.com/gpu.present": "true"}))
    playbook = tmp_path / "plugin.yml"
    role = {"role": "gpuops.mig.mig_device_plugin", "vars": {
        "mig_device_plugin_chart_ref": CHART, "mig_device_plugin_chart_repo_url": "",
        "mig_device_plugin_helm_binary": os.path.join(BIN, "helm"),
        "mig_device_plugin_mig_strategy": "{{ strategy }}",
        "mig_device_plugin_values": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}}}
    playbook.write_text(yaml.safe_dump([{"name": "Device plugin", "hosts": "localhost", "gather_facts": False,
                                         "roles": [role]}]))
    fleet = Fleet(tmp_path, cluster, admin_env)

    first = fleet.run(str(playbook), {"strategy": "single"})
    assert first.recap["localhost"]["changed"] == 1, output(first)
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin", "nvidia-device-plugin")
    container = plugin["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "MIG_STRATEGY", "value": "single"} in container["env"]
    assert plugin["spec"]["template"]["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert cluster.find(
        "DaemonSet", "nvidia-device-plugin-gpu-feature-discovery", "nvidia-device-plugin"
    )
    assert cluster.list("Pod", "nvidia-device-plugin", field_selector="spec.nodeName=gpu-1")

    second = fleet.run(str(playbook), {"strategy": "single"})
    assert second.recap["localhost"]["changed"] == 0, output(second)
    third = fleet.run(str(playbook), {"strategy": "mixed"})
    assert third.recap["localhost"]["changed"] == 1, output(third)
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin", "nvidia-device-plugin")
    assert {"name": "MIG_STRATEGY", "value": "mixed"} in plugin["spec"]["template"]["spec"]["containers"][0]["env"]
