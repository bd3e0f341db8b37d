"""The few controllers a test cluster needs, each one converging state in one call.

- DaemonSets get one Running pod per eligible node (nodeSelector, required node
  affinity, taints), pods are replaced when the template changes (RollingUpdate)
  and recreated when deleted, and the DaemonSet's status counts the Ready pods.
- Deployments get a ReplicaSet for their template; Deployments, StatefulSets
  and ReplicaSets get a ready status. No pods are made for them.
- PodDisruptionBudgets with minAvailable or maxUnavailable get their status
  computed from the matching pods, as the disruption controller does. A PDB
  with neither keeps whatever status a test wrote (scripted budgets).
- Nodes linked to a simulated GPU state get device-plugin resources and labels
  (see deviceplugin.py), devices assigned to their pods (allocations.py, where the node asks for it), a DRA kubelet plugin's ResourceSlice (dra.py) and a
  mig-manager (migmanager.py).
- Pending pods that ask for nvidia.com/ resources are bound to a node with room, and pods
  annotated with a run time finish after it (scheduler.py).
- While a ClusterPolicy exists, the GPU Operator labels GPU nodes and keeps its
  operand DaemonSets (operator.py); while only a GPUCluster does, its DRA stack's (gpucluster.py).

Each controller writes only when something differs, so repeated passes settle.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math

from . import allocations, deviceplugin, dra, dynamic, gpucluster, hami, migmanager, operator, scheduler
from .allocations import pod_ready
from .selectors import labels_match, pod_fits_node, selector_requirements

# The DaemonSet controller adds these tolerations to its pods, so cordoned or
# unhealthy nodes keep their daemons.
DAEMON_TOLERATIONS = [
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
    for key, effect in (("not-ready", "NoExecute"), ("unreachable", "NoExecute"), ("disk-pressure", "NoSchedule"),
                        ("memory-pressure", "NoSchedule"), ("pid-pressure", "NoSchedule"),
                        ("unschedulable", "NoSchedule"))
]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_pod_status(pod: dict) -> dict:
    """What a kubelet reports for a started pod whose containers are all ready."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return {
        "phase": "Running",
        "conditions": [{"type": t, "status": "True"} for t in ("PodScheduled", "Initialized", "ContainersReady",
                                                               "Ready")],
        "containerStatuses": [
            {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": True, "started": True,
             "restartCount": 0, "state": {"running": {}}}
            for c in containers
        ],
    }


def controlled_by(obj: dict, owner: dict) -> bool:
    return any(ref.get("uid") == owner["metadata"]["uid"] and ref.get("controller")
               for ref in obj["metadata"].get("ownerReferences") or [])


def _template_hash(template: dict) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def daemonsets(cluster):
    nodes = cluster.list("Node")
    for ds in cluster.list("DaemonSet"):
        _sync_daemonset(cluster, ds, nodes)


def _sync_daemonset(cluster, ds, nodes):
    meta, spec = ds["metadata"], ds.get("spec") or {}
    template = spec.get("template") or {}
    pod_spec = dict(template.get("spec") or {})
    pod_spec["tolerations"] = list(pod_spec.get("tolerations") or []) + DAEMON_TOLERATIONS
    revision = _template_hash(template)
    replace_stale = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate"
    wanted = {n["metadata"]["name"] for n in nodes if pod_fits_node(pod_spec, n)}

    kept = {}
    for pod in cluster.list("Pod", meta["namespace"]):
        if not controlled_by(pod, ds):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        stale = replace_stale and pod["metadata"].get("labels", {}).get("controller-revision-hash") != revision
        if node not in wanted or stale or node in kept:
            cluster.delete("Pod", pod["metadata"]["name"], meta["namespace"])
        else:
            kept[node] = pod
    for node in sorted(wanted - set(kept)):
        cluster.create(_daemon_pod(ds, template, node, revision))

    count = len(wanted)
    ready = sum(1 for p in cluster.list("Pod", meta["namespace"]) if controlled_by(p, ds) and pod_ready(p))
    status = {
        "currentNumberScheduled": count, "desiredNumberScheduled": count, "numberMisscheduled": 0,
        "numberReady": ready, "numberAvailable": ready, "updatedNumberScheduled": count,
        "observedGeneration": meta.get("generation", 1),
    }
    if ready < count:
        status["numberUnavailable"] = count - ready
    cluster.set_status("DaemonSet", meta["name"], status, meta["namespace"])


def _daemon_pod(ds, template, node, revision):
    meta = ds["metadata"]
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.update({"controller-revision-hash": revision, "pod-template-generation": str(meta.get("generation", 1))})
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": meta["name"] + "-", "namespace": meta["namespace"], "labels": labels,
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": dict(template.get("spec") or {}, nodeName=node),
    }
    pod["status"] = running_pod_status(pod)
    return pod


