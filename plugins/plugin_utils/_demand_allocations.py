# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pod holds which MIG device, for the fleet plan and the demand round (docs/dynamic.md).

playbooks/plan.yml and demand_round.yml read every node's pod map (gpuops.mig.mig_node_info's
``allocations``: the kubelet's PodResources API) beside its facts, and gpuops.mig.mig_plan:

- ``pod_maps``: checks what the nodes returned: per node the allocations, or why there are none;
- ``with_holders``: puts the holders beside each MIG device (and GPU) of the facts, as ``pods``, so the
  planner counts a device a pod holds as busy: it is kept, never destroyed, whatever runs on it;
- ``add_evictions``: per planned node, which pods its change evicts, as the rollout's per-device drain
  would decide it (plugin_utils/_node_pods.py, drain_plan), or why that is unknown.

A change evicts a pod when the pod holds a GPU whose MIG mode the plan changes, or when it is a GPU pod
bound to the node that the pod map lists no device for yet (which device it gets is unknown). Devices
pods hold are never destroyed by the plan (the planner keeps busy devices, and plan_gpu refuses to
destroy an allocated one), so most changes evict nobody. Without a pod map (no socket, no grpcio on the
node, read_allocations false) nothing is known: the node's entry says why and has no ``evicted_pods``,
and the round holds it when it runs GPU pods, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._evictions import MODE_CHANGE
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import pod_name
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import describe
from ansible_collections.gpuops.mig.plugins.plugin_utils._rounds import gpu_pods

DEVICE_UNKNOWN = "device unknown"
_FIELDS = ("device_uuid", "namespace", "pod", "container")


def _node_result(host, result):
    """(allocations list or None, why not): one node's mig_node_info result (or None: nothing was read)."""
    if result is None:
        return None, "the node's pod map was not read (no facts from it)"
    if not isinstance(result, Mapping):
        raise RefusedError("allocations[%s] must be gpuops.mig.mig_node_info's result, got %s"
                           % (host, describe(result)))
    if result.get("skipped"):
        return None, "the node's pod map was not read (%s)" % (result.get("skip_reason") or "skipped")
    if result.get("failed") or "allocations" not in result:
        return None, "reading the node's pod map failed: %s" % (result.get("msg") or "no message")
    allocations = result.get("allocations")
    if allocations is None:
        return None, str(result.get("allocations_error") or "the kubelet's PodResources API was not read")
    if not isinstance(allocations, list):
        raise RefusedError("allocations[%s].allocations must be a list, got %s" % (host, describe(allocations)))
    for i, item in enumerate(allocations):
        if not isinstance(item, Mapping) or not all(isinstance(item.get(k), str) and item.get(k) for k in _FIELDS):
            raise RefusedError("allocations[%s].allocations[%d] must have %s as strings, got %s"
                               % (host, i, ", ".join(_FIELDS), describe(item)))
    return allocations, None


