# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pods of a node the mig_node role's steps touch, on the controller: the pods a drain evicts, the
device plugin and GFD pods restarted after a change, the smoke workloads that check the new devices.
Plain data in and out (pods as the API serves them); plugins/filter/node_pods.py wraps it.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Sequence

GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")


def _meta(pod):
    return (pod or {}).get("metadata") or {}


def _ref(pod, labels=None):
    metadata = {"name": _meta(pod).get("name"), "namespace": _meta(pod).get("namespace")}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether a container (or init container) of the pod asks for an NVIDIA GPU or MIG device."""
    spec = (pod or {}).get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for names in (resources.get("limits") or {}, resources.get("requests") or {}):
            if any(name.startswith(GPU_RESOURCE_PREFIXES) for name in names):
                return True
    return False


def uses_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod uses ResourceClaims (DRA): through NVIDIA's DRA driver they may hold GPUs or MIG devices."""
    return bool(((pod or {}).get("spec") or {}).get("resourceClaims"))


def pods_to_evict(pods: Iterable[Mapping[str, Any]] | None, gpu_pods_only: bool,
                  evict_label: str | None) -> list[dict[str, Any]]:
    """The pods a whole-node drain evicts (every pod but DaemonSet and mirror pods; with gpu_pods_only only
    those that use GPUs, or ResourceClaims, which may be for GPUs), as patches that give each the label
    evict_label=true (k8s_drain then evicts exactly the labelled ones, through the Eviction API)."""
    chosen = []
    for pod in pods or ():
        owners = [ref.get("kind") for ref in _meta(pod).get("ownerReferences") or []]
        mirror = "kubernetes.io/config.mirror" in (_meta(pod).get("annotations") or {})
        if "DaemonSet" in owners or mirror or (gpu_pods_only and not (uses_gpu(pod) or uses_claims(pod))):
            continue
        chosen.append(_ref(pod, {evict_label: "true"}))
    return chosen


def plugin_pods(pods: Iterable[Mapping[str, Any]] | None, selectors: Iterable[str] | None) -> list[dict[str, Any]]:
    """The device plugin and GFD pods among the node's pods: those matching any `key=value` selector."""
    wanted = [tuple(s.split("=", 1)) for s in selectors or () if "=" in s]
    chosen = []
    for pod in pods or ():
        labels = _meta(pod).get("labels") or {}
        if any(labels.get(key) == value for key, value in wanted):
            chosen.append(_ref(pod))
    return chosen


def smoke_pods(resources: Iterable[str] | None, node: str, image: str, command: Sequence[str] | None, namespace: str,
               label: str) -> list[dict[str, Any]]:
    """One pod per advertised resource, pinned to the (still cordoned) node with spec.nodeName, each asking
    for one device and expected to end Succeeded."""
    pods = []
    for index, resource in enumerate(sorted(resources or ()), start=1):
        container = {"name": "smoke", "image": image, "resources": {"limits": {resource: 1}}}
        if command:
            container["command"] = list(command)
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "gpuops-mig-smoke-%s-%d" % (node, index), "namespace": namespace,
                                  "labels": {label: node}, "annotations": {"gpuops.mig/resource": resource}},
                     "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]}})
    return pods


def smoke_failure(pods: Iterable[Mapping[str, Any]] | None, node: str, image: str, timeout: int | float | str) -> str:
    """Why the smoke workloads failed: each one's resource, name and phase."""
    parts = ["%s (%s): %s" % ((_meta(p).get("annotations") or {}).get("gpuops.mig/resource", "?"), _meta(p).get("name"),
                              ((p.get("status") or {}).get("phase") or "Pending")) for p in pods or ()]
    return "%s: smoke workloads (%s) did not succeed within %s s: %s" % (node, image, timeout, "; ".join(parts) or "none started")


# -- which pods a change evicts (mig_node_drain) -------------------------------------

