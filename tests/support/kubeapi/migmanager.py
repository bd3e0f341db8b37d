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

At start (cmd/nvidia-mig-manager/main.go start, setupMigConfig, createNodeConfigMap) a new process waits for
the driver (after a reboot: the driver container's rebuild) and, with migManager.config.name unset,
generates a config from the hardware (the collection's _config_builder), keeps it, and publishes it as
ConfigMap <node>-mig-config owned by its pod.

A run (pkg/mig/reconfigure/reconfigure.go Run), with `kubeapi.test/mig-manager-delay` seconds (default
DEFAULT_DELAY) between steps:
1. read the deploy labels CLIENT_LABELS and the state label as they are now;
2. the config: the generated one, else the ConfigMap migManager.config.name as mounted in the pod (a
   change reaches it CONFIGMAP_SYNC_SECONDS late); an unreadable file or a config name it lacks -> `failed`;
3. the GPUs already match the config (mig-parted assert) -> `success` without `pending`;
4. a mode change still needed while the state is `rebooting` -> `failed`;
5. `nvidia.com/mig.config.state=pending`;
6. each of CLIENT_LABELS -> `paused-for-mig-change` unless it is `false` (gpu.deploy.client only
   when present), so the DaemonSet controller removes the device-plugin and GFD pods;
7. wait, component by component, each up to CLIENT_SHUTDOWN_SECONDS, until the GPU-client pods are gone
   from the node: app=nvidia-device-plugin-daemonset, gpu-feature-discovery, nvidia-dcgm-exporter,
   nvidia-dcgm in the operator namespace, then pods of DaemonSets whose nodeSelector names
   gpu.deploy.client. A timeout ends the run with nothing restored: the known wedge (gpu-operator #2833);
8. the mode (apply --mode-only); not in effect and WITH_REBOOT: `rebooting`, the simulated host reboots,
   the node's DaemonSet pods are replaced, the labels stay paused, and the new pod waits
   REBOOT_SECONDS + DRIVER_REBUILD_SECONDS before it runs the label again;
9. apply GPU by GPU through the collection's own engine (_boot_restore.restore in a subprocess with
   GPUOPS_MIG_SIMULATE=<state file> and simulator/bin first on PATH): the first GPU that fails is cleared
   and ends the walk, the GPUs before it keep their layout; the output goes to the node annotation
   kubeapi.test/mig-manager-log;
10. delete the node's operator-validator pod, restore every deploy label that is not `false` to
   `true`, and set `success`.

Every other `success`/`failed` first restores the deploy labels in the same way, as the real setState
does (so a new pod after a wedge puts paused labels back to true), unless this pod already got through
step 10 once: then, as with the real NoRestartK8sDaemonsetsOnExit, they are left as they are.
Durations are the real ones times TIME_SCALE (KUBEAPI_TIME_SCALE).

Knobs (node annotations): kubeapi.test/mig-manager-hold: "<seconds>" makes the next run that gets to
step 5 stay `pending` (the annotation is removed) until `nvidia.com/mig.config` changes or that many
seconds have passed, then go on with the value it started with: a run in flight, as a real one is
while it waits for the GPU clients to stop (pkg/mig/reconfigure/reconfigure.go Run sets pending, then
shuts the clients down and waits up to minutes for their pods), whose end comes right after a label
change, the worst case for whoever changed the label, whatever the speed of the test machine.
kubeapi.test/mig-manager-wedge: "once" makes the next run that gets to step 7 stop there (pending,
labels paused, nothing applied); the annotation is removed. Deleting the mig-manager pod then (the
DaemonSet recreates it) re-runs the current label and recovers.
A run whose pod is deleted stops at its next step and leaves the labels as they are.

Not emulated: host systemd GPU clients, CDI, the override.conf persistence, the node going NotReady
while it reboots (docs/testing-kubernetes.md). Tests wait for the workers with wait_idle(cluster).
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
# Real durations, each multiplied by TIME_SCALE (environment KUBEAPI_TIME_SCALE; tests may set it):
CLIENT_SHUTDOWN_SECONDS = 300.0   # waitForPodsToBeDeleted: up to 5 minutes per GPU-client component
CONFIGMAP_SYNC_SECONDS = 60.0     # the kubelet's sync period: a mounted ConfigMap's change reaches the pod late
REBOOT_SECONDS = 60.0             # the node down and back
DRIVER_REBUILD_SECONDS = 180.0    # the driver container compiling and loading its modules after the reboot
TIME_SCALE = float(os.environ.get("KUBEAPI_TIME_SCALE") or 1 / 30)
ENGINE_TIMEOUT = 120
NODE_CONFIG_LABELS = {"app.kubernetes.io/component": "nvidia-mig-manager"}
CLIENT_LABELS = tuple("nvidia.com/gpu.deploy." + name for name in (
    "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm"))
CLIENT_LABEL_OPTIONAL = "nvidia.com/gpu.deploy.client"
CLIENT_APPS = ("nvidia-device-plugin-daemonset", "gpu-feature-discovery", "nvidia-dcgm-exporter", "nvidia-dcgm")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SIM_BIN = os.path.join(REPO, "simulator", "bin")
_MODE_ONLY = """
import json, sys
from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore, _errors
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout, _host_mode
desired = json.load(sys.stdin)
nvml = _boot_restore.open_session(desired)
try:
    entries = _host_layout.load_entries(config=desired["config"], config_name=desired["config_name"], layouts=None)
    records = _host_mode.plan(nvml, _host_mode.request_from_config(nvml, entries, True))
    _host_mode.apply(nvml, records, check_mode=False)
    _host_mode.reset_pending(nvml, records, _boot_restore.run_command, nvml.driver.smi_command("nvidia-smi"))
except _errors.GpuopsError as exc:
    print("mig-parted apply --mode-only: %s" % exc)
    sys.exit(1)
finally:
    nvml.__exit__(None, None, None)
"""
_GENERATE = """
import json, sys
from ansible_collections.gpuops.mig.plugins.module_utils import _nvml
from ansible_collections.gpuops.mig.plugins.plugin_utils import _config_builder
with _nvml.Nvml(driver_root=json.load(sys.stdin)["driver_root"]) as nvml:
    gpus = [nvml.describe(i) for i in range(nvml.gpu_count())]
print(_config_builder.build(gpus)["content"])
"""
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
        self.driver_ready_at = 0.0   # after a reboot: when the driver container has rebuilt (monotonic)


class _Pod:
    """One mig-manager process: what it set up at start and what it remembers between runs."""

    def __init__(self, started):
        self.started = started        # monotonic time its ConfigMap volume was mounted
        self.set_up = False
        self.generated = None         # the config generated from the hardware (no migManager.config.name)
        # reconfigure.NoRestartK8sDaemonsetsOnExit: a package variable set once a run has put the GPU clients
        # back (restartKubernetesGPUClients) and never reset, so later failures leave them paused.
        self.clients_restarted_once = False


class _Manager:
    def __init__(self):
        self.lock = threading.Lock()
        self.nodes: dict = {}
        self.pods: dict = {}          # pod uid -> _Pod
        self.config_maps: dict = {}   # (namespace, name) -> [(monotonic time, resourceVersion, data or None)]

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
    """Wait until no mig-manager run is queued or in progress; TimeoutError otherwise. On the real
    control plane (a TestCluster, whose stand-ins run from watches) the stand-ins first catch up
    with every change stored before the call, so a label just written has started its run."""
    deadline = time.monotonic() + timeout
    stand_ins = getattr(cluster, "stand_ins", None)
    if stand_ins is not None:
        stand_ins.sync(timeout)
        cluster = stand_ins.view
    manager = _manager(cluster)
    while manager.busy():
        if time.monotonic() > deadline:
            raise TimeoutError(f"simulated mig-manager still busy after {timeout} s")
        time.sleep(0.05)


def scaled(seconds: float) -> float:
    return seconds * TIME_SCALE


def _note_config_maps(cluster, manager, now):
    """Remember each version of the ConfigMaps mounted into mig-manager, and since when it exists."""
    policy = gpu_operator.active_policy(cluster)
    if policy is None:
        return
    key = (gpu_operator.operand_namespace(policy), gpu_operator.mig_config_map(policy))
    found = cluster.find("ConfigMap", key[1], key[0])
    version = (found["metadata"]["resourceVersion"], found.get("data")) if found else (None, None)
    history = manager.config_maps.setdefault(key, [])
    if not history or history[-1][1:] != version:
        history.append((now,) + version)


def mounted_config_map(cluster, namespace, name, pod_started):
    """The ConfigMap's data as a pod that mounted it at `pod_started` sees it now: the kubelet refreshes a
    mounted ConfigMap only on its sync period, so a change reaches the file CONFIGMAP_SYNC_SECONDS late."""
    manager = _manager(cluster)
    with manager.lock:
        history = list(manager.config_maps.get((namespace, name)) or [])
    cutoff = max(pod_started, time.monotonic() - scaled(CONFIGMAP_SYNC_SECONDS))
    seen = [data for when, _version, data in history if when <= cutoff]
    if seen:
        return seen[-1]
    found = cluster.find("ConfigMap", name, namespace)
    return found.get("data") if found and not history else None


def reconcile(cluster):
    """Runs inside the cluster lock: only notes triggers and starts workers."""
    manager = _manager(cluster)
    now = time.monotonic()
    with manager.lock:
        _note_config_maps(cluster, manager, now)
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
                # A new process: it sets itself up (generated config) whatever the label says.
                state.pod, state.seen = pod, value
                manager.pods.setdefault(pod[2], _Pod(now))
            elif value == state.seen or not value:
                state.seen = value
                continue
            state.seen = value
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
            process = manager.pods[pod[2]]
            if process.set_up and (not value or state.last_read == (value, pod)):
                continue     # Get() returns only a non-empty value that differs from the last one this pod read
            if value:
                state.last_read = (value, pod)
        try:
            run = _Run(cluster, node_name, value, pod, process, state)
            if not process.set_up:
                run.set_up()
            if value:
                run.run()
        except _Stopped:
            log.info("mig-manager run on %s for %s stopped", node_name, value)
        except Exception as exc:  # a stand-in bug: fail the test
            if "being terminated" in str(exc) or getattr(exc, "code", None) == 404:
                # The test cluster's reset took the namespace or node away mid-run.
                log.info("mig-manager run on %s for %s ended by a reset: %s", node_name, value, exc)
                return
            cluster.errors.append(exc)
            log.exception("simulated mig-manager failed on %s", node_name)


class _Run:
    def __init__(self, cluster, node_name, value, pod, process, node_state):
        self.cluster, self.node_name, self.value, self.pod = cluster, node_name, value, pod
        self.process, self.node_state = process, node_state
        self.lines = []
        self.current = {}
        self.current_state = ""
        self.delay = DEFAULT_DELAY

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

    def restore_clients(self):
        """Deploy labels back to true (false kept)."""
        restore = {k: "false" if self.current[k] == "false" else "true" for k in CLIENT_LABELS}
        if self.current.get(CLIENT_LABEL_OPTIONAL):
            restore[CLIENT_LABEL_OPTIONAL] = "false" if self.current[CLIENT_LABEL_OPTIONAL] == "false" else "true"
        self.label(restore)

    def set_state(self, state):
        """setState: deploy labels back to true (false kept) unless this process already did so once, then the
        state label."""
        if self.process.clients_restarted_once:
            self.say("GPU clients were restarted by an earlier run of this pod: their labels are left as they are")
        else:
            self.restore_clients()
        self.label({MIG_CONFIG_STATE: state})
        self.say(f"{MIG_CONFIG_STATE}={state}")
        self.annotate({LOG_ANNOTATION: "\n".join(self.lines)[-8000:]})

    # -- the run --

    def read_knobs(self):
        annotations = self.node()["metadata"].get("annotations") or {}
        try:
            self.delay = float(annotations.get(DELAY_ANNOTATION, DEFAULT_DELAY))
        except ValueError:
            self.delay = DEFAULT_DELAY
        return annotations

    def pod_env(self):
        namespace, name, _uid = self.pod
        pod = self.cluster.find("Pod", name, namespace) or {}
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        return dict((e.get("name"), e.get("value")) for e in containers[0].get("env") or [] if "value" in e)

    def wait_for_driver(self):
        """The entrypoint waits for the driver validation (after a reboot: the driver container's rebuild)."""
        while time.monotonic() < self.node_state.driver_ready_at:
            time.sleep(0.05)
            if not self.alive():
                raise _Stopped()

    def set_up(self):
        """What a new mig-manager process does before its first run (cmd/nvidia-mig-manager main.go start,
        setupMigConfig): with migManager.config.name unset, generate a config from the hardware and publish it
        as ConfigMap <node>-mig-config, owned by this pod."""
        self.wait_for_driver()
        self.process.set_up = True
        if self.pod_env().get("CONFIG_FILE"):
            return
        path = self.read_knobs()[NVML_STATE_ANNOTATION]
        code, output = generate_config(path)
        if code != 0:
            self.say(f"generating the MIG config from the hardware failed; using config-default.yaml: {output}")
            self.annotate({LOG_ANNOTATION: "\n".join(self.lines)})
            return
        self.process.generated = yaml.safe_load(output)
        output = "# Generated from the GPU hardware by the emulated nvidia-mig-manager.\n" + output
        namespace, name, uid = self.pod
        manifest = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"{self.node_name}-mig-config", "namespace": namespace,
                                 "labels": dict(NODE_CONFIG_LABELS, **{"nvidia.com/node-name": self.node_name}),
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]},
                    "data": {"config.yaml": output}}
        with self.cluster.lock:
            if not self.alive():
                raise _Stopped()
            existing = self.cluster.find("ConfigMap", manifest["metadata"]["name"], namespace)
            if existing is None:
                self.cluster.create(manifest)
            else:
                manifest["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                self.cluster.replace(manifest)
        self.say(f"generated the MIG config from the hardware: ConfigMap {namespace}/{self.node_name}-mig-config")

    def run(self):
        self.wait_for_driver()
        node = self.node()
        annotations = self.read_knobs()
        labels = node["metadata"].get("labels") or {}
        path = annotations[NVML_STATE_ANNOTATION]
        self.current = {k: labels.get(k, "") for k in CLIENT_LABELS + (CLIENT_LABEL_OPTIONAL,)}
        self.current_state = labels.get(MIG_CONFIG_STATE, "")
        self.say(f"selected MIG config {self.value!r}")
        namespace = self.pod[0]
        config = self.read_config(namespace)
        self.step()
        if config is None:
            return self.set_state("failed")
        entries = config["mig-configs"][self.value]
        sim = _simulator()[0]
        if config_applied(sim.load_state(path), entries):
            self.say("selected MIG config is already applied")
            return self.set_state("success")
        mode_change = not config_applied(sim.load_state(path), entries, mode_only=True)
        if mode_change and self.current_state == "rebooting":
            self.say("MIG mode change did not take effect after rebooting")
            return self.set_state("failed")
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
        if mode_change:
            code, output = apply_mode(path, config, self.value)
            self.say(output.rstrip())
            self.step()
            if not config_applied(sim.load_state(path), entries, mode_only=True) and \
                    str(self.pod_env().get("WITH_REBOOT", "")).lower() in ("1", "t", "true"):
                return self.reboot(path)
        code = self.apply_per_gpu(path, config)
        self.step()
        if code != 0:
            return self.set_state("failed")
        self.delete_pods(namespace, ("nvidia-operator-validator",))
        self.restore_clients()
        self.process.clients_restarted_once = True
        self.set_state("success")

    def apply_per_gpu(self, path, config):
        """mig-parted apply walks the GPUs one by one (WalkSelectedMigConfigForEachGPU): the first GPU that fails
        ends the walk; the GPUs before it keep their new layout, and the failing one has been cleared
        (SetMigConfig clears every instance before creating) as far as no process holds a device."""
        for index in selected_gpus(_simulator()[0].load_state(path), config["mig-configs"][self.value]):
            code, output = apply_config(path, config_for_gpu(config, self.value, index), self.value)
            self.say(f"GPU {index}: {output.rstrip()}")
            self.say(f"engine exit status {code}")
            if code != 0:
                clear_gpu(path, index)
                self.say(f"GPU {index}: cleared; later GPUs were not touched")
                return code
            self.step()
        return 0

    def reboot(self, path):
        """WITH_REBOOT after a mode change that did not take effect: `rebooting`, then the node reboots with the
        GPU clients still paused; every pod on it restarts, and mig-manager's entrypoint waits for the driver
        container to rebuild before the new process runs the label again (it then sees `rebooting`)."""
        self.label({MIG_CONFIG_STATE: "rebooting"})
        self.say(f"{MIG_CONFIG_STATE}=rebooting; rebooting the node")
        self.annotate({LOG_ANNOTATION: "\n".join(self.lines)[-8000:]})
        self.node_state.driver_ready_at = time.monotonic() + scaled(REBOOT_SECONDS + DRIVER_REBUILD_SECONDS)
        _simulator()[0].reboot(path)
        with self.cluster.lock:
            for pod in self.cluster.list("Pod", field_selector=f"spec.nodeName={self.node_name}"):
                if any(r.get("kind") == "DaemonSet" for r in pod["metadata"].get("ownerReferences") or []):
                    try:
                        self.cluster.delete("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
                    except Exception:  # gone meanwhile
                        pass

    def read_config(self, namespace):
        """The config this process reads: the generated one, else the mounted ConfigMap (as mounted)."""
        if self.process.generated is not None:
            config, origin = self.process.generated, f"the config generated for {self.node_name}"
        else:
            policy = gpu_operator.active_policy(self.cluster)
            name = gpu_operator.mig_config_map(policy) if policy else gpu_operator.DEFAULT_MIG_CONFIG_MAP
            origin = f"ConfigMap {namespace}/{name} (as mounted)"
            data = mounted_config_map(self.cluster, namespace, name, self.process.started)
            if data is None:
                self.say(f"ConfigMap {namespace}/{name} not found")
                return None
            try:
                config = yaml.safe_load(data.get("config.yaml") or "")
            except yaml.YAMLError as exc:
                self.say(f"{origin}: config.yaml is not a mig-parted config: {exc!r}")
                return None
        configs = config.get("mig-configs") if isinstance(config, dict) else None
        if not isinstance(configs, dict):
            self.say(f"{origin}: config.yaml is not a mig-parted config")
            return None
        if self.value not in configs:
            self.say(f"config {self.value!r} is not in {origin} (assert --valid-config failed)")
            return None
        return config

    def client_pods(self, namespace):
        pods = []
        for pod in self.cluster.list("Pod", field_selector=f"spec.nodeName={self.node_name}"):
            meta = pod["metadata"]
            if meta.get("namespace") == namespace and (meta.get("labels") or {}).get("app") in CLIENT_APPS:
                pods.append((meta["name"], meta["labels"]["app"]))
                continue
            owner = next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == "DaemonSet"), None)
            if owner:
                ds = self.cluster.find("DaemonSet", owner["name"], meta["namespace"])
                selector = (((ds or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector")
                if CLIENT_LABEL_OPTIONAL in (selector or {}):
                    pods.append((meta["name"], None))
        return pods

    def wait_clients_gone(self, namespace):
        """waitForPodsToBeDeleted: component by component, each up to CLIENT_SHUTDOWN_SECONDS (scaled)."""
        for app in CLIENT_APPS + (None,):
            deadline = time.monotonic() + scaled(CLIENT_SHUTDOWN_SECONDS)
            while True:
                left = [name for name, pod_app in self.client_pods(namespace) if pod_app == app]
                if not left:
                    break
                if time.monotonic() > deadline:
                    self.say(f"pods still on the node after {scaled(CLIENT_SHUTDOWN_SECONDS):g} s: {', '.join(left)}")
                    return False
                time.sleep(0.05)
                if not self.alive():
                    raise _Stopped()
        return True

    def delete_pods(self, namespace, apps):
        for pod in self.cluster.list("Pod", namespace, field_selector=f"spec.nodeName={self.node_name}"):
            if (pod["metadata"].get("labels") or {}).get("app") in apps:
                try:
                    self.cluster.delete("Pod", pod["metadata"]["name"], namespace)
                except Exception:  # gone meanwhile
                    pass


def _engine(script, path, desired):
    """Run one of the engine scripts against a simulated host, as mig-parted runs inside mig-manager's
    container: the driver injected (the simulated host's driver root, if it has one). (exit status, output)"""
    desired = dict(desired, driver_root=(_simulator()[0].load_state(path).get("host") or {}).get("driver_root")
                   or "auto")
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=os.path.abspath(path),
               PATH=SIM_BIN + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, ".build", "collections"), os.path.join(REPO, "simulator")]
                                          + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(desired), capture_output=True,
                              text=True, env=env, timeout=ENGINE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        return 124, f"engine timed out after {ENGINE_TIMEOUT} s: {exc.stdout or ''}{exc.stderr or ''}"
    return proc.returncode, proc.stdout + proc.stderr


def apply_config(path, config, name):
    """Apply mig-parted config `name` to a simulated host with the collection's boot-time engine.
    Returns (exit status, output)."""
    return _engine(_ENGINE, path, {"format": 1, "config": config, "config_name": name, "layouts": None,
                                   "allow_unmatched": True, "reset": True, "nvidia_smi": "nvidia-smi",
                                   "wait_for_driver": 0})


def apply_mode(path, config, name):
    """mig-parted apply --mode-only: each selected GPU's MIG mode, with a GPU reset where the mode is pending."""
    return _engine(_MODE_ONLY, path, {"config": config, "config_name": name, "wait_for_driver": 0})


def generate_config(path):
    """mig-parted's generate-config from the simulated hardware (the collection's builder): (status, YAML)."""
    return _engine(_GENERATE, path, {})


def config_for_gpu(config, name, index):
    """Config `name` narrowed to GPU `index` (the entries that select it, with devices: [index])."""
    state_entries = config["mig-configs"][name]
    narrowed = [dict(entry, devices=[index]) for entry in state_entries
                if entry.get("devices", "all") == "all" or index in entry.get("devices")]
    return {"version": config.get("version", "v1"), "mig-configs": {name: narrowed}}


def clear_gpu(path, index):
    """Destroy the MIG devices of one GPU that no process holds (what NVML lets mig-parted clear)."""
    sim = _simulator()[0]
    with sim.state.StateStore(path).transaction() as state:
        gpu = next(g for g in state["gpus"] if g["index"] == index)
        for gi in list(gpu.get("gpu_instances") or []):
            for ci in list(gi["compute_instances"]):
                if not sim.state.gpu_processes(state, gpu, gi["id"], ci["id"]):
                    gi["compute_instances"].remove(ci)
            if not gi["compute_instances"] and not sim.state.gpu_processes(state, gpu, gi["id"]):
                gpu["gpu_instances"].remove(gi)


def _selects(entry, gpu, models):
    ids = _filter_ids(entry)
    devices = entry.get("devices", "all")
    if ids is not None and models.MODELS[gpu["model"]].pci_device_id not in ids:
        return False
    return devices == "all" or gpu["index"] in devices


def selected_gpus(state, entries):
    """The indexes of the GPUs some entry selects, in order (the walk of mig-parted apply)."""
    models = _simulator()[1]
    return [gpu["index"] for gpu in state["gpus"] if any(_selects(entry, gpu, models) for entry in entries)]


def _filter_ids(entry):
    wanted = entry.get("device-filter")
    if wanted is None:
        return None
    if isinstance(wanted, str):
        wanted = [wanted]
    return {int(str(w).split(":", maxsplit=1)[0], 16) for w in wanted}


def config_applied(state, entries, mode_only=False) -> bool:
    """mig-parted assert: every GPU an entry selects has that MIG mode (current and pending) and
    exactly those MIG devices (with mode_only, assert --mode-only: the mode alone). GPUs no entry selects
    are not checked."""
    sim, models = _simulator()
    for entry in entries:
        devices = entry.get("devices", "all")
        for gpu in state["gpus"]:
            if not _selects(entry, gpu, models):
                continue
            model = models.MODELS[gpu["model"]]
            if gpu.get("mig") is None:
                if devices == "all":
                    continue  # not MIG-capable: skipped with devices: all
                return False
            want = sim.MIG_ENABLE if entry.get("mig-enabled") else sim.MIG_DISABLE
            if gpu["mig"]["current"] != want or gpu["mig"]["pending"] != want:
                return False
            if mode_only:
                continue
            have = {}
            if want == sim.MIG_ENABLE:
                for gi, ci in sim.state.mig_devices(gpu):
                    name = sim.state.mig_device_name(model, gi, ci)
                    have[name] = have.get(name, 0) + 1
            expected = {k: v for k, v in (entry.get("mig-devices") or {}).items() if v}
            if have != expected:
                return False
    return True
