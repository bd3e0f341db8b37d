"""Which device each pod got: the kubelet's device manager and NVIDIA's device plugin, for nodes linked to a
simulated GPU host that also carry the annotation POD_RESOURCES_ANNOTATION (seed.node(..., pod_resources=path)).

What the PodResources server (tests/support/podresources_server.py) lists for such a node comes from here.
In every reconcile pass, for each such node:

- **Inventory.** When a device-plugin pod (deviceplugin.PLUGIN) is Ready on the node and its uid changed
  (a new plugin pod), the devices it advertises are read from the state file with their UUIDs, by the
  rules of deviceplugin.advertise for the pod's MIG_STRATEGY (none: GPUs whole; mixed: GPUs without MIG as
  nvidia.com/gpu, each MIG device whose compute instance spans its GPU instance as nvidia.com/mig-<profile>;
  single: MIG devices as nvidia.com/gpu). Device IDs are UUIDs, as NVIDIA's plugin names them
  (NVIDIA/k8s-device-plugin internal/rm/devices.go).
- **Allocation.** A pod bound to the node, not Succeeded or Failed, whose containers (and restartable init
  containers) ask for nvidia.com/* resources (limits, or requests) gets, per container and resource, that
  many advertised devices that still exist and no other pod holds, first by GPU index and placement, once
  (the kubelet's device manager at admission; NVIDIA's plugin has no preference for MIG devices,
  internal/rm/allocate.go). When too few are free the pod fails at admission as the kubelet fails it:
  phase Failed, reason UnexpectedAdmissionError. Pods arriving while no plugin is Ready wait.
- **Kept across a plugin restart.** Assignments belong to the pod (the kubelet's checkpoint), so a new plugin
  pod changes only what is advertised; a pod keeps its devices while they exist.
- **Destroyed under a pod.** When the state file changed (its size or mtime), the UUIDs on the host are read
  again; a pod holding one that is gone is marked phase Failed, reason DeviceDestroyed, with a message naming
  the device (a stand-in convention: a real container would crash on its next CUDA call).
- Pods deleted or terminal free their devices (the kubelet's UpdateAllocatedDevices).

The state file changes outside the cluster (modules in other processes), so a change is noticed on the next
reconcile pass; `sync(cluster)` runs one, and the PodResources server runs one before it answers.
"""

from __future__ import annotations

import dataclasses
import os
import weakref

from . import deviceplugin

POD_RESOURCES_ANNOTATION = "kubeapi.test/pod-resources"
ADMISSION_FAILED = "UnexpectedAdmissionError"
DEVICE_DESTROYED = "DeviceDestroyed"
_TERMINAL = ("Succeeded", "Failed")


@dataclasses.dataclass
class _Book:
    """One node's devices as the kubelet knows them."""
    plugin_uid: str | None = None
    inventory: dict = dataclasses.field(default_factory=dict)  # resource -> [device IDs], as advertised
    stamp: tuple | None = None                                 # the state file when last read
    present: set = dataclasses.field(default_factory=set)      # UUIDs on the host then
    assigned: dict = dataclasses.field(default_factory=dict)   # pod uid -> {container: {resource: [IDs]}}


_books: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # cluster -> {node name: _Book}


def reconcile(cluster):
    for node in cluster.list("Node"):
        annotations = node["metadata"].get("annotations") or {}
        path = annotations.get(deviceplugin.NVML_STATE_ANNOTATION)
        if path and POD_RESOURCES_ANNOTATION in annotations:
            _reconcile_node(cluster, node["metadata"]["name"], path)


def sync(cluster):
    """Look at the simulated hosts now (a reconcile pass), e.g. after a module changed a state file."""
    with cluster.lock:
        cluster._reconcile()  # pylint: disable=protected-access


def assigned(cluster, node: str) -> dict:
    """{(namespace, pod name): {container: {resource: [device IDs]}}} on `node` now."""
    with cluster.lock:
        book = _books.get(cluster, {}).get(node) or _Book()
        names = dict((p["metadata"]["uid"], (p["metadata"]["namespace"], p["metadata"]["name"]))
                     for p in cluster.list("Pod", field_selector=f"spec.nodeName={node}"))
        return dict((names[uid], containers) for uid, containers in book.assigned.items() if uid in names)


def pod_resources(cluster, node: str) -> list:
    """What the kubelet's List answers for `node` (pkg/kubelet/apis/podresources/server_v1.go): every active
    pod bound to it, each container (restartable init containers first) with the devices it holds."""
    sync(cluster)
    with cluster.lock:
        book = _books.get(cluster, {}).get(node) or _Book()
        out = []
        for pod in cluster.list("Pod", field_selector=f"spec.nodeName={node}"):
            if (pod.get("status") or {}).get("phase") in _TERMINAL:
                continue
            held = book.assigned.get(pod["metadata"]["uid"], {})
            out.append({"namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"],
                        "containers": [{"name": c["name"],
                                        "devices": [{"resource_name": resource, "device_ids": ids}
                                                    for resource, ids in held.get(c["name"], {}).items()]}
                                       for c in _containers(pod)]})
        return out


