"""The NVIDIA GPU Operator, its mig-manager, and NVIDIA's DRA kubelet plugin, as the API shows them.

Facts: reference gpu-operator.md sections 2 to 6 and mig-facts.md section 3.

While a ClusterPolicy (nvidia.com/v1) exists, the operator controller
- adds `nvidia.com/gpu.deploy.<operand>=true` on nodes labelled `nvidia.com/gpu.present=true`, only
  where the label is absent or empty (a `false` or `paused-for-mig-change` stays); `mig-manager` only on
  MIG-capable nodes (`nvidia.com/mig.capable=true`, else a product naming A100/A30/H100/H200);
  `nvidia.com/gpu.deploy.operands=false` removes them all;
- writes `nvidia.com/mig.config=all-disabled` on MIG-capable nodes without a (non-empty) mig.config when
  migManager is enabled and its config.default is `all-disabled`, whatever the mig-manager deploy label says
  (the real one does it on its reconcile triggers; here on every pass);
- keeps the operand DaemonSets in the ClusterPolicy's `status.namespace`: `nvidia-device-plugin-daemonset`,
  `gpu-feature-discovery` (both with MIG_STRATEGY) and `nvidia-mig-manager`, each on its deploy label, owned by
  the ClusterPolicy; gone when disabled or when the ClusterPolicy goes.

The simulated mig-manager acts, on a node linked to a simulated GPU host, when its pod starts (the node's
current `nvidia.com/mig.config`) and when that label's value changes (the same value again, or an empty one,
does nothing). In a worker thread, like mig-manager v0.15: the config name missing from the ConfigMap ->
state `failed`; already in place -> `success` at once; else `pending`, device plugin and GFD paused
(`paused-for-mig-change`), their pods gone, the config applied with the collection's own engine
(migmanager_engine.py in a subprocess), labels back to `true`, `success` or `failed`.
Knobs (node annotations): `kubeapi.test/mig-manager-wedge: once` makes the next run stop after pausing,
with the state left `pending` (gpu-operator issue 2833; the annotation is removed); a new mig-manager pod
puts paused labels back and applies the label again. `kubeapi.test/mig-manager-delay: <seconds>` slows
each step (default 0.2). The engine's output lands in `kubeapi.test/mig-manager-log`.

The simulated DRA kubelet plugin (pods labelled `app.kubernetes.io/name=dra-driver-nvidia-gpu`) publishes,
when it starts, the ResourceSlice `<node>-gpu.nvidia.com` with the node's MIG devices (type mig, profile,
uuid, parentUUID) and its GPUs without MIG (type gpu); a GPU with MIG on and no devices is left out. It
reads the GPUs only at start. With `DynamicMIG=true` in FEATURE_GATES it destroys, at start, every MIG
device it did not create (all of them), as the real one does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import yaml

from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

DEPLOY = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
WEDGE = "kubeapi.test/mig-manager-wedge"
DELAY = "kubeapi.test/mig-manager-delay"
LOG = "kubeapi.test/mig-manager-log"
OPERANDS = ("driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm", "dcgm-exporter",
            "node-status-exporter", "operator-validator")
MANAGED = {"app.kubernetes.io/managed-by": "gpu-operator"}
DRA_APP = "dra-driver-nvidia-gpu"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # cluster -> {node: (pod uid, value)}
_workers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # cluster -> {node: Thread}
_dra_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cluster -> {node: pod uid}


def policy_of(cluster):
    policies = sorted(cluster.list("ClusterPolicy"), key=lambda p: p["metadata"]["name"])
    return policies[0] if policies else None


def namespace_of(policy):
    return ((policy or {}).get("status") or {}).get("namespace") or "gpu-operator"


def mig_capable(labels):
    if "nvidia.com/mig.capable" in labels:
        return labels["nvidia.com/mig.capable"] == "true"
    product = labels.get("nvidia.com/gpu.product", "").lower()
    return any(name in product for name in ("a100", "a30", "h100", "h200"))


# -- the operator ----------------------------------------------------------------

def reconcile(cluster):
    policy = policy_of(cluster)
    if policy is None:
        for ds in cluster.list("DaemonSet", label_selector="app.kubernetes.io/managed-by=gpu-operator"):
            cluster.delete("DaemonSet", ds["metadata"]["name"], ds["metadata"]["namespace"])
        return
    spec = policy.get("spec") or {}
    namespace = namespace_of(policy)
    if cluster.find("Namespace", namespace) is None:
        cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    mig_manager = spec.get("migManager") or {}
    manager_on = mig_manager.get("enabled") is not False
    default = (mig_manager.get("config") or {}).get("default", "all-disabled")
    for node in cluster.list("Node"):
        _label_node(cluster, node, manager_on, default)
    strategy = (spec.get("mig") or {}).get("strategy") or ""
    wanted = {}
    if (spec.get("devicePlugin") or {}).get("enabled") is not False:
        wanted["nvidia-device-plugin-daemonset"] = _operand(policy, "nvidia-device-plugin-daemonset",
                                                            "device-plugin", strategy)
    if (spec.get("gfd") or {}).get("enabled") is not False:
        wanted["gpu-feature-discovery"] = _operand(policy, "gpu-feature-discovery", "gpu-feature-discovery", strategy)
    if manager_on:
        wanted["nvidia-mig-manager"] = _operand(policy, "nvidia-mig-manager", "mig-manager", None)
    for ds in cluster.list("DaemonSet", namespace, label_selector="app.kubernetes.io/managed-by=gpu-operator"):
        if ds["metadata"]["name"] not in wanted:
            cluster.delete("DaemonSet", ds["metadata"]["name"], namespace)
    for name, manifest in wanted.items():
        existing = cluster.find("DaemonSet", name, namespace)
        if existing is None:
            cluster.create(manifest)
        elif existing["spec"]["template"] != manifest["spec"]["template"]:
            cluster.patch("DaemonSet", name, {"spec": {"template": manifest["spec"]["template"]}}, namespace)


def _label_node(cluster, node, manager_on, default):
    labels = node["metadata"].get("labels") or {}
    if labels.get("nvidia.com/gpu.present") != "true":
        return
    change = {}
    if labels.get(DEPLOY + "operands") == "false":
        change = dict((k, None) for k in labels if k.startswith(DEPLOY) and k != DEPLOY + "operands")
    else:
        components = list(OPERANDS) + (["mig-manager"] if mig_capable(labels) else [])
        change = dict((DEPLOY + c, "true") for c in components if not labels.get(DEPLOY + c))
        if manager_on and default == "all-disabled" and mig_capable(labels) and not labels.get(CONFIG):
            change[CONFIG] = "all-disabled"
    if change:
        cluster.patch("Node", node["metadata"]["name"], {"metadata": {"labels": change}})


def _operand(policy, name, component, strategy):
    env = [{"name": "MIG_STRATEGY", "value": strategy}] if strategy else []
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace_of(policy), "labels": dict(MANAGED, app=name),
                     "ownerReferences": [{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                          "name": policy["metadata"]["name"], "uid": policy["metadata"]["uid"],
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"nodeSelector": {DEPLOY + component: "true"},
                                  "containers": [{"name": name, "image": "nvcr.io/nvidia/" + name, "env": env}]}},
        },
    }


# -- mig-manager -----------------------------------------------------------------

def mig_manager(cluster):
    """Start a worker where a mig-manager pod started or its node's mig.config changed (never blocks)."""
    seen = _seen.setdefault(cluster, {})
    policy = policy_of(cluster)
    if policy is None:
        return
    for pod in cluster.list("Pod", namespace_of(policy), label_selector="app=nvidia-mig-manager"):
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = cluster.find("Node", node_name) if node_name else None
        if node is None or pod["metadata"].get("deletionTimestamp"):
            continue
        if not (node["metadata"].get("annotations") or {}).get(NVML_STATE_ANNOTATION):
            continue
        value = (node["metadata"].get("labels") or {}).get(CONFIG, "")
        before = seen.get(node_name)
        started = before is None or before[0] != pod["metadata"]["uid"]
        seen[node_name] = (pod["metadata"]["uid"], value)
        if started or (value and value != before[1]):
            _start_worker(cluster, node_name, pod["metadata"]["uid"], value)


