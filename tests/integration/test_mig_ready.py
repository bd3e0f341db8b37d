"""The MIG-ready gate on the real test cluster: ansible-rulebook runs the source
gpuops.mig.mig_ready and the rulebook extensions/eda/rulebooks/mig_ready.yml (each decision is
playbooks/mig_ready.yml); the real kube-scheduler honours the startup taint; the NVIDIA stand-ins
advertise what the simulated GPUs hold.

Nodes join as an autoscaler would add them: registered with the startup taint and a preset
nvidia.com/mig.config label, GPU pods already waiting for them.
"""

import json
import os
import shutil
import subprocess
import time

import pytest
import yaml

import gpuops_mig_sim as sim
from test_eda_loop import _java, stop_rulebook
from test_roles import Fleet
from tests.integration.conftest import RBAC, ROLLOUT_RBAC, client_env
from tests.support.kubeapi import seed
from tests.support.simhost import nvml_on

pytestmark = pytest.mark.playbook

BIN = os.path.dirname(os.path.abspath(__import__("sys").executable))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAINT = {"key": "gpuops.mig/not-ready", "effect": "NoSchedule"}
MIG_1G = "nvidia.com/mig-1g.10gb"
CONDITION = "gpuops.mig/MIGReady"
CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    },
}
POOLS = {
    "h100-1g": {"node_labels": {"pool": "h100-1g"}, "config": CONFIG, "gpus": 1},
    "h100-3g": {
        "node_labels": {"pool": "h100-3g"},
        "gpus": 1,
        "layouts": [{"gpus": "all", "devices": {"3g.40gb": 2}}],
    },
}


def start_watcher(workdir, env, pools, converge, workflow_hosts=None, group_vars=None):
    """ansible-rulebook with gpuops.mig.mig_ready in ``workdir``, watching ``pools``: the
    inventory names localhost, and ``workflow_hosts`` ({name: vars}) in gpu_nodes with
    ``group_vars`` (a directory, copied) when the overdue path may run the workflow on them.
    Returns the process and its open log."""
    inventory = workdir / "inventory"
    inventory.mkdir()
    if group_vars:
        shutil.copytree(str(group_vars), str(inventory / "group_vars"))
    localhost = {"ansible_connection": "local", "ansible_python_interpreter": os.path.join(BIN, "python")}
    everyone = {"hosts": {"localhost": localhost}, "vars": {"gpuops_mig_ready_pools": pools}}
    if workflow_hosts:
        everyone["children"] = {"gpu_nodes": {"hosts": dict(workflow_hosts)}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": everyone}))
    gate_vars = workdir / "gate-vars.yml"
    gate_vars.write_text(yaml.safe_dump({"gpuops_mig_ready_converge_seconds": converge}))
    log = open(str(workdir / "rulebook.log"), "w")
    command = [os.path.join(BIN, "ansible-rulebook"), "-i", str(inventory),
               "--rulebook", "gpuops.mig.mig_ready", "--vars", str(gate_vars), "-v"]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=str(workdir))
    return proc, log


def plugin_daemonsets():
    """The device plugin and GFD (mixed strategy), tolerating the startup taint as they must."""
    out = []
    for name in ("nvidia-device-plugin", "nvidia-device-plugin-gpu-feature-discovery"):
        out.append(
            seed.daemonset(
                name,
                namespace="nvidia-device-plugin",
                labels={"app.kubernetes.io/name": name},
                env={"MIG_STRATEGY": "mixed"},
                tolerations=[{"key": TAINT["key"], "operator": "Exists"}],
            )
        )
    return out


def apply_layout(state, count, profile=(19, 1, 0)):
    """What the boot-time restore does before kubelet: MIG on, ``count`` 1g.10gb devices
    (``profile``: GPU instance profile ID, its size, compute instance profile)."""
    sim.create_state(
        state, "1xH100-SXM5-80GB", seed=os.path.basename(state), mig="enabled", force=True
    )
    gi_profile, size, ci_profile = profile
    with nvml_on(state) as nvml:
        for start in range(0, count * size, size):
            gi = nvml.create_gpu_instance(0, gi_profile, start, size)
            nvml.create_compute_instance(0, gi, ci_profile, 0)