def inventory(state: dict, strategy: str) -> dict:
    """{resource: [device IDs]} a device plugin with `strategy` advertises for the simulated host `state`."""
    if not deviceplugin.advertise(state, strategy)["plugin_ok"]:
        return {}
    sim, models = deviceplugin._simulator()  # pylint: disable=protected-access
    whole, mig = [], []   # mig: (resource name, UUID) of advertisable MIG devices, by GPU and placement
    mig_on = []
    for gpu in sorted(state["gpus"], key=lambda g: g["index"]):
        model = models.MODELS[gpu["model"]]
        enabled = bool(gpu.get("mig")) and gpu["mig"]["current"] == sim.MIG_ENABLE
        mig_on.append(enabled)
        if not enabled:
            whole.append(gpu["uuid"])
            continue
        for gi in sorted(gpu.get("gpu_instances") or [], key=lambda g: (g["start"], g["id"])):
            profile = models.gi_profile_by_id(model, gi["profile_id"])
            for ci in gi.get("compute_instances") or []:
                if ci["size"] == profile.sm_slices:
                    mig.append(("nvidia.com/mig-%s" % deviceplugin._sanitize(profile.name),  # pylint: disable=protected-access
                                ci["uuid"]))
    if strategy == "none":
        return {"nvidia.com/gpu": [g["uuid"] for g in sorted(state["gpus"], key=lambda g: g["index"])]}
    if strategy == "single":
        return {"nvidia.com/gpu": [uuid for _resource, uuid in mig] if any(mig_on) else whole}
    out = {"nvidia.com/gpu": whole} if whole else {}
    for resource, uuid in mig:
        out.setdefault(resource, []).append(uuid)
    return out


def host_uuids(state: dict) -> set:
    """Every GPU and MIG device UUID on the simulated host."""
    found = set()
    for gpu in state["gpus"]:
        found.add(gpu["uuid"])
        for gi in gpu.get("gpu_instances") or []:
            found.update(ci["uuid"] for ci in gi.get("compute_instances") or [])
    return found


def _uuid(device_id: str) -> str:
    return device_id.split("::", 1)[0]


def _containers(pod: dict) -> list:
    spec = pod.get("spec") or {}
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    return sidecars + list(spec.get("containers") or [])


def _wanted(container: dict) -> dict:
    resources = container.get("resources") or {}
    merged = dict(resources.get("requests") or {}, **(resources.get("limits") or {}))
    out = {}
    for name, value in merged.items():
        if name.startswith("nvidia.com/"):
            try:
                out[name] = int(str(value))
            except ValueError:
                continue
    return out


def pod_ready(pod: dict) -> bool:
    """Running with its Ready condition true, as the kubelet (here kwok) reports it."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])


def _stamp(path: str):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


def _reconcile_node(cluster, name: str, path: str):
    book = _books.setdefault(cluster, {}).setdefault(name, _Book())
    pods = cluster.list("Pod", field_selector=f"spec.nodeName={name}")
    plugin = next((p for p in pods if deviceplugin.pod_role(p) == deviceplugin.PLUGIN and pod_ready(p)), None)
    plugin_uid = plugin["metadata"]["uid"] if plugin else None
    stamp = _stamp(path)
    if stamp is not None and (stamp != book.stamp or plugin_uid != book.plugin_uid):
        state = deviceplugin._simulator()[0].load_state(path)  # pylint: disable=protected-access
        book.stamp, book.present = stamp, host_uuids(state)
        if plugin_uid != book.plugin_uid:
            book.plugin_uid = plugin_uid
            book.inventory = inventory(state, deviceplugin.mig_strategy(plugin)) if plugin else {}
    elif plugin_uid is None:
        book.plugin_uid, book.inventory = None, {}

    active = dict((p["metadata"]["uid"], p) for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL)
    for uid in [uid for uid in book.assigned if uid not in active]:
        del book.assigned[uid]
    for uid, containers in list(book.assigned.items()):
        gone = [(container, resource, device_id) for container, held in containers.items()
                for resource, ids in held.items() for device_id in ids if _uuid(device_id) not in book.present]
        if gone:
            del book.assigned[uid]
            container, resource, device_id = gone[0]
            _fail(cluster, active.pop(uid), DEVICE_DESTROYED,
                  "device %s (%s) of container %s was destroyed while the pod ran" % (device_id, resource, container))
    if book.plugin_uid is None:
        return   # pods wait for a plugin
    for uid, pod in active.items():
        if uid not in book.assigned and any(_wanted(c) for c in _containers(pod)):
            _admit(cluster, book, pod)


def _admit(cluster, book, pod):
    taken = set(device_id for containers in book.assigned.values() for held in containers.values()
                for ids in held.values() for device_id in ids)
    given = {}
    for container in _containers(pod):
        for resource, count in sorted(_wanted(container).items()):
            free = [d for d in book.inventory.get(resource, []) if d not in taken and _uuid(d) in book.present]
            if len(free) < count:
                # The kubelet's words (pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate).
                _fail(cluster, pod, ADMISSION_FAILED,
                      "Pod was rejected: Allocate failed due to requested number of devices unavailable for %s. "
                      "Requested: %d, Available: %d, which is unexpected" % (resource, count, len(free)))
                return
            given.setdefault(container["name"], {})[resource] = free[:count]
            taken.update(free[:count])
    book.assigned[pod["metadata"]["uid"]] = given


def _fail(cluster, pod, reason: str, message: str):
    status = dict(pod.get("status") or {}, phase="Failed", reason=reason, message=message)
    status["conditions"] = [dict(c, status="False") if c.get("type") in ("Ready", "ContainersReady") else c
                            for c in status.get("conditions") or []]
    status["containerStatuses"] = [
        dict(c, ready=False, started=False, state={"terminated": {"exitCode": 1, "reason": "Error"}})
        for c in status.get("containerStatuses") or []]
    cluster.set_status("Pod", pod["metadata"]["name"], status, pod["metadata"]["namespace"])