def _start_worker(cluster, node_name, pod_uid, value):
    workers = _workers.setdefault(cluster, {})
    thread = threading.Thread(target=_run_guarded, args=(cluster, node_name, pod_uid, value, workers.get(node_name)),
                              name="mig-manager-%s" % node_name, daemon=True)
    workers[node_name] = thread
    thread.start()


def wait_idle(cluster, timeout=60.0):
    """Wait until no simulated mig-manager is working (for tests)."""
    deadline = time.monotonic() + timeout
    for thread in list(_workers.get(cluster, {}).values()):
        thread.join(max(0.0, deadline - time.monotonic()))


def _run_guarded(cluster, node_name, pod_uid, value, previous):
    if previous is not None:
        previous.join()          # one run at a time per node, in order
    try:
        _run(cluster, node_name, pod_uid, value)
    except Exception as exc:    # a broken worker must fail the test
        cluster.errors.append(exc)


def _annotations(cluster, node_name):
    return cluster.get("Node", node_name)["metadata"].get("annotations") or {}


def _labels(cluster, node_name):
    return cluster.get("Node", node_name)["metadata"].get("labels") or {}


def _set_labels(cluster, node_name, labels, annotations=None):
    body = {"metadata": {"labels": labels}}
    if annotations:
        body["metadata"]["annotations"] = annotations
    with cluster.lock:
        cluster.patch("Node", node_name, body)


