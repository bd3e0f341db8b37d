"""A simulated kubelet plugin of NVIDIA's DRA driver for GPUs (driver gpu.nvidia.com).

Like the device plugin stand-in (deviceplugin.py) it acts only when its pod **starts** on a node
linked to a simulated GPU host (annotation kubeapi.test/nvml-state): a pod labelled
app.kubernetes.io/name=dra-driver-nvidia-gpu (seed.dra_driver), or nvidia-dra-driver (the GPU Operator's
for a GPUCluster, gpucluster.py), that this module has not seen before. Then (reference/gpu-operator.md section 6):

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
removes the node's slices when the plugin leaves it.

ResourceClaims (`allocate_claims`), as the scheduler's DRA plugin and the resourceclaim controller
(kubernetes/kubernetes pkg/scheduler/framework/plugins/dynamicresources, pkg/controller/resourceclaim)
leave them, on every reconcile pass:

- A pod bound to a node this module published a slice for, not Succeeded or Failed, gets each claim its
  spec.resourceClaims names by resourceClaimName (in its namespace) allocated on that node, if it is
  not yet: per request of spec.devices.requests (`exactly`: deviceClassName gpu.nvidia.com or
  mig.nvidia.com, count, default 1), devices of the node's slice of that type that no other claim
  holds, in slice order, whose attributes match the selectors. A selector is read only in the form
  `device.attributes['gpu.nvidia.com'].<name> == '<value>'` (joined by &&); any other CEL expression
  matches nothing. status.allocation gets devices.results (request, driver, pool, device) and a
  nodeSelector on the node's name; status.reservedFor the pod (resource pods, name, uid). A claim
  already allocated on the node is only reserved for the pod too. Too few free devices: the claim
  stays unallocated (the real scheduler would not have bound the pod).
- A claim it allocates gets kube-scheduler's finalizer first, so that kube-controller-manager's
  resource claim controller (pkg/controller/resourceclaim/controller.go) takes a pod deleted or
  terminal out of reservedFor and deallocates the claim once nobody holds it, as on a cluster.
- A claim's device whose UUID (its slice's uuid attribute when allocated) is gone from the simulated
  host marks the pods it is reserved for Failed, reason DeviceDestroyed, as allocations.py does for
  the device plugin.

Not emulated: ResourceClaimTemplates, firstAvailable,
adminAccess, allocation modes other than ExactCount, CEL beyond the form above, preparation and CDI,
the pod waiting for its claims (pods run whether or not their claims are allocated), ComputeDomains,
the other attributes and capacities.
"""

from __future__ import annotations

import re
import weakref

from . import allocations, dynamic
from .deviceplugin import NVML_STATE_ANNOTATION, _simulator

DRIVER = "gpu.nvidia.com"
POD_LABEL = dynamic.POD_LABEL
OPERATOR_POD_LABEL = dynamic.OPERATOR_POD_LABEL

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


# cluster -> {claim uid: {device name: UUID when allocated}}
_claimed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TERMINAL = ("Succeeded", "Failed")
# What kube-scheduler puts on a claim it allocates (k8s.io/api/resource/v1 Finalizer). The
# resource claim controller deallocates a claim left unreserved only when it carries this.
ALLOCATED_FINALIZER = "resource.kubernetes.io/delete-protection"
_TYPE_OF_CLASS = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
_SELECTOR = re.compile(r"""^device\.attributes\[['"]gpu\.nvidia\.com['"]\]\.(\w+)\s*==\s*['"]([^'"]*)['"]$""")


def reconcile(cluster):
    _start_plugins(cluster)
    allocate_claims(cluster)


def _start_plugins(cluster):
    started = _started.setdefault(cluster, {})
    pods = dynamic.plugin_pods(cluster)
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
        common = {"productName": {"string": model.name}, "driverVersion": dynamic.driver_version(state)}
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


def allocate_claims(cluster):
    """Allocate, reserve, release and check the ResourceClaims of pods on nodes with this driver's slice."""
    claims = cluster.list("ResourceClaim")
    if not claims:
        return
    claimed = _claimed.setdefault(cluster, {})
    slices = dict((sl["spec"].get("nodeName"), sl) for sl in cluster.list("ResourceSlice")
                  if (sl.get("spec") or {}).get("driver") == DRIVER)
    active = dict((p["metadata"]["uid"], p) for p in cluster.list("Pod")
                  if (p.get("status") or {}).get("phase") not in _TERMINAL)
    for pod in active.values():
        node = (pod.get("spec") or {}).get("nodeName")
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = ref.get("resourceClaimName")
            claim = cluster.find("ResourceClaim", name, pod["metadata"]["namespace"]) if name else None
            if claim is not None and node in slices:
                _reserve(cluster, claimed, claim, pod, node, slices[node])
    _check_devices(cluster, claimed)