def restart_plugins(cluster, node):
    """The plugin and GFD read the GPUs when they start, as after a boot: their pods are
    recreated."""
    for pod in cluster.list("Pod", "nvidia-device-plugin", field_selector="spec.nodeName=" + node):
        cluster.delete("Pod", pod["metadata"]["name"], "nvidia-device-plugin", grace_period=0)


def tainted(node):
    return any(t.get("key") == TAINT["key"] for t in (node.get("spec") or {}).get("taints") or [])


def condition(node):
    return next(
        (c for c in (node.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION),
        None,
    )


def test_a_joining_node_takes_gpu_pods_only_once_its_layout_is_advertised_a_failed_one_never(
    cluster, tmp_path
):
    _java()
    # The watcher runs as what rbac/ready.yml grants, with the rollout's roles.
    env = ready_env(cluster, tmp_path)
    fleet = Fleet(tmp_path, cluster, env)
    good, bad = fleet.state_path("gpu-new"), fleet.state_path("gpu-bad")
    sim.create_state(
        good, "1xH100-SXM5-80GB", seed="gpu-new"
    )  # MIG not applied yet: one whole GPU
    apply_layout(bad, 3)  # its boot-time restore failed part-way: 3 of the 7 devices
    baked = fleet.state_path("gpu-baked")
    apply_layout(baked, 2, profile=(9, 4, 2))  # a bootstrapped image: 2 x 3g.40gb before kubelet
    cluster.seed(*plugin_daemonsets())

    # What binds where, and when each taint went (resourceVersions of one etcd: a total order).
    binds, lifts = {}, {}

    def on_pod(event):
        name, node = event.obj["metadata"]["name"], (event.obj.get("spec") or {}).get("nodeName")
        if node and name.startswith("wants-") and name not in binds:
            binds[name] = (node, int(event.obj["metadata"]["resourceVersion"]))

    def on_node(event):
        name = event.obj["metadata"]["name"]
        if not tainted(event.obj) and name not in lifts:
            lifts[name] = (int(event.obj["metadata"]["resourceVersion"]), time.time())

    cluster.on("modified", on_pod, kind="Pod")
    cluster.on("modified", on_node, kind="Node")

    labels = {
        "pool": "h100-1g",
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/gpu.present": "true",
    }
    registered = time.time()
    cluster.seed(
        seed.node("gpu-new", labels, taints=[TAINT], nvml_state=good),
        seed.node("gpu-bad", labels, taints=[TAINT], nvml_state=bad),
        seed.node("gpu-baked", {"pool": "h100-3g"}, taints=[TAINT], nvml_state=baked),
    )
    cluster.seed(
        seed.pod("wants-mig-0", limits={MIG_1G: 1}),
        seed.pod("wants-mig-1", limits={MIG_1G: 1}),
        seed.pod("wants-whole", limits={"nvidia.com/gpu": 1}),
    )
    # The plugin advertises the whole GPU on gpu-new and 3 MIG devices on gpu-bad: without the
    # taint the scheduler would bind the pods there at once.
    cluster.wait_for(
        lambda: cluster.get("Node", "gpu-new")["status"]["allocatable"].get("nvidia.com/gpu")
        == "1"
        and cluster.get("Node", "gpu-bad")["status"]["allocatable"].get(MIG_1G) == "3",
        "the device plugin to advertise both nodes",
        timeout=60,
    )
    cluster.wait_for(
        lambda: "untolerated taint" in str(cluster.get("Pod", "wants-whole")["status"]),
        "the scheduler to keep the pods off the tainted nodes",
        timeout=60,
    )

    proc, log = start_watcher(tmp_path, fleet.env, POOLS, converge=3600)
    try:
        # 1. The first decision: neither node is ready; each condition says what is missing.
        cluster.wait_for(
            lambda: condition(cluster.get("Node", "gpu-new"))
            and condition(cluster.get("Node", "gpu-bad")),
            "the gate's first decision",
            timeout=180,
        )
        new, failed = condition(cluster.get("Node", "gpu-new")), condition(
            cluster.get("Node", "gpu-bad")
        )
        assert new["status"] == "False" and new["message"].startswith(
            "device plugin advertises nvidia.com/mig-1g.10gb: 0, declared 7"
        ), new
        assert failed["status"] == "False" and failed["reason"] == "MIGLayoutNotAdvertised"
        assert failed["message"].startswith(
            "device plugin advertises nvidia.com/mig-1g.10gb: 3, declared 7"
        )
        assert binds == {}

        # 2. gpu-new's boot-time restore applies the layout; its plugin and GFD start and advertise
        # it.
        cluster.wait_for(
            lambda: "gpu-baked" in lifts, "the gate to lift gpu-baked's taint", timeout=180
        )
        applied = time.time()
        apply_layout(good, 7)
        restart_plugins(cluster, "gpu-new")
        cluster.wait_for(
            lambda: "gpu-new" in lifts, "the gate to lift gpu-new's taint", timeout=180
        )
        cluster.wait_for(lambda: len(binds) == 2, "the MIG pods to bind", timeout=60)
        node = cluster.get("Node", "gpu-new")
        assert (
            condition(node)["status"] == "True" and condition(node)["reason"] == "MIGLayoutReady"
        )
        assert "nvidia.com/mig-1g.10gb: 7" in condition(node)["message"]
        # Both bound to gpu-new, after its taint was lifted; nothing ever bound to gpu-bad.
        assert {bind[0] for bind in binds.values()} == {"gpu-new"}, binds
        assert all(bind[1] > lifts["gpu-new"][0] for bind in binds.values()), (binds, lifts)
        time.sleep(3)
        bad_node = cluster.get("Node", "gpu-bad")
        assert tainted(bad_node) and "gpu-bad" not in lifts
        assert condition(bad_node)["status"] == "False"
        assert "wants-whole" not in binds  # no whole GPU is left anywhere
        print(
            "\nMEASURED registration -> lifted, layout in place: %.1f s; layout applied %.1f s "
            "after registration -> lifted %.1f s later"
            % (
                lifts["gpu-baked"][1] - registered,
                applied - registered,
                lifts["gpu-new"][1] - applied,
            )
        )
    finally:
        stop_rulebook(proc, tmp_path)
        log.close()
    gate_requests = [
        r
        for r in cluster.requests
        if r.resource.get("resource") == "nodes"
        and r.method == "PATCH"
        and r.resource.get("name") == "gpu-bad"
        and r.resource.get("subresource") != "status"
    ]
    assert gate_requests == [], "the gate wrote gpu-bad's taints: %s" % gate_requests


def ready_env(cluster, tmp_path):
    """A client environment as the ServiceAccount of rbac/ready.yml with the rollout's roles."""
    roles = ROLLOUT_RBAC + [os.path.join(RBAC, "ready.yml")]
    kubeconfig = cluster.service_account_kubeconfig(tmp_path / "ready.kubeconfig", "ready", roles)
    return client_env(kubeconfig, tmp_path, cluster.control_plane.bin_dir)


def test_a_taint_kubernetes_would_refuse_stops_the_gate_before_any_write(cluster, tmp_path):
    """The verdict (filter gpuops.mig.mig_ready) refuses the taint, naming the variable; the gate
    only read the Nodes."""
    cluster.seed(seed.node("gpu-new", {"pool": "h100-1g"}, taints=[TAINT]))
    env = ready_env(cluster, tmp_path)
    seen = len(cluster.requests)
    env = dict(env, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"))
    local = "localhost ansible_connection=local ansible_python_interpreter=%s" % os.path.join(
        BIN, "python")
    (tmp_path / "hosts").write_text(local + "\n")
    extra = {"gpuops_mig_ready_taint": "gpuops.mig/not-ready:NoRun",
             "gpuops_mig_ready_pools": POOLS}
    proc = subprocess.run(
        [os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "hosts"),
         "-e", json.dumps(extra), os.path.join(REPO, "playbooks", "mig_ready.yml")],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Decide for each held node" in out and "gpuops_mig_ready_taint" in out, out
    assert "a taint's effect is one of NoSchedule" in out, out
    gate = [r for r in cluster.requests[seen:] if r.user.endswith(":ready")]
    assert gate and [r for r in gate if r.method != "GET"] == []
    assert cluster.get("Node", "gpu-new")["spec"]["taints"][0]["key"] == TAINT["key"]