def deployments(cluster):
    """Each Deployment owns a ReplicaSet for its current template (helm --wait looks for it); older ones go."""
    for deploy in cluster.list("Deployment"):
        meta, spec = deploy["metadata"], deploy.get("spec") or {}
        template = spec.get("template") or {}
        revision = _template_hash(template)
        owned = [rs for rs in cluster.list("ReplicaSet", meta["namespace"]) if controlled_by(rs, deploy)]
        for rs in owned:
            if rs["metadata"]["labels"].get("pod-template-hash") != revision:
                cluster.delete("ReplicaSet", rs["metadata"]["name"], meta["namespace"])
        if any(rs["metadata"]["labels"].get("pod-template-hash") == revision for rs in owned):
            continue
        labels = dict((template.get("metadata") or {}).get("labels") or {}, **{"pod-template-hash": revision})
        selector = dict(spec.get("selector") or {})
        selector["matchLabels"] = dict(selector.get("matchLabels") or {}, **{"pod-template-hash": revision})
        cluster.create({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{revision}", "namespace": meta["namespace"], "labels": labels,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"replicas": spec.get("replicas", 1), "selector": selector,
                     "template": dict(template, metadata=dict(template.get("metadata") or {}, labels=labels))},
        })


def workloads(cluster):
    for kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        for obj in cluster.list(kind):
            meta, spec = obj["metadata"], obj.get("spec") or {}
            replicas = spec.get("replicas", 1)
            status = {"observedGeneration": meta.get("generation", 1), "replicas": replicas,
                      "readyReplicas": replicas, "availableReplicas": replicas}
            if kind == "Deployment":
                status["updatedReplicas"] = replicas
                status["conditions"] = [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
                ]
            elif kind == "StatefulSet":
                revision = f"{meta['name']}-{_template_hash(spec.get('template') or {})}"
                status.update(currentReplicas=replicas, updatedReplicas=replicas,
                              currentRevision=revision, updateRevision=revision)
            else:
                status["fullyLabeledReplicas"] = replicas
            cluster.set_status(kind, meta["name"], status, meta["namespace"])


def disruption_budgets(cluster):
    for pdb in cluster.list("PodDisruptionBudget"):
        spec = pdb.get("spec") or {}
        if spec.get("minAvailable") is None and spec.get("maxUnavailable") is None:
            continue  # scripted budget: the test owns its status
        namespace = pdb["metadata"]["namespace"]
        reqs = selector_requirements(spec.get("selector"))
        pods = [p for p in cluster.list("Pod", namespace)
                if labels_match(reqs, p["metadata"].get("labels")) and not p["metadata"].get("deletionTimestamp")]
        healthy = sum(1 for p in pods if pod_ready(p))
        old_conditions = (pdb.get("status") or {}).get("conditions") or [{}]
        expected, desired = _budget(cluster, namespace, pods, spec)
        allowed = max(0, healthy - desired)
        cluster.set_status("PodDisruptionBudget", pdb["metadata"]["name"], {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [_condition(old_conditions[0], "DisruptionAllowed", bool(allowed),
                                      "SufficientPods" if allowed else "InsufficientPods",
                                      pdb["metadata"].get("generation", 1))],
        }, namespace)


def _condition(old, kind, true, reason, generation):
    """A metav1.Condition whose lastTransitionTime moves only when its status flips."""
    status = "True" if true else "False"
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason, "message": "", "observedGeneration": generation,
            "lastTransitionTime": since or now()}


def _budget(cluster, namespace, pods, spec):
    """(expectedPods, desiredHealthy), following the disruption controller's rules."""
    min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
    if isinstance(min_available, int):
        return len(pods), min_available
    # Percentages and maxUnavailable count against the owners' scale, so evicted
    # pods that no controller recreates still count as expected.
    expected = _expected_from_owners(cluster, namespace, pods)
    if min_available is not None:
        return expected, math.ceil(_percent(min_available) * expected)
    unavailable = max_unavailable if isinstance(max_unavailable, int) else math.ceil(
        _percent(max_unavailable) * expected)
    return expected, max(0, expected - unavailable)


def _percent(value) -> float:
    return float(str(value).rstrip("%")) / 100


def _expected_from_owners(cluster, namespace, pods):
    expected, seen = 0, set()
    for pod in pods:
        ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        owner = None
        if ref and ref.get("kind") in ("ReplicaSet", "StatefulSet", "ReplicationController"):
            owner = cluster.find(ref["kind"], ref["name"], namespace)
        if owner is None:
            expected += 1
        elif owner["metadata"]["uid"] not in seen:
            seen.add(owner["metadata"]["uid"])
            expected += (owner.get("spec") or {}).get("replicas", 1)
    return expected


ALL = (operator.reconcile, gpucluster.reconcile, daemonsets, deployments, workloads, disruption_budgets,
       deviceplugin.reconcile, scheduler.reconcile, allocations.reconcile, dra.reconcile, dynamic.reconcile,
       hami.reconcile, migmanager.reconcile)
