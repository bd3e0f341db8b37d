"""A simulated GPU Operator mig-manager (k8s-mig-manager v0.15.0) for nodes linked to a simulated GPU host.

A node linked with the annotation kubeapi.test/nvml-state (seed.node(..., nvml_state=path)) that
runs a Running pod labelled app=nvidia-mig-manager (the operator's DaemonSet, operator.py) gets a
worker thread that follows mig-manager's label protocol (reference/mig-facts.md section 3.2,
reference/gpu-operator.md section 4; NVIDIA/mig-parted pkg/mig/reconfigure/reconfigure.go Run):

Triggers: a new mig-manager pod on the node (it acts on the current `nvidia.com/mig.config`), and a
change of that label's value. Setting the same value again, or an empty value, does nothing.
Requests are coalesced (only the latest value waits) and runs on a node are serialised: as in
NVIDIA/mig-parted cmd/nvidia-mig-manager/main.go (the node informer's AddFunc/UpdateFunc feed a
SyncableMigConfig whose Get blocks until the value differs from the last one read, and the main loop
runs one reconfigure after another), a run in flight is never interrupted by a label change: it ends
with its own `success`/`failed`, and the latest value is run afterwards, unless it is the value the
pod's previous run read (changing the label away and back during a run starts no new run).

A run, with `kubeapi.test/mig-manager-delay` seconds (default DEFAULT_DELAY) between steps:
1. read the deploy labels CLIENT_LABELS as they are now;
2. read the ConfigMap named by the ClusterPolicy (migManager.config.name, key config.yaml, in the
   mig-manager pod's namespace); an unreadable file or a config name it lacks -> `failed`;
3. the GPUs already match the config (mig-parted assert) -> `success` without `pending`;
4. `nvidia.com/mig.config.state=pending`;
5. each of CLIENT_LABELS -> `paused-for-mig-change` unless it is `false` (gpu.deploy.client only
   when present), so the DaemonSet controller removes the device-plugin and GFD pods;
6. wait (POD_DELETION_TIMEOUT) until the GPU-client pods are gone from the node: app=
   nvidia-device-plugin-daemonset, gpu-feature-discovery, nvidia-dcgm-exporter, nvidia-dcgm in the
   operator namespace and pods of DaemonSets whose nodeSelector names gpu.deploy.client. A timeout
   ends the run with nothing restored: the known wedge (gpu-operator #2833);
7. apply the config through the collection's own engine (_boot_restore.restore in a subprocess
   with GPUOPS_MIG_SIMULATE=<state file> and tools/sim-bin first on PATH); its output goes to the
   node annotation kubeapi.test/mig-manager-log;
8. delete the node's operator-validator pod, restore every deploy label that is not `false` to
   `true`, and set the state: `success` when the engine exited 0, else `failed`.

Every `success`/`failed` (steps 2, 3 and 8) first restores the deploy labels as in 8, as the
real setState does; so a new pod after a wedge puts paused labels back to true.

Knobs (node annotations): kubeapi.test/mig-manager-hold: "<seconds>" makes the next run that gets to
step 4 stay `pending` (the annotation is removed) until `nvidia.com/mig.config` changes or that many
seconds have passed, then go on with the value it started with: a run in flight, as a real one is
while it waits for the GPU clients to stop (pkg/mig/reconfigure/reconfigure.go Run sets pending, then
shuts the clients down and waits up to minutes for their pods), whose end comes right after a label
change, the worst case for whoever changed the label, whatever the speed of the test machine.
kubeapi.test/mig-manager-wedge: "once" makes the next run that gets to step 6 stop there (pending,
labels paused, nothing applied); the annotation is removed. Deleting the mig-manager pod then (the
DaemonSet recreates it) re-runs the current label and recovers.
A run whose pod is deleted stops at its next step and leaves the labels as they are.

Not emulated: generated per-node configs (an empty config name reads default-mig-parted-config),
host systemd GPU clients, WITH_REBOOT and the `rebooting` state, CDI, the override.conf
persistence. Tests wait for the workers with wait_idle(cluster).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import weakref

import yaml

from . import operator as gpu_operator
from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

log = logging.getLogger(__name__)

MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
PAUSED = "paused-for-mig-change"
WEDGE_ANNOTATION = "kubeapi.test/mig-manager-wedge"
HOLD_ANNOTATION = "kubeapi.test/mig-manager-hold"
DELAY_ANNOTATION = "kubeapi.test/mig-manager-delay"
LOG_ANNOTATION = "kubeapi.test/mig-manager-log"
POD_LABEL = "app=nvidia-mig-manager"
DEFAULT_DELAY = 0.2
POD_DELETION_TIMEOUT = 10.0  # the real one waits up to 5 minutes per component
ENGINE_TIMEOUT = 120
CLIENT_LABELS = tuple("nvidia.com/gpu.deploy." + name for name in (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm"))
CLIENT_LABEL_OPTIONAL = "nvidia.com/gpu.deploy.client"
CLIENT_APPS = ("nvidia-device-plugin-daemonset", "gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-dcgm")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SIM_BIN = os.path.join(REPO, "tools", "sim-bin")
_ENGINE = """
import json, sys
from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore, _errors
desired = json.load(sys.stdin)
try:
    code = _boot_restore.restore(desired)