def _reserve(cluster, claimed, claim, pod, node, resource_slice):
    status = dict(claim.get("status") or {})
    consumer = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    if consumer in (status.get("reservedFor") or []):
        return
    if not status.get("allocation"):
        results = _allocate(cluster, claim, node, resource_slice)
        if results is None:
            return
        claim = _add_finalizer(cluster, claim)
        by_name = dict((d["name"], d) for d in resource_slice["spec"]["devices"])
        claimed[claim["metadata"]["uid"]] = dict(
            (r["device"], ((by_name[r["device"]].get("attributes") or {}).get("uuid") or {}).get("string"))
            for r in results)
        status["allocation"] = {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    elif not _allocated_on(status, node):
        return        # allocated on another node: the pod could not have been bound here
    status["reservedFor"] = list(status.get("reservedFor") or []) + [consumer]
    _update(cluster, claim, {"status": status}, "status")


def _add_finalizer(cluster, claim):
    """The scheduler's finalizer on the claim, before it is allocated."""
    finalizers = list(claim["metadata"].get("finalizers") or [])
    if ALLOCATED_FINALIZER in finalizers:
        return claim
    return _update(cluster, claim, {"metadata": {"finalizers": finalizers + [ALLOCATED_FINALIZER]}})


def _update(cluster, claim, body, subresource=None):
    """Writes `body` only over the claim as read, as kube-scheduler's updates do: read from a
    cache that lags (a pod already gone, the claim already released) it is refused (409), and
    the next pass reads again. Unguarded, a stale pass re-allocated a released claim after the
    resource claim controller had taken the finalizer off, and nobody deallocated it again."""
    body = dict(body, metadata=dict(body.get("metadata") or {},
                                    resourceVersion=claim["metadata"]["resourceVersion"]))
    return cluster.patch("ResourceClaim", claim["metadata"]["name"], body,
                         claim["metadata"]["namespace"], subresource=subresource)


def _allocated_on(status, node):
    terms = ((status.get("allocation") or {}).get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    return any(node in (f.get("values") or []) for t in terms for f in t.get("matchFields") or [])


def _allocate(cluster, claim, node, resource_slice):
    """The results for the claim's requests from the node's free devices; None when they do not fit."""
    taken = set()
    for other in cluster.list("ResourceClaim"):
        for result in (((other.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []:
            if result.get("driver") == DRIVER and result.get("pool") == node:
                taken.add(result.get("device"))
    results = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        exactly = request.get("exactly") or {}
        wanted_type = _TYPE_OF_CLASS.get(exactly.get("deviceClassName"))
        count = int(exactly.get("count") or 1)
        free = [d for d in resource_slice["spec"]["devices"] if d["name"] not in taken
                and _attribute(d, "type") == wanted_type and _selected(d, exactly.get("selectors") or [])]
        if wanted_type is None or (exactly.get("allocationMode") or "ExactCount") != "ExactCount" or len(free) < count:
            return None
        for device in free[:count]:
            taken.add(device["name"])
            results.append({"request": request.get("name"), "driver": DRIVER, "pool": node, "device": device["name"]})
    return results


def _attribute(device, name):
    value = (device.get("attributes") or {}).get(name) or {}
    return value.get("string", value.get("version"))


def _selected(device, selectors):
    for selector in selectors:
        expression = ((selector or {}).get("cel") or {}).get("expression") or ""
        for term in expression.split("&&"):
            match = _SELECTOR.match(term.strip())
            if not match or _attribute(device, match.group(1)) != match.group(2):
                return False
    return True


def _check_devices(cluster, claimed):
    """Pods whose claimed device is gone from the simulated host fail (allocations.DEVICE_DESTROYED)."""
    nodes = dict((n["metadata"]["name"], (n["metadata"].get("annotations") or {}).get(NVML_STATE_ANNOTATION))
                 for n in cluster.list("Node"))
    present = {}
    for claim in cluster.list("ResourceClaim"):
        held = claimed.get(claim["metadata"]["uid"]) or {}
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for result in results:
            path = nodes.get(result.get("pool"))
            uuid = held.get(result.get("device"))
            if not path or not uuid:
                continue
            if path not in present:
                present[path] = allocations.host_uuids(_simulator()[0].load_state(path))
            if uuid in present[path]:
                continue
            for consumer in (claim.get("status") or {}).get("reservedFor") or []:
                pod = cluster.find("Pod", consumer.get("name"), claim["metadata"]["namespace"])
                if pod is not None and (pod.get("status") or {}).get("phase") not in _TERMINAL:
                    allocations._fail(cluster, pod, allocations.DEVICE_DESTROYED,  # pylint: disable=protected-access
                                      "device %s (%s) of claim %s was destroyed while the pod ran"
                                      % (result.get("device"), uuid, claim["metadata"]["name"]))
