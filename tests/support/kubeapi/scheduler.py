"""A scheduler for extended resources, and pods that finish after a set time, so demand comes and goes.

Follows the default profile of kube-scheduler (kubernetes/kubernetes, pkg/scheduler/framework/plugins) for
what MIG tests need:

- NodeUnschedulable: a cordoned node (spec.unschedulable) takes only pods that tolerate
  node.kubernetes.io/unschedulable:NoSchedule.
- NodeAffinity and TaintToleration (filters): nodeSelector, required node affinity, NoSchedule and
  NoExecute taints against the pod's tolerations (selectors.pod_fits_node, as the DaemonSet controller uses).
- NodeResourcesFit (filter): every extended resource the pod asks for (`nvidia.com/gpu`,
  `nvidia.com/mig-<profile>`; per container its requests, else its limits, summed) fits in the node's
  status.allocatable minus what the pods bound there and not finished ask for. Score: LeastAllocated over
  the requested resources (the default strategy), ties broken by node name.

Only pods that ask for an `nvidia.com/` resource and name no other schedulerName are scheduled; other
unbound pods stay Pending, as the tests that seed them expect. Binding sets spec.nodeName and a
Running status at once (no kubelet admission, no image pulls). A pod annotated RUN_SECONDS_ANNOTATION
("30") turns Succeeded that many seconds after it was bound, which frees its devices.

Not modelled: cpu, memory and pod-count fit, inter-pod affinity, topology spread, preemption, priority
and queueing order beyond creation time, scheduling gates, volumes, init containers' requests, Pending
pods' nominatedNodeName, and the PodScheduled=False condition with its reasons.
"""

from __future__ import annotations

import threading
import weakref

from . import controllers
from .selectors import pod_fits_node

RUN_SECONDS_ANNOTATION = "kubeapi.test/run-seconds"
EXTENDED_PREFIX = "nvidia.com/"
_UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_FINISHED = ("Succeeded", "Failed")

# cluster -> {pod uid: timer}, so a pod's run is timed once
_timers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pod_requests(pod: dict) -> dict:
    """{resource: count} of the extended resources a pod asks for."""
    asked = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = resources.get("requests") or resources.get("limits") or {}
        for name, value in wanted.items():
            if name.startswith(EXTENDED_PREFIX):
                asked[name] = asked.get(name, 0) + _count(value)
    return {k: v for k, v in asked.items() if v > 0}


def _count(value) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _active(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") not in _FINISHED and not pod["metadata"].get("deletionTimestamp")


def _schedulable(node: dict, pod_spec: dict) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        cordon = dict(node, spec=dict(node.get("spec") or {}, taints=[_UNSCHEDULABLE_TAINT]))
        if not pod_fits_node(pod_spec, cordon):
            return False
    return pod_fits_node(pod_spec, node)


def free_resources(node: dict, bound: list) -> dict:
    """The node's allocatable extended resources less what its active pods ask for."""
    free = {k: _count(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
            if k.startswith(EXTENDED_PREFIX)}
    for pod in bound:
        for name, count in pod_requests(pod).items():
            free[name] = free.get(name, 0) - count
    return free


def choose_node(pod: dict, nodes: list, free_by_node: dict):
    """The node the pod goes to, or None: the filters, then the least allocated (then the name)."""
    asked = pod_requests(pod)
    spec = pod.get("spec") or {}
    best, best_key = None, None
    for node in nodes:
        name = node["metadata"]["name"]
        free = free_by_node[name]
        if not _schedulable(node, spec) or any(free.get(r, 0) < c for r, c in asked.items()):
            continue
        alloc = {k: _count(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        # LeastAllocated: the mean share left free of each requested resource after binding.
        score = sum((free.get(r, 0) - c) / max(alloc.get(r, 0), 1) for r, c in asked.items()) / len(asked)
        key = (-score, name)
        if best_key is None or key < best_key:
            best, best_key = node, key
    return best


def reconcile(cluster):
    nodes = cluster.list("Node")
    pods = cluster.list("Pod")
    bound = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and _active(pod):
            bound.setdefault(node, []).append(pod)
    free_by_node = {n["metadata"]["name"]: free_resources(n, bound.get(n["metadata"]["name"], [])) for n in nodes}
    waiting = [p for p in pods if not (p.get("spec") or {}).get("nodeName") and _active(p) and pod_requests(p)
               and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"]
    waiting.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    for pod in waiting:
        node = choose_node(pod, nodes, free_by_node)
        if node is None:
            continue
        name = node["metadata"]["name"]
        for resource, count in pod_requests(pod).items():
            free_by_node[name][resource] -= count
        _bind(cluster, pod, name)
    _time_runs(cluster, pods)


def _bind(cluster, pod, node_name):
    meta = pod["metadata"]
    bound = cluster.patch("Pod", meta["name"], {"spec": {"nodeName": node_name}}, meta["namespace"])
    cluster.set_status("Pod", meta["name"], controllers.running_pod_status(bound), meta["namespace"])


def _time_runs(cluster, pods):
    """Start the clock of each bound pod with a run time; it turns Succeeded when the time is up."""
    timers = _timers.setdefault(cluster, {})
    for pod in pods:
        meta = pod["metadata"]
        seconds = (meta.get("annotations") or {}).get(RUN_SECONDS_ANNOTATION)
        if seconds is None or not (pod.get("spec") or {}).get("nodeName") or not _active(pod) \
                or meta["uid"] in timers:
            continue
        timer = threading.Timer(float(seconds), _finish, args=(cluster, meta["namespace"], meta["name"], meta["uid"]))
        timer.daemon = True
        timers[meta["uid"]] = timer
        timer.start()


def _finish(cluster, namespace, name, uid):
    with cluster.lock:
        pod = cluster.find("Pod", name, namespace)
        if pod is None or pod["metadata"]["uid"] != uid or not _active(pod):
            return
        status = dict(pod.get("status") or {}, phase="Succeeded")
        status["conditions"] = [dict(c, status="False") if c.get("type") in ("Ready", "ContainersReady") else c
                                for c in status.get("conditions") or []]
        status["containerStatuses"] = [
            dict(c, ready=False, started=False, state={"terminated": {"exitCode": 0, "reason": "Completed"}})
            for c in status.get("containerStatuses") or []]
        cluster.set_status("Pod", name, status, namespace)
