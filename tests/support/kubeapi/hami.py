"""A simulated HAMi device plugin (Project-HAMi/HAMi) on nodes linked to a simulated GPU host, enough for the
hand-off of a node to HAMi's dynamic MIG and back (docs/gpu-operator.md, "Hand-off to dynamic partitioners").

Follows Project-HAMi/HAMi docs/develop/dynamic-mig-migration.md and pkg/device (devices.go DeviceInfo and
MigProfile, nvidia/device.go RegisterAnnos and HandshakeAnnos); manifests() is the chart's DaemonSet
(charts/hami/templates/device-plugin/daemonsetnvidia.yaml: pods labelled
app.kubernetes.io/component=hami-device-plugin, nodeSelector gpu=on) and its per-node ConfigMap
(hami-device-plugin, key config.json). When a plugin pod starts on a linked node (a pod this module has not seen):

- it reads the node's entry of `nodeconfig` in that ConfigMap (`operatingmode`, default `hami-core`);
- in `mig` mode it clears the MIG instances of every idle MIG-capable GPU (no process on it), as HAMi prepares
  idle GPUs in a clean MIG-ready state at start, and registers each MIG-capable GPU with MIG on as mode `mig` with
  the profiles and placements the GPU offers (`migProfiles`); other GPUs, and every GPU in another mode, are
  registered as `hami-core`;
- it writes the node annotations hami.io/node-nvidia-register (the JSON list of DeviceInfo) and
  hami.io/node-handshake (`Reported <time>`).

Not modelled: the scheduler (its handshake timeout, which drops a node whose plugin stopped answering, so the
register annotation stays after the plugin leaves), `migProfileAllowlist`, reservations and per-pod GI/CI creation,
memory and core sharing (hami-core), and resources on the Node.
"""

from __future__ import annotations

import json
import re
import time
import weakref

from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

POD_LABEL = ("app.kubernetes.io/component", "hami-device-plugin")
CONFIGMAP = "hami-device-plugin"
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"

_started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def manifests(namespace: str = "kube-system", nodeconfig: list | None = None) -> list:
    """HAMi's device-plugin DaemonSet and its per-node ConfigMap, as the chart installs them."""
    labels = {POD_LABEL[0]: POD_LABEL[1], "app.kubernetes.io/name": "hami"}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "hami-device-plugin", "namespace": namespace, "labels": dict(labels)},
        "spec": {"selector": {"matchLabels": dict(labels)}, "updateStrategy": {"type": "RollingUpdate"},
                 "template": {"metadata": {"labels": dict(labels, **{"hami.io/webhook": "ignore"})},
                              "spec": {"nodeSelector": {"gpu": "on"},
                                       "containers": [{"name": "device-plugin",
                                                       "image": "projecthami/hami:latest"}]}}},
    }
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": namespace},
              "data": {"config.json": json.dumps({"nodeconfig": list(nodeconfig or [])}, indent=2)}}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, daemonset, config] \
        if namespace != "kube-system" else [daemonset, config]


def operating_mode(cluster, namespace: str, node: str) -> str:
    config = cluster.find("ConfigMap", CONFIGMAP, namespace) or {}
    try:
        entries = json.loads((config.get("data") or {}).get("config.json") or "{}").get("nodeconfig") or []
    except ValueError:
        return "hami-core"
    entry = next((e for e in entries if isinstance(e, dict) and e.get("name") == node), {})
    return entry.get("operatingmode") or "hami-core"


def register(path: str, mode: str) -> list:
    """What the plugin registers for the simulated host's GPUs (and, in mig mode, the idle GPUs it clears)."""
    sim, models = _simulator()
    store = sim.state.StateStore(path)
    devices = []
    with store.transaction() as state:
        for gpu in state["gpus"]:
            model = models.MODELS[gpu["model"]]
            mig = mode == "mig" and models.is_mig_capable(model)
            if mig and not sim.state.gpu_processes(state, gpu):
                for gi in gpu["gpu_instances"] if sim.state.mig_enabled(gpu) else []:
                    gi["compute_instances"] = []
                if sim.state.mig_enabled(gpu):
                    gpu["gpu_instances"] = []
            info = {"id": gpu["uuid"], "index": gpu["index"], "count": 10, "devmem": model.memory_mib,
                    "devcore": 100, "type": "NVIDIA-" + model.name, "health": True, "mode": "hami-core"}
            if mig and sim.state.mig_enabled(gpu):
                plain = [p for p in model.gi_profiles.values() if re.fullmatch(r"\d+g\.\d+gb", p.name)]
                info.update(mode="mig", migProfiles=[
                    {"name": p.name, "memoryMB": p.memory_mib, "core": round(100 * p.sm_slices / model.sm_slices),
                     "sliceCount": p.memory_slices,
                     "placements": [{"start": s, "size": p.memory_slices} for s in p.starts]}
                    for p in sorted(plain, key=lambda p: (p.memory_slices, p.id))])
            devices.append(info)
    return devices


def reconcile(cluster):
    started = _started.setdefault(cluster, {})
    key, value = POD_LABEL
    pods = [p for p in cluster.list("Pod", label_selector=f"{key}={value}")
            if (p.get("status") or {}).get("phase") == "Running"]
    for pod in pods:
        name = (pod.get("spec") or {}).get("nodeName")
        node = cluster.find("Node", name) if name else None
        path = ((node or {}).get("metadata", {}).get("annotations") or {}).get(NVML_STATE_ANNOTATION)
        if not path or started.get(name) == pod["metadata"]["uid"]:
            continue
        started[name] = pod["metadata"]["uid"]
        devices = register(path, operating_mode(cluster, pod["metadata"]["namespace"], name))
        cluster.patch("Node", name, {"metadata": {"annotations": {
            REGISTER: json.dumps(devices), HANDSHAKE: "Reported " + time.strftime("%Y-%m-%d %H:%M:%S")}}})
