"""What NVIDIA's DRA kubelet plugin publishes with its DynamicMIG feature gate, and the kubelet's clean-up when a
DRA plugin leaves a node. dra.py calls publish() for a plugin pod that starts with DynamicMIG=true (after it has
destroyed the MIG devices it did not create); reconcile() runs with the other controllers.

Follows kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin (nvlib.go GetPerGpuAllocatableDevices,
isDynamicMIGCapable, inspectMigProfilesAndPlacements; driver.go generateSplitResourceSlices; partitions.go;
mig.go ToCanonicalName), as reference/gpu-operator.md section 6.3 sums it up:

- A GPU is dynamic-MIG capable when it is MIG-capable and either Hopper or later (MIG mode toggles without a
  reset) or Ampere with MIG mode already on. Then every MIG profile is published at every legal placement, as an
  abstract device without `uuid` (`gpu-<index>-mig-<profile without dots>-<GI profile id>-<placement start>`,
  attributes type=mig, profile, parentUUID, productName), and the whole GPU (`gpu-<index>`, type=gpu, uuid) unless
  it is an Ampere GPU with MIG on. Other GPUs are published as whole GPUs, as without the gate.
- Partitionable devices (KEP-4815), in the split form of Kubernetes 1.35 and later: one ResourceSlice with a shared
  counter set per GPU (`gpu-<index>-counter-set`: memory, and a counter per memory slice), then one ResourceSlice
  of devices per GPU, each device consuming the memory slices of its placement (the whole GPU all of them). All
  in one pool named after the node, one generation higher than before, resourceSliceCount the number of slices.
- The kubelet deletes a driver's ResourceSlices of a node once its plugin has been gone from the node for 30 s
  (reconcile(); the node annotation kubeapi.test/dra-wiping-delay shortens it for tests). The plugin is the pod of
  either chart: the standalone driver's (seed.dra_driver) or the GPU Operator's for a GPUCluster (gpucluster.py).

Not modelled: the `+me`/`+gfx`/`-me` profile variants (only plain profiles are published), capacities other than
memory, the combined form of Kubernetes 1.34, claims, preparation (creating a MIG device per claim), and the
node-local checkpoint.
"""

from __future__ import annotations

import re
import threading
import weakref

from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

DRIVER = "gpu.nvidia.com"
POD_LABEL = ("app.kubernetes.io/name", "dra-driver-nvidia-gpu")
# The same plugin as GPU Operator v26.7 renders it for a GPUCluster (gpucluster.py).
OPERATOR_POD_LABEL = ("app.kubernetes.io/name", "nvidia-dra-driver")
PLUGIN_POD_LABELS = (POD_LABEL, OPERATOR_POD_LABEL)
WIPING_DELAY_ANNOTATION = "kubeapi.test/dra-wiping-delay"
DEFAULT_WIPING_DELAY = 30.0

# cluster -> {node name: the timer of its pending wipe}
_wipes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _canonical(profile: str) -> str:
    return re.sub(r"[^a-z0-9-]", "", profile.lower().replace(".", "").replace("+", "-"))


def driver_version(state) -> dict:
    """The driverVersion attribute: a semantic version, as the API server requires of a version
    attribute. kubernetes-sigs/dra-driver-nvidia-gpu (GpuInfo.Attributes in its
    cmd/gpu-kubelet-plugin) publishes semver.MustParse(driverVersion).String() with
    Masterminds/semver/v3, which reads 570.124.06 leniently as 570.124.6."""
    parts = state["driver_version"].split(".")
    return {"version": ".".join(str(int(p)) if p.isdigit() else p for p in parts)}