def pod_maps(results: Any, hosts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{host: {"allocations": [...] or None, "why": None or why unknown}} for every host of the plan.

    results: {host: mig_node_info's registered result}; a host missing from it has no pod map."""
    if not isinstance(results, Mapping):
        raise RefusedError("allocations must be a mapping of host to gpuops.mig.mig_node_info's result, got %s"
                           % describe(results))
    maps = {}
    for host in hosts:
        allocations, why = _node_result(host, results.get(host))
        maps[host] = {"allocations": allocations, "why": why}
    return maps


def _holders(allocations):
    out = {}
    for item in allocations:
        holder = "%s/%s/%s" % (item["namespace"], item["pod"], item["container"])
        found = out.setdefault(item["device_uuid"], [])
        if holder not in found:
            found.append(holder)
    return out


def _facts(fleet, host):
    facts = fleet.get(host)
    if isinstance(facts, Mapping) and "gpuops_mig" in facts and "gpus" not in facts:
        facts = facts["gpuops_mig"]
    return facts if isinstance(facts, Mapping) and isinstance(facts.get("gpus"), list) else None


def with_holders(fleet: Mapping[str, Any], maps: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of the fleet facts with ``pods`` beside each GPU and MIG device of the nodes whose pod map was
    read (a whole-GPU holder counts for every MIG device on it, as mig_node_info names them); other nodes
    are left as they are. The facts given are not changed."""
    out = dict(fleet)
    for host, pod_map in maps.items():
        facts = _facts(fleet, host)
        if facts is None or pod_map["allocations"] is None:
            continue
        holders = _holders(pod_map["allocations"])
        gpus = []
        for gpu in facts["gpus"]:
            if not isinstance(gpu, Mapping):
                gpus.append(gpu)   # the planner names it
                continue
            whole = list(holders.get(gpu.get("uuid"), ())) if gpu.get("uuid") else []
            instances = []
            for gi in gpu.get("gpu_instances") or []:
                if not isinstance(gi, Mapping) or not isinstance(gi.get("compute_instances"), list):
                    instances.append(gi)
                    continue
                cis = [dict(ci, pods=list(holders.get(ci.get("mig_device_uuid"), ())) + whole)
                       if isinstance(ci, Mapping) else ci for ci in gi["compute_instances"]]
                instances.append(dict(gi, compute_instances=cis))
            copy = dict(gpu, pods=whole)
            if isinstance(gpu.get("gpu_instances"), list):
                copy["gpu_instances"] = instances
            gpus.append(copy)
        out[host] = dict(facts, gpus=gpus)
    return out


def _gpu_pods_by_index(facts, holders):
    """{GPU index: pods ("namespace/pod") holding the GPU or one of its MIG devices}."""
    out = {}
    for gpu in facts.get("gpus") or []:
        if not isinstance(gpu, Mapping):
            continue
        found = set(pod_name(h) for h in holders.get(gpu.get("uuid"), ()))
        for gi in gpu.get("gpu_instances") or []:
            for ci in (gi or {}).get("compute_instances") or []:
                found.update(pod_name(h) for h in holders.get((ci or {}).get("mig_device_uuid"), ()))
        out[gpu.get("index")] = found
    return out


def node_evictions(entry: Mapping[str, Any], facts: Mapping[str, Any] | None, pod_map: Mapping[str, Any],
                   pods: Sequence[Mapping[str, Any]] | None, k8s_name: str) -> list[dict[str, Any]] | None:
    """[{pod, reason, detail}] a planned node's change evicts, or None when its pod map is unknown."""
    if pod_map["allocations"] is None or facts is None:
        return None
    if not entry.get("touched"):
        return []
    holders = _holders(pod_map["allocations"])
    on_gpu = _gpu_pods_by_index(facts, holders)
    reasons = {}
    for gpu in entry.get("gpus") or []:
        if bool(gpu.get("mig_enabled")) != bool(gpu.get("mig_enabled_before")):
            for pod in sorted(on_gpu.get(gpu.get("index"), ())):
                reasons.setdefault(pod, {"pod": pod, "reason": MODE_CHANGE,
                                         "detail": "GPU %s: its MIG mode changes" % gpu.get("index")})
    mapped = set("%s/%s" % (a["namespace"], a["pod"]) for a in pod_map["allocations"])
    for pod in gpu_pods(pods, k8s_name):
        if pod not in mapped:
            reasons.setdefault(pod, {"pod": pod, "reason": DEVICE_UNKNOWN,
                                     "detail": "the kubelet lists no device of this GPU pod yet, so it may get one "
                                               "the change destroys"})
    return [reasons[p] for p in sorted(reasons)]


def add_evictions(plan: dict[str, Any], fleet: Mapping[str, Any], maps: Mapping[str, Mapping[str, Any]],
                  pods: Sequence[Mapping[str, Any]] | None = None,
                  k8s_node_names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Put in each node of the plan what its change evicts: ``evicted_pods`` (names) and ``evictions``
    (with reasons) where the pod map was read, else ``pod_map_unknown`` (why). Returns the plan."""
    to_k8s = dict((host, k8s) for k8s, host in (k8s_node_names or {}).items())
    for host, entry in plan["nodes"].items():
        pod_map = maps.get(host) or {"allocations": None, "why": "the node's pod map was not read"}
        found = node_evictions(entry, _facts(fleet, host), pod_map, pods, to_k8s.get(host, host))
        if found is None:
            entry["pod_map_unknown"] = pod_map["why"] or "no facts from the node"
        else:
            entry["evictions"] = found
            entry["evicted_pods"] = [e["pod"] for e in found]
    return plan
