"""A simulated NVIDIA device plugin and GPU Feature Discovery for nodes linked to a simulated GPU host.

Link a node to a state file of the GPU simulator (simulator/gpuops_mig_sim) with the node
annotation NVML_STATE_ANNOTATION (seed.node(..., nvml_state=path) sets it).
Like the real daemons, which read the GPUs only when they start, the stand-in
reads the state file when a device-plugin or GFD pod appears on the node
(created by the DaemonSet controller, e.g. after a role deletes the old pod;
seen after a watch event, see tests/support/controlplane/standins.py):

- a plugin pod publishes node capacity/allocatable `nvidia.com/gpu` and
  `nvidia.com/mig-<profile>` for the MIG_STRATEGY of its container env (none without one: the
  operator sets none for a ClusterPolicy without mig.strategy and leaves the plugin to its default,
  NVIDIA/gpu-operator controllers/object_controls.go applyMIGConfiguration); a resource it no longer
  advertises stays at 0, as the kubelet keeps it, until a patch of the Node's status removes it;
- a GFD pod publishes the GFD labels (`nvidia.com/gpu.product`, `.count`,
  `nvidia.com/mig.capable`, `nvidia.com/mig.strategy`, `nvidia.com/mig-<profile>.count`, ...).

Rules (reference/mig-facts.md section 4): `none` advertises every GPU whole;
`mixed` advertises GPUs without MIG as nvidia.com/gpu and each MIG device whose
compute instance spans its GPU instance as nvidia.com/mig-<profile> ("+" becomes
"."); `single` advertises MIG devices as nvidia.com/gpu when every GPU has MIG
on with one profile, and otherwise the plugin fails to start (its pod is not
Ready, nothing is advertised) and GFD labels the product <model>-MIG-INVALID.
The plugin's config (the ConfigMap entry the nvidia.com/device-plugin.config label selects) and its
sharing are applied by sharing.py.
"""

from __future__ import annotations

import collections
import os
import sys
import weakref

from . import sharing

NVML_STATE_ANNOTATION = "kubeapi.test/nvml-state"
PLUGIN = "plugin"
GFD = "gfd"
# Pod labels that identify the daemons: the nvidia-device-plugin chart, then the GPU Operator.
_POD_ROLES = {
    ("app.kubernetes.io/name", "nvidia-device-plugin"): PLUGIN,
    ("app", "nvidia-device-plugin-daemonset"): PLUGIN,
    ("app.kubernetes.io/name", "nvidia-device-plugin-gpu-feature-discovery"): GFD,
    ("app.kubernetes.io/name", "gpu-feature-discovery"): GFD,
    ("app", "gpu-feature-discovery"): GFD,
}
_FAMILIES = {7: "ampere", 8: "ada-lovelace", 9: "hopper", 10: "blackwell"}  # NVML architecture -> GFD family
_KEEP = ("nvidia.com/gpu.present", "nvidia.com/gpu.deploy.")  # set by people or the operator, never by GFD

Gpu = collections.namedtuple("Gpu", "model mig_on devices")  # devices: profiles of advertisable MIG devices

# (cluster, node, role) -> uid of the pod whose start was last published
_published: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _simulator():
    """The GPU simulator of this collection (imported lazily: only linked nodes need it)."""
    try:
        import gpuops_mig_sim
    except ImportError:
        repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
        sys.path.insert(0, os.path.join(repo, "simulator"))
        import gpuops_mig_sim
    return gpuops_mig_sim, gpuops_mig_sim.models


def pod_role(pod: dict):
    labels = pod["metadata"].get("labels") or {}
    return next((role for (key, value), role in _POD_ROLES.items() if labels.get(key) == value), None)


def mig_strategy(pod: dict) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "MIG_STRATEGY" and env.get("value"):
                return env["value"]
    return "none"


def reconcile(cluster):
    published = _published.setdefault(cluster, {})
    for node in cluster.list("Node"):
        path = (node["metadata"].get("annotations") or {}).get(NVML_STATE_ANNOTATION)
        if not path:
            continue
        name = node["metadata"]["name"]
        pods = cluster.list("Pod", field_selector=f"spec.nodeName={name}")
        for pod in pods:
            role = pod_role(pod)
            if role is None or published.get((name, role)) == pod["metadata"]["uid"]:
                continue
            view = advertise(_simulator()[0].load_state(path), mig_strategy(pod))
            view = sharing.apply(cluster, node, pod, view, mig_strategy(pod), role == PLUGIN)
            if role == PLUGIN and not view["plugin_ok"] and not started(pod):
                continue  # it crashes once started: kwok's late status would overwrite the crash
            published[(name, role)] = pod["metadata"]["uid"]
            if role == PLUGIN:
                _publish_resources(cluster, node, view)
                if not view["plugin_ok"]:
                    cluster.set_status("Pod", pod["metadata"]["name"], _crashing(pod, view.get("plugin_error")),
                                       pod["metadata"]["namespace"])
            else:
                _publish_labels(cluster, node, view)
            node = cluster.get("Node", name)
        sharing.refuse_oversized_requests(cluster, name, pods)


def started(pod: dict) -> bool:
    """The kubelet has started the pod (kwok, which may do so later than the stand-ins see the
    pod): a status written before would be overwritten."""
    return (pod.get("status") or {}).get("phase") == "Running"


def _publish_resources(cluster, node, view):
    """The kubelet's view of the plugin's resources. A resource the plugin no longer advertises stays at 0, as
    a real kubelet keeps it until the node restarts (k8s-device-plugin #214, #240); a status patch may remove it."""
    status = node.get("status") or {}
    for field in ("capacity", "allocatable"):
        kept = {k: ("0" if k.startswith("nvidia.com/") else v) for k, v in (status.get(field) or {}).items()}
        status[field] = dict(kept, **{k: str(v) for k, v in view["resources"].items()})
    cluster.set_status("Node", node["metadata"]["name"], status)