def _restore_paused(cluster, node_name):
    """Every deploy label left paused goes back to true (mig-manager's maybeSetTrue)."""
    paused = dict((k, "true") for k, v in _labels(cluster, node_name).items() if k.startswith(DEPLOY) and v == PAUSED)
    if paused:
        _set_labels(cluster, node_name, paused)


def _run(cluster, node_name, pod_uid, value):
    delay = float(_annotations(cluster, node_name).get(DELAY, "0.2"))
    time.sleep(delay)
    if not value:
        _restore_paused(cluster, node_name)
        return
    policy = policy_of(cluster)
    if policy is None:
        return
    namespace = namespace_of(policy)
    config_name = ((policy.get("spec") or {}).get("migManager") or {}).get("config", {}).get("name") \
        or "default-mig-parted-config"
    configmap = cluster.find("ConfigMap", config_name, namespace)
    text = ((configmap or {}).get("data") or {}).get("config.yaml", "")
    configs = ((yaml.safe_load(text) or {}) if text else {}).get("mig-configs") or {}
    if value not in configs:
        _restore_paused(cluster, node_name)
        _set_labels(cluster, node_name, {STATE: "failed"},
                    {LOG: "config %r is not in ConfigMap %s/%s" % (value, namespace, config_name)})
        return
    state = _annotations(cluster, node_name)[NVML_STATE_ANNOTATION]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(text)
    try:
        if _engine(state, handle.name, value, check=True)[0] == 10:
            _restore_paused(cluster, node_name)
            _set_labels(cluster, node_name, {STATE: "success"})
            return
        _set_labels(cluster, node_name, {STATE: "pending"})
        time.sleep(delay)
        labels = _labels(cluster, node_name)
        pause = dict((DEPLOY + c, PAUSED) for c in ("device-plugin", "gpu-feature-discovery")
                     if labels.get(DEPLOY + c) not in (None, "", "false"))
        if pause:
            _set_labels(cluster, node_name, pause)
        if _annotations(cluster, node_name).get(WEDGE) == "once":
            _set_labels(cluster, node_name, {}, {WEDGE: None})
            return                  # gpu-operator issue 2833: nothing restores the labels or the state
        _wait_operands_gone(cluster, node_name)
        rc, output = _engine(state, handle.name, value)
        _restore_paused(cluster, node_name)
        _set_labels(cluster, node_name, {STATE: "success" if rc == 0 else "failed"}, {LOG: output[-2000:]})
    finally:
        os.unlink(handle.name)