def gpu_slices(state) -> tuple:
    """(counter sets, [devices per GPU]) for a simulated host under DynamicMIG."""
    sim, models = _simulator()
    counter_sets, per_gpu = [], []
    for gpu in state["gpus"]:
        model = models.MODELS[gpu["model"]]
        common = {"productName": {"string": model.name}, "driverVersion": driver_version(state)}
        whole = {"name": f"gpu-{gpu['index']}",
                 "attributes": dict(common, type={"string": "gpu"}, uuid={"string": gpu["uuid"]}),
                 "capacity": {"memory": {"value": f"{model.memory_mib}Mi"}}}
        toggles = model.architecture >= models.ARCH_HOPPER
        on = sim.state.mig_enabled(gpu)
        if not models.is_mig_capable(model) or not (toggles or on):
            per_gpu.append([whole])
            continue
        counter_set = f"gpu-{gpu['index']}-counter-set"
        plain = [p for p in model.gi_profiles.values() if re.fullmatch(r"\d+g\.\d+gb", p.name)]
        largest = max(p.memory_mib for p in plain)
        counters = {"memory": {"value": f"{largest}Mi"}}
        counters.update((f"memory-slice-{i}", {"value": "1"}) for i in range(model.memory_slices))
        counter_sets.append({"name": counter_set, "counters": counters})
        devices = []
        if toggles or not on:
            devices.append(dict(whole, consumesCounters=[{"counterSet": counter_set, "counters": counters}]))
        for profile in sorted(plain, key=lambda p: (p.memory_slices, p.id)):
            for start in profile.starts:
                used = {"memory": {"value": f"{profile.memory_mib}Mi"}}
                used.update((f"memory-slice-{i}", {"value": "1"})
                            for i in range(start, start + profile.memory_slices))
                devices.append({
                    "name": f"gpu-{gpu['index']}-mig-{_canonical(profile.name)}-{profile.id}-{start}",
                    "attributes": dict(common, type={"string": "mig"}, profile={"string": profile.name},
                                       parentUUID={"string": gpu["uuid"]}),
                    "capacity": {"memory": {"value": f"{profile.memory_mib}Mi"}},
                    "consumesCounters": [{"counterSet": counter_set, "counters": used}],
                })
        per_gpu.append(devices)
    return counter_sets, per_gpu


def node_slices(cluster, name: str) -> list:
    return [s for s in cluster.list("ResourceSlice")
            if (s.get("spec") or {}).get("driver") == DRIVER and (s.get("spec") or {}).get("nodeName") == name]


def publish(cluster, node, path):
    """Replace the node's ResourceSlices of gpu.nvidia.com with what a DynamicMIG plugin publishes."""
    sim = _simulator()[0]
    name = node["metadata"]["name"]
    old = node_slices(cluster, name)
    generation = max([(s["spec"].get("pool") or {}).get("generation", 0) for s in old] or [0]) + 1
    for s in old:
        cluster.delete("ResourceSlice", s["metadata"]["name"])
    counter_sets, per_gpu = gpu_slices(sim.load_state(path))
    specs = ([{"sharedCounters": counter_sets}] if counter_sets else []) + [{"devices": d} for d in per_gpu]
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"], "controller": True}
    for i, spec in enumerate(specs):
        cluster.create({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-{DRIVER}-{i}", "ownerReferences": [dict(owner)]},
            "spec": dict(spec, driver=DRIVER, nodeName=name,
                         pool={"name": name, "generation": generation, "resourceSliceCount": len(specs)}),
        })


def reconcile(cluster):
    """The kubelet wipes a DRA driver's ResourceSlices of a node once the driver's plugin has been gone from the
    node for its wiping delay (kubernetes/kubernetes pkg/kubelet/cm/dra: defaultWipingDelay, 30 s, "long enough for
    a simple container restart"); the node annotation WIPING_DELAY_ANNOTATION sets it in seconds (a test knob).
    A plugin that comes back within the delay keeps its slices."""
    timers = _wipes.setdefault(cluster, {})
    on_nodes = _plugin_nodes(cluster)
    for node in cluster.list("Node"):
        name = node["metadata"]["name"]
        annotations = node["metadata"].get("annotations") or {}
        if name in on_nodes or not annotations.get(NVML_STATE_ANNOTATION) or not node_slices(cluster, name):
            timer = timers.pop(name, None)
            if timer is not None:
                timer.cancel()
            continue
        if name not in timers:
            delay = float(annotations.get(WIPING_DELAY_ANNOTATION, DEFAULT_WIPING_DELAY))
            timers[name] = threading.Timer(delay, _wipe, args=(cluster, name))
            timers[name].daemon = True
            timers[name].start()


def plugin_pods(cluster) -> list:
    """The DRA kubelet plugin's pods, as seed.dra_driver and the GPUCluster (gpucluster.py) deploy them."""
    return [p for key, value in PLUGIN_POD_LABELS for p in cluster.list("Pod", label_selector=f"{key}={value}")]


def _plugin_nodes(cluster) -> set:
    return {(p.get("spec") or {}).get("nodeName") for p in plugin_pods(cluster)}


def _wipe(cluster, name):
    with cluster.lock:
        _wipes.setdefault(cluster, {}).pop(name, None)
        if name in _plugin_nodes(cluster):
            return
        for s in node_slices(cluster, name):
            cluster.delete("ResourceSlice", s["metadata"]["name"])