except _errors.GpuopsError as exc:
    print("gpuops-mig-restore: %s" % exc)
    code = _boot_restore.EXIT_FAILED
sys.exit(code)
"""


class _Stopped(Exception):
    """The run's pod or node went away: stop where we are, as a killed mig-manager does."""


class _Node:
    def __init__(self):
        self.pod = None          # (namespace, name, uid) of the current mig-manager pod
        self.seen = None         # last mig.config value acted on or skipped
        self.requested = None    # (value, pod) waiting for the worker
        self.last_read = None    # (value, pod) of the last run started (SyncableMigConfig.lastRead)
        self.thread = None


class _Manager:
    def __init__(self):
        self.lock = threading.Lock()
        self.nodes: dict = {}

    def busy(self) -> bool:
        with self.lock:
            return any(n.requested or (n.thread and n.thread.is_alive()) for n in self.nodes.values())


_managers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _manager(cluster) -> _Manager:
    manager = _managers.get(cluster)
    if manager is None:
        manager = _managers[cluster] = _Manager()
    return manager


def wait_idle(cluster, timeout: float = 60.0) -> None:
    """Wait until no mig-manager run is queued or in progress; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    manager = _manager(cluster)
    while manager.busy():
        if time.monotonic() > deadline:
            raise TimeoutError(f"simulated mig-manager still busy after {timeout} s")
        time.sleep(0.05)


def reconcile(cluster):
    """Runs inside the cluster lock: only notes triggers and starts workers."""
    manager = _manager(cluster)
    pods = [p for p in cluster.list("Pod", label_selector=POD_LABEL)
            if (p.get("status") or {}).get("phase") == "Running"]
    for node in cluster.list("Node"):
        meta = node["metadata"]
        if not (meta.get("annotations") or {}).get(NVML_STATE_ANNOTATION):
            continue
        mine = [p for p in pods if (p.get("spec") or {}).get("nodeName") == meta["name"]]
        value = (meta.get("labels") or {}).get(MIG_CONFIG, "")
        with manager.lock:
            state = manager.nodes.setdefault(meta["name"], _Node())
            if not mine:
                state.pod = None
                continue
            pod = mine[-1]["metadata"]
            pod = (pod["namespace"], pod["name"], pod["uid"])
            if state.pod != pod:
                state.pod, state.seen = pod, value
            elif value == state.seen:
                continue
            state.seen = value
            if not value:
                continue
            state.requested = (value, pod)
            if state.thread is None or not state.thread.is_alive():
                state.thread = threading.Thread(target=_work, args=(cluster, manager, meta["name"], state),
                                                name=f"mig-manager-{meta['name']}", daemon=True)
                state.thread.start()


def _work(cluster, manager, node_name, state):
    while True:
        with manager.lock:
            if state.requested is None:
                state.thread = None
                return
            value, pod = state.requested
            state.requested = None
            if state.last_read == (value, pod):
                continue     # Get() returns only a value that differs from the last one this pod read
            state.last_read = (value, pod)
        try:
            _Run(cluster, node_name, value, pod).run()
        except _Stopped:
            log.info("mig-manager run on %s for %s stopped", node_name, value)
        except Exception as exc:  # an emulator bug: fail the test
            cluster.errors.append(exc)
            log.exception("simulated mig-manager failed on %s", node_name)


class _Run:
    def __init__(self, cluster, node_name, value, pod):
        self.cluster, self.node_name, self.value, self.pod = cluster, node_name, value, pod
        self.lines = []
        self.current = {}

    # -- plumbing --

    def say(self, text):
        self.lines.append(text)

    def node(self):
        node = self.cluster.find("Node", self.node_name)
        if node is None:
            raise _Stopped()
        return node

    def alive(self):
        namespace, name, uid = self.pod
        pod = self.cluster.find("Pod", name, namespace)
        return pod is not None and pod["metadata"]["uid"] == uid

    def step(self):
        time.sleep(self.delay)
        if not self.alive():
            raise _Stopped()

    def hold(self, seconds):
        """Stay where the run is (in flight) until the node's mig.config changes or `seconds` pass; stop if the
        pod goes."""
        self.say(f"held at pending for up to {seconds} s ({HOLD_ANNOTATION})")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if not self.alive():
                raise _Stopped()
            if (self.node()["metadata"].get("labels") or {}).get(MIG_CONFIG) != self.value:
                self.say(f"{MIG_CONFIG} changed during the run; it goes on with {self.value!r}")
                return

    def label(self, labels):
        with self.cluster.lock:
            if not self.alive():
                raise _Stopped()
            self.node()
            self.cluster.patch("Node", self.node_name, {"metadata": {"labels": labels}})

    def annotate(self, annotations):
        if self.cluster.find("Node", self.node_name):
            self.cluster.patch("Node", self.node_name, {"metadata": {"annotations": annotations}})

    def set_state(self, state):
        """setState: deploy labels back to true (false kept), then the state label."""
        restore = {k: "false" if self.current[k] == "false" else "true" for k in CLIENT_LABELS}
        if self.current.get(CLIENT_LABEL_OPTIONAL):
            restore[CLIENT_LABEL_OPTIONAL] = "false" if self.current[CLIENT_LABEL_OPTIONAL] == "false" else "true"
        self.label(restore)
        self.label({MIG_CONFIG_STATE: state})
        self.say(f"{MIG_CONFIG_STATE}={state}")
        self.annotate({LOG_ANNOTATION: "\n".join(self.lines)[-8000:]})

    # -- the run --

    def run(self):
        node = self.node()
        annotations = node["metadata"].get("annotations") or {}
        labels = node["metadata"].get("labels") or {}
        try:
            self.delay = float(annotations.get(DELAY_ANNOTATION, DEFAULT_DELAY))
        except ValueError:
            self.delay = DEFAULT_DELAY
        path = annotations[NVML_STATE_ANNOTATION]
        self.current = {k: labels.get(k, "") for k in CLIENT_LABELS + (CLIENT_LABEL_OPTIONAL,)}
        self.say(f"selected MIG config {self.value!r}")
        namespace = self.pod[0]
        config = self.read_config(namespace)
        self.step()
        if config is None:
            return self.set_state("failed")
        sim = _simulator()[0]
        if config_applied(sim.load_state(path), config["mig-configs"][self.value]):
            self.say("selected MIG config is already applied")
            return self.set_state("success")
        self.label({MIG_CONFIG_STATE: "pending"})
        self.step()
        if annotations.get(HOLD_ANNOTATION):
            self.annotate({HOLD_ANNOTATION: None})
            self.hold(float(annotations[HOLD_ANNOTATION]))
        paused = {k: "false" if self.current[k] == "false" else PAUSED for k in CLIENT_LABELS}
        if self.current.get(CLIENT_LABEL_OPTIONAL):
            paused[CLIENT_LABEL_OPTIONAL] = "false" if self.current[CLIENT_LABEL_OPTIONAL] == "false" else PAUSED
        self.label(paused)
        self.step()
        if annotations.get(WEDGE_ANNOTATION) == "once" and self.node()["metadata"].get(
                "annotations", {}).get(WEDGE_ANNOTATION) == "once":
            self.say("wedged (kubeapi.test/mig-manager-wedge): waiting for GPU clients timed out; exiting "
                     "without restoring labels")
            self.annotate({WEDGE_ANNOTATION: None, LOG_ANNOTATION: "\n".join(self.lines)})
            return
        if not self.wait_clients_gone(namespace):
            self.say("GPU client pods did not shut down; exiting without restoring labels")
            self.annotate({LOG_ANNOTATION: "\n".join(self.lines)})
            return
        self.delete_pods(namespace, ("nvidia-cuda-validator", "nvidia-device-plugin-validator"))
        code, output = apply_config(path, config, self.value)
        self.say(output.rstrip())
        self.say(f"engine exit status {code}")
        self.step()
        self.delete_pods(namespace, ("nvidia-operator-validator",))
        self.set_state("success" if code == 0 else "failed")

    def read_config(self, namespace):
        policy = gpu_operator.active_policy(self.cluster)
        name = gpu_operator.mig_config_map(policy) if policy else gpu_operator.DEFAULT_MIG_CONFIG_MAP
        config_map = self.cluster.find("ConfigMap", name, namespace)
        if config_map is None:
            self.say(f"ConfigMap {namespace}/{name} not found")
            return None
        try:
            config = yaml.safe_load((config_map.get("data") or {}).get("config.yaml") or "")
            configs = config["mig-configs"]
        except (yaml.YAMLError, TypeError, KeyError) as exc:
            self.say(f"ConfigMap {namespace}/{name}: config.yaml is not a mig-parted config: {exc!r}")
            return None
        if not isinstance(configs, dict) or self.value not in configs:
            self.say(f"config {self.value!r} is not in ConfigMap {namespace}/{name} (assert --valid-config failed)")
            return None
        return config

    def client_pods(self, namespace):
        pods = []
        for pod in self.cluster.list("Pod", field_selector=f"spec.nodeName={self.node_name}"):
            meta = pod["metadata"]
            if meta.get("namespace") == namespace and (meta.get("labels") or {}).get("app") in CLIENT_APPS:
                pods.append(meta["name"])
                continue
            owner = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == "DaemonSet"), None)
            if owner:
                ds = self.cluster.find("DaemonSet", owner["name"], meta["namespace"])
                selector = (((ds or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector")
                if CLIENT_LABEL_OPTIONAL in (selector or {}):
                    pods.append(meta["name"])
        return pods

    def wait_clients_gone(self, namespace):
        deadline = time.monotonic() + POD_DELETION_TIMEOUT
        while True:
            left = self.client_pods(namespace)
            if not left:
                return True
            if time.monotonic() > deadline:
                self.say(f"pods still on the node: {', '.join(left)}")
                return False
            time.sleep(0.05)
            if not self.alive():
                raise _Stopped()

    def delete_pods(self, namespace, apps):
        for pod in self.cluster.list("Pod", namespace, field_selector=f"spec.nodeName={self.node_name}"):
            if (pod["metadata"].get("labels") or {}).get("app") in apps:
                try:
                    self.cluster.delete("Pod", pod["metadata"]["name"], namespace)
                except Exception:  # gone meanwhile
                    pass


def apply_config(path, config, name):
    """Apply mig-parted config `name` to a simulated host with the collection's boot-time engine.
    Returns (exit status, output)."""
    # Inside mig-manager's container the driver is injected: the simulated host's driver root, if it has one.
    driver_root = (_simulator()[0].load_state(path).get("host") or {}).get("driver_root") or "auto"
    desired = {"format": 1, "config": config, "config_name": name, "layouts": None, "allow_unmatched": True,
               "reset": True, "nvidia_smi": "nvidia-smi", "driver_root": driver_root, "wait_for_driver": 0}
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=os.path.abspath(path),
               PATH=SIM_BIN + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, ".build", "collections"), os.path.join(REPO, "simulator")]
                                          + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        proc = subprocess.run([sys.executable, "-c", _ENGINE], input=json.dumps(desired), capture_output=True,
                              text=True, env=env, timeout=ENGINE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        return 124, f"engine timed out after {ENGINE_TIMEOUT} s: {exc.stdout or ''}{exc.stderr or ''}"
    return proc.returncode, proc.stdout + proc.stderr


def _filter_ids(entry):
    wanted = entry.get("device-filter")
    if wanted is None:
        return None
    if isinstance(wanted, str):
        wanted = [wanted]
    return {int(str(w).split(":", maxsplit=1)[0], 16) for w in wanted}


def config_applied(state, entries) -> bool:
    """mig-parted assert: every GPU an entry selects has that MIG mode (current and pending) and
    exactly those MIG devices. GPUs no entry selects are not checked."""
    sim, models = _simulator()
    for entry in entries:
        ids = _filter_ids(entry)
        devices = entry.get("devices", "all")
        for gpu in state["gpus"]:
            model = models.MODELS[gpu["model"]]
            if ids is not None and model.pci_device_id not in ids:
                continue
            if devices != "all" and gpu["index"] not in devices:
                continue
            if gpu.get("mig") is None:
                if devices == "all":
                    continue  # not MIG-capable: skipped with devices: all
                return False
            want = sim.MIG_ENABLE if entry.get("mig-enabled") else sim.MIG_DISABLE
            if gpu["mig"]["current"] != want or gpu["mig"]["pending"] != want:
                return False
            have = {}
            if want == sim.MIG_ENABLE:
                for gi, ci in sim.state.mig_devices(gpu):
                    name = sim.state.mig_device_name(model, gi, ci)
                    have[name] = have.get(name, 0) + 1
            expected = {k: v for k, v in (entry.get("mig-devices") or {}).items() if v}
            if have != expected:
                return False
    return True