def _wait_operands_gone(cluster, node_name, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = [p for p in cluster.list("Pod", field_selector="spec.nodeName=%s" % node_name)
                if (p["metadata"].get("labels") or {}).get("app") in ("nvidia-device-plugin-daemonset",
                                                                        "gpu-feature-discovery")]
        if not pods:
            return
        time.sleep(0.1)


def _engine(state, config_file, name, check=False):
    return _run_engine(state, [config_file, name] + (["--check"] if check else []))


def _run_engine(state, args):
    # Inside mig-manager's container the driver is injected: use the simulated host's driver root, if any.
    driver_root = (_simulator()[0].load_state(state).get("host") or {}).get("driver_root") or ""
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=state, GPUOPS_SIM_DRIVER_ROOT=driver_root,
               PATH=os.path.join(REPO, "tools", "sim-bin") + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "simulator"),
                                           os.path.join(REPO, ".build", "collections")]))
    cmd = [sys.executable, "-m", "tests.support.kubeapi.migmanager_engine"] + args
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


# -- NVIDIA's DRA kubelet plugin ---------------------------------------------------

def dra_plugin(cluster):
    seen = _dra_seen.setdefault(cluster, {})
    for pod in cluster.list("Pod", label_selector="app.kubernetes.io/name=%s" % DRA_APP):
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = cluster.find("Node", node_name) if node_name else None
        if node is None or seen.get(node_name) == pod["metadata"]["uid"]:
            continue
        state = (node["metadata"].get("annotations") or {}).get(NVML_STATE_ANNOTATION)
        if not state:
            continue
        seen[node_name] = pod["metadata"]["uid"]
        if _dynamic_mig(pod):
            _destroy_all(state)
        _publish_slice(cluster, node_name, state)


def _dynamic_mig(pod):
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "FEATURE_GATES" and "DynamicMIG=true" in (env.get("value") or "").replace(" ", ""):
                return True
    return False


def _destroy_all(state):
    rc, output = _run_engine(state, ["--destroy-all"])
    if rc != 0:
        raise RuntimeError("simulated DRA driver could not destroy the MIG devices: " + output)


def _publish_slice(cluster, node_name, state):
    sim, models = _simulator()
    data = sim.load_state(state)
    devices = []
    for index, gpu in enumerate(data["gpus"]):
        model = models.MODELS[gpu["model"]]
        mig_on = bool(gpu.get("mig")) and gpu["mig"]["current"] == sim.MIG_ENABLE
        if not mig_on:
            devices.append({"name": "gpu-%d" % index, "attributes": {"type": {"string": "gpu"},
                                                                    "uuid": {"string": gpu["uuid"]}}})
            continue
        for gi in sorted(gpu.get("gpu_instances") or [], key=lambda g: g["id"]):
            profile = models.gi_profile_by_id(model, gi["profile_id"])
            for ci in gi.get("compute_instances") or []:
                if ci["size"] != profile.sm_slices:
                    continue
                devices.append({
                    "name": "gpu-%d-mig-%s-%d-%d" % (index, profile.name.replace(".", "").replace("+", "-"),
                                                     gi["profile_id"], gi["start"]),
                    "attributes": {"type": {"string": "mig"}, "profile": {"string": profile.name},
                                   "uuid": {"string": ci["uuid"]}, "parentUUID": {"string": gpu["uuid"]}},
                    "capacity": {"memory": {"value": "%dMi" % profile.memory_mib}},
                })
    name = "%s-gpu.nvidia.com" % node_name
    old = cluster.find("ResourceSlice", name)
    generation = ((old or {}).get("spec", {}).get("pool") or {}).get("generation", 0) + 1
    manifest = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                         "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                         "devices": devices}}
    if old is not None:
        cluster.delete("ResourceSlice", name)
    cluster.create(manifest)


def describe(cluster, node_name):
    """For post-mortems: the node's labels and the mig-manager log."""
    node = cluster.get("Node", node_name)
    return json.dumps({"labels": node["metadata"].get("labels"),
                       "log": (node["metadata"].get("annotations") or {}).get(LOG)}, indent=1)