DRAIN_MODES = ("devices", "node", "none")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def drain_mode(setting: Any) -> str:
    """mig_node_drain as one of DRAIN_MODES: `devices` (evict only the pods whose devices go), `node` (every
    pod a whole-node drain takes), `none`. true (the default) means `devices`, false `none`."""
    text = str(setting).strip().lower()
    if text in _TRUE:
        return "devices"
    if text in _FALSE:
        return "none"
    if text in DRAIN_MODES:
        return text
    raise ValueError("mig_node_drain must be devices, node or none (true means devices, false none), not %r" % (setting,))


def _pod_key(pod):
    return "%s/%s" % (_meta(pod).get("namespace"), _meta(pod).get("name"))


def _finished(pod):
    return ((pod or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _fall_back(mode: str, info: Mapping[str, Any], path: str = "reconfigure") -> tuple[str, str]:
    """`devices` becomes the whole-node drain where the pods to evict cannot be told apart: the
    pod map is unknown, the change reboots the node, or mig-manager rebuilds every device of a GPU
    it changes. Returns the mode and why it fell back ('' when it did not)."""
    if mode != "devices":
        return mode, ""
    if path == "mig-manager":
        why = "the GPU Operator's mig-manager recreates every MIG device of a GPU it changes"
    elif not info.get("allocations_source"):
        why = "which pod holds which MIG device is unknown (%s)" % (
            info.get("allocations_error") or "not read")
    elif (info.get("evictions") or {}).get("drain_node"):
        why = "the change reboots the node"
    else:
        return mode, ""
    return "node", why


def drain_plan(pods: Sequence[Mapping[str, Any]] | None, setting: Any, info: Mapping[str, Any] | None,
               gpu_pods_only: bool, evict_label: str | None, host: str = "") -> dict[str, Any]:
    """Which of the node's pods this change evicts, and why, as decided inside the cordoned window.

    pods: the node's pods. setting: mig_node_drain, or the preview's drain ({"mode", "why"}: a
    whole-node drain the preview chose keeps the preview's reason). info: gpuops.mig.mig_node_info's result, read after the
    cordon (allocations_source, allocations_error, evictions: which pods hold devices the plan destroys or
    sit on GPUs whose mode changes, or drain_node for a reboot).

    `devices` evicts exactly the pods info names, plus any GPU pod the pod map does not show (a pod bound
    but not yet given its devices: which device it gets is unknown). Where the pod map could not be read,
    or the change reboots the node, it falls back to the whole-node drain and says why.
    host: the name the log line starts with.
    Returns {"mode", "why", "evict": [patches for pods_to_evict's label],
    "pods": [{"pod", "reasons"}], "text": one line for the log}."""
    plan = _drain_plan(pods, setting, info, gpu_pods_only, evict_label)
    plan["text"] = _plan_text(plan, host)
    return plan


def _drain_plan(pods: Sequence[Mapping[str, Any]] | None, setting: Any,
                info: Mapping[str, Any] | None, gpu_pods_only: bool,
                evict_label: str | None) -> dict[str, Any]:
    info = info or {}
    evictions = info.get("evictions") or {}
    preview = setting if isinstance(setting, Mapping) else {"mode": setting}
    mode, why = _fall_back(drain_mode(preview.get("mode")), info)
    if mode == "node" and not why:
        why = preview.get("why") or ""
    if mode == "none":
        return {"mode": mode, "why": "", "evict": [], "pods": []}
    if mode == "node":
        evict = pods_to_evict(pods, gpu_pods_only, evict_label)
        reason = [{"reason": "node drain", "detail": why or "mig_node_drain is node"}]
        return {"mode": mode, "why": why, "evict": evict,
                "pods": [{"pod": _pod_key(p), "reasons": reason} for p in evict]}
    named = dict((e["pod"], e["reasons"]) for e in evictions.get("pods") or [])
    mapped = set("%s/%s" % (a.get("namespace"), a.get("pod")) for a in info.get("allocations") or [])
    chosen = []
    for pod in pods or ():
        key = _pod_key(pod)
        owners = [ref.get("kind") for ref in _meta(pod).get("ownerReferences") or []]
        if "DaemonSet" in owners or _finished(pod):
            continue
        if key in named:
            chosen.append((pod, named[key]))
        elif uses_gpu(pod) and key not in mapped:
            chosen.append((pod, [{"reason": "device unknown",
                                  "detail": "the kubelet lists no device of this GPU pod yet, so it may get one the "
                                            "change destroys"}]))
    return {"mode": mode, "why": "", "evict": [_ref(pod, {evict_label: "true"}) for pod, dummy in chosen],
            "pods": [{"pod": _pod_key(pod), "reasons": reasons} for pod, reasons in chosen]}


def kept_pods_problems(before: Iterable[Mapping[str, Any]] | None, after: Iterable[Mapping[str, Any]] | None,
                       evicted: Collection[str], pods: Iterable[Mapping[str, Any]] | None) -> list[str]:
    """After the change: every pod that held MIG devices before and was not evicted must still be Running
    and hold the same devices. before/after: mig_node_info allocations; evicted: pod keys; pods: the node's
    pods now. Returns sentences (empty: all kept)."""
    def holdings(allocations):
        out = {}
        for a in allocations or ():
            out.setdefault("%s/%s" % (a.get("namespace"), a.get("pod")), set()).add(a.get("device_uuid"))
        return out

    was = holdings(before)
    kept = sorted(set(was) - set(evicted or ()))
    if after is None:
        return ["which pod holds which MIG device could not be read after the change, so %s cannot be checked"
                % ", ".join(kept)] if kept else []
    now = holdings(after)
    phases = dict((_pod_key(p), ((p.get("status") or {}).get("phase") or "Pending")) for p in pods or ())
    problems = []
    for key in kept:
        if phases.get(key) != "Running":
            problems.append("%s, kept on its devices, is %s" % (key, phases.get(key, "gone")))
        elif now.get(key) != was[key]:
            problems.append("%s held %s and now holds %s" % (key, ", ".join(sorted(was[key])),
                                                             ", ".join(sorted(now.get(key) or ())) or "nothing"))
    return problems


def drain_preview(setting: Any, info: Mapping[str, Any] | None, path: str = "reconfigure") -> dict[str, Any]:
    """What the preview says about the drain, before the node is cordoned (the pods are chosen again inside
    the window): the mode, why a whole-node drain where `devices` was asked, and the pods the plan evicts.
    path: the decision's path; mig-manager rebuilds every MIG device of a GPU it changes, so it drains the node."""
    info = info or {}
    mode, why = _fall_back(drain_mode(setting), info, path)
    pods = [{"pod": e["pod"], "reasons": sorted({r.get("reason") for r in e.get("reasons") or []})}
            for e in (info.get("evictions") or {}).get("pods") or []] if mode == "devices" else []
    if mode == "none":
        text = "no drain (mig_node_drain is none)"
    elif mode == "node":
        text = "the whole node is drained" + (" (%s)" % why if why else "")
    elif pods:
        text = "evicts %d pod(s): %s" % (len(pods), ", ".join("%s (%s)" % (p["pod"], ", ".join(p["reasons"]))
                                                              for p in pods))
    else:
        text = "evicts no pod (only MIG devices no pod holds change)"
    return {"mode": mode, "why": why, "pods": pods, "text": text}


def _plan_text(plan: Mapping[str, Any], host: str) -> str:
    """One line for the log: which pods leave the node and why (drain_plan's result)."""
    pods = plan.get("pods") or []
    named = ", ".join("%s (%s)" % (p["pod"], ", ".join(sorted({r.get("reason") for r in p.get("reasons") or []})))
                      for p in pods)
    if plan.get("mode") == "none":
        line = "no drain (mig_node_drain is none)"
    elif plan.get("mode") == "devices":
        line = ("evicting %s; every other pod runs on with its devices" % named if pods
                else "no pod holds a MIG device that goes: nothing is evicted")
    else:
        why = " (%s)" % plan["why"] if plan.get("why") else ""
        line = "whole-node drain%s: %s" % (why, "evicting " + named if pods else "no pod to evict")
    return "%s: %s" % (host, line) if host else line
