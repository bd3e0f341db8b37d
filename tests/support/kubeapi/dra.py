"""A simulated kubelet plugin of NVIDIA's DRA driver for GPUs (driver gpu.nvidia.com).

Like the device plugin stand-in (deviceplugin.py) it acts only when its pod **starts** on a node
linked to a simulated GPU host (annotation kubeapi.test/nvml-state): a pod labelled
app.kubernetes.io/name=dra-driver-nvidia-gpu (seed.dra_driver) that this module has not seen
before. Then (reference/gpu-operator.md section 6):

- With DynamicMIG=true in its FEATURE_GATES env, it first destroys every MIG device (compute and
  GPU instances) on the host, since it destroys the MIG devices it did not create and it created
  none yet; devices with processes on them stay (NVML answers In use). The simulated state file
  changes as it would on a real host. Then dynamic.py publishes what DynamicMIG announces.
- Without it, it replaces the node's ResourceSlice `<node>-gpu.nvidia.com`: one pool named after the node,
  `generation` one higher than before, `resourceSliceCount` 1, and a device per MIG device
  (`gpu-<gpu index>-mig-<profile without dots>-<GI profile id>-<GI start>`, attributes type=mig,
  profile, uuid, parentUUID, productName; capacity memory "<MiB>Mi") and per GPU with MIG off
  (`gpu-<index>`, type=gpu, uuid, productName; capacity memory). A GPU with MIG on and no MIG
  devices is published as nothing. The slice is owned by the Node.

The GPUs are read only at pod start (static MIG), so a slice stays stale after a MIG change until
the pod is replaced. With DynamicMIG, dynamic.py publishes the placements and shared counters, and
removes the node's slices when the plugin leaves it. Not emulated: claims and preparation,
ComputeDomains, the other attributes and capacities.
"""

from __future__ import annotations

import re
import weakref

from . import dynamic
from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

DRIVER = "gpu.nvidia.com"
POD_LABEL = ("app.kubernetes.io/name", "dra-driver-nvidia-gpu")

# cluster -> {node name: uid of the plugin pod whose start was handled}
_started: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def feature_gates(pod: dict) -> set:
    gates = set()
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "FEATURE_GATES":
                gates |= {g.strip() for g in (env.get("value") or "").split(",") if g.strip()}
    return gates


def reconcile(cluster):
    started = _started.setdefault(cluster, {})
    key, value = POD_LABEL
    pods = cluster.list("Pod", label_selector=f"{key}={value}")
    if not pods:
        return
    for node in cluster.list("Node"):
        path = (node["metadata"].get("annotations") or {}).get(NVML_STATE_ANNOTATION)
        name = node["metadata"]["name"]
        mine = [p for p in pods if (p.get("spec") or {}).get("nodeName") == name
                and (p.get("status") or {}).get("phase") == "Running"]
        if not path or not mine:
            continue
        pod = mine[-1]
        if started.get(name) == pod["metadata"]["uid"]:
            continue
        started[name] = pod["metadata"]["uid"]
        if "DynamicMIG=true" in feature_gates(pod):
            destroy_mig_devices(path)
            dynamic.publish(cluster, node, path)      # every profile at every placement (dynamic.py)
        else:
            publish(cluster, node, path)


def destroy_mig_devices(path):
    """Destroy every MIG device without processes on the simulated host, as NVML would let the plugin."""
    sim = _simulator()[0]
    store = sim.state.StateStore(path)
    with store.transaction() as state:
        for gpu in state["gpus"]:
            if not sim.state.mig_enabled(gpu):
                continue
            for gi in list(gpu["gpu_instances"]):
                for ci in list(gi["compute_instances"]):
                    if not sim.state.gpu_processes(state, gpu, gi["id"], ci["id"]):
                        gi["compute_instances"].remove(ci)
                if not gi["compute_instances"] and not sim.state.gpu_processes(state, gpu, gi["id"]):
                    gpu["gpu_instances"].remove(gi)


def devices(state) -> list:
    """The ResourceSlice devices for a simulated host's current GPUs."""
    sim, models = _simulator()
    out = []
    for gpu in state["gpus"]:
        model = models.MODELS[gpu["model"]]
        common = {"productName": {"string": model.name}, "driverVersion": {"version": state["driver_version"]}}
        if not sim.state.mig_enabled(gpu):
            out.append({"name": f"gpu-{gpu['index']}",
                        "attributes": dict(common, type={"string": "gpu"}, uuid={"string": gpu["uuid"]}),
                        "capacity": {"memory": {"value": f"{model.memory_mib}Mi"}}})
            continue
        for gi, ci in sim.state.mig_devices(gpu):
            gi_profile = sim.state.profile_of_gi(model, gi)
            profile = sim.state.mig_device_name(model, gi, ci)
            canonical = re.sub(r"[^a-z0-9-]", "", profile.lower().replace(".", "").replace("+", "-"))
            out.append({
                "name": f"gpu-{gpu['index']}-mig-{canonical}-{gi_profile.id}-{gi['start']}",
                "attributes": dict(common, type={"string": "mig"}, profile={"string": profile},
                                   uuid={"string": ci["uuid"]}, parentUUID={"string": gpu["uuid"]}),
                "capacity": {"memory": {"value": f"{gi_profile.memory_mib}Mi"}},
            })
    return out


def publish(cluster, node, path):
    sim = _simulator()[0]
    name = node["metadata"]["name"]
    old = cluster.find("ResourceSlice", slice_name(name))
    generation = ((old or {}).get("spec") or {}).get("pool", {}).get("generation", 0) + 1
    manifest = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": slice_name(name), "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"], "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": name,
                 "pool": {"name": name, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices(sim.load_state(path))},
    }
    if old is None:
        cluster.create(manifest)
    else:
        manifest["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        cluster.replace(manifest)