def _publish_labels(cluster, node, view):
    old = node["metadata"].get("labels") or {}
    stale = {k: None for k in old if _managed_label(k) and k not in view["labels"]}
    cluster.patch("Node", node["metadata"]["name"], {"metadata": {"labels": dict(stale, **view["labels"])}})


def _managed_label(key: str) -> bool:
    if key.startswith(_KEEP):
        return False
    return key.startswith(("nvidia.com/gpu.", "nvidia.com/mig-", "nvidia.com/cuda.")) or key in (
        "nvidia.com/mig.capable", "nvidia.com/mig.strategy", "nvidia.com/mps.capable")


def _crashing(pod, message=None):
    status = dict(pod.get("status") or {}, phase="Running")
    status["conditions"] = [dict(c, status="False") if c.get("type") in ("Ready", "ContainersReady") else c
                            for c in status.get("conditions") or []]
    status["containerStatuses"] = [
        dict(c, ready=False, started=False, restartCount=1,
             state={"waiting": {"reason": "CrashLoopBackOff",
                                "message": message or "all devices on the node must be configured with the same "
                                                      "migEnabled value and one MIG profile for migStrategy=single"}})
        for c in status.get("containerStatuses") or []]
    return status


def _sanitize(text: str) -> str:
    return text.replace(" ", "-").replace("+", ".")


def advertise(state: dict, strategy: str) -> dict:
    """What the plugin and GFD would publish for a simulated host: resources, labels, plugin_ok."""
    sim, models = _simulator()
    gpus = []
    for gpu in state["gpus"]:
        model = models.MODELS[gpu["model"]]
        devices = []  # only compute instances that span their GPU instance are advertised
        for gi in sorted(gpu.get("gpu_instances") or [], key=lambda g: g["id"]):
            profile = models.gi_profile_by_id(model, gi["profile_id"])
            devices += [profile for ci in gi.get("compute_instances") or [] if ci["size"] == profile.sm_slices]
        gpus.append(Gpu(model, bool(gpu.get("mig")) and gpu["mig"]["current"] == sim.MIG_ENABLE, devices))
    if not gpus:
        return {"resources": {}, "labels": {}, "plugin_ok": True}

    first = gpus[0].model
    labels = {
        "nvidia.com/gpu.product": _sanitize(first.name),
        "nvidia.com/gpu.memory": str(first.memory_mib),
        "nvidia.com/gpu.family": _FAMILIES.get(first.architecture, "undefined"),
        "nvidia.com/gpu.compute.major": str(first.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(first.compute_capability[1]),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/cuda.driver-version.full": state["driver_version"],
        "nvidia.com/cuda.driver-version.major": state["driver_version"].split(".")[0],
        "nvidia.com/cuda.runtime-version.major": str(state["cuda_driver_version"] // 1000),
        "nvidia.com/cuda.runtime-version.minor": str(state["cuda_driver_version"] % 1000 // 10),
        "nvidia.com/mig.capable": "true" if any(models.is_mig_capable(g.model) for g in gpus) else "false",
    }
    resources = {}
    plugin_ok = True
    if strategy == "none":
        resources["nvidia.com/gpu"] = len(gpus)
        labels["nvidia.com/gpu.count"] = str(len(gpus))
    elif strategy == "mixed":
        whole = [g for g in gpus if not g.mig_on]
        if whole:
            resources["nvidia.com/gpu"] = len(whole)
        labels["nvidia.com/gpu.count"] = str(len(whole))
        labels["nvidia.com/mig.strategy"] = "mixed"
        for gpu in gpus:
            for profile in gpu.devices if gpu.mig_on else []:
                key = f"mig-{_sanitize(profile.name)}"
                resources[f"nvidia.com/{key}"] = resources.get(f"nvidia.com/{key}", 0) + 1
                labels.update({
                    f"nvidia.com/{key}.count": str(resources[f"nvidia.com/{key}"]),
                    f"nvidia.com/{key}.memory": str(profile.memory_mib),
                    f"nvidia.com/{key}.slices.gi": str(profile.sm_slices),
                    f"nvidia.com/{key}.slices.ci": str(profile.sm_slices),
                    f"nvidia.com/{key}.product": _sanitize(f"{gpu.model.name}-MIG-{profile.name}"),
                })
    elif strategy == "single":
        labels["nvidia.com/mig.strategy"] = "single"
        profiles = {p.name for g in gpus for p in g.devices}
        if all(g.mig_on and g.devices for g in gpus) and len(profiles) == 1:
            profile = gpus[0].devices[0]
            count = sum(len(g.devices) for g in gpus)
            resources["nvidia.com/gpu"] = count
            labels.update({
                "nvidia.com/gpu.product": _sanitize(f"{first.name}-MIG-{profile.name}"),
                "nvidia.com/gpu.count": str(count),
                "nvidia.com/gpu.memory": str(profile.memory_mib),
                "nvidia.com/gpu.slices.gi": str(profile.sm_slices),
                "nvidia.com/gpu.slices.ci": str(profile.sm_slices),
            })
        elif not any(g.mig_on for g in gpus):
            resources["nvidia.com/gpu"] = len(gpus)  # no MIG anywhere: single behaves like none
            labels["nvidia.com/gpu.count"] = str(len(gpus))
        else:
            plugin_ok = False
            labels.update({"nvidia.com/gpu.product": _sanitize(f"{first.name}-MIG-INVALID"),
                           "nvidia.com/gpu.count": "0"})
    else:
        plugin_ok = False  # the real plugin exits on an unknown strategy
    return {"resources": resources, "labels": labels, "plugin_ok": plugin_ok}
