# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The fleet planner's demand: what workloads ask for, as the search's dimensions.

Demand items ({profile: name, count: n} or {memory_gib: x, compute_slices: c, count: n}, each optionally limited
to a node group), pending pods' MIG resources and pending DRA ResourceClaims become _Dim values; devices that
running pods hold become in-use floors. Every check of this input fails with PlanInputError naming the item.
Part of the planner of _fleet_plan.py; controller-only (the action gpuops.mig.mig_plan, tests, bench/).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils import _gpu_layout as layout
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import describe

__all__ = [
    "PlanInputError",
    "WHOLE",
    "demand_items",
    "demand_from_pods",
    "demand_from_claims",
    "profile_from_resource",
]

# The in_use key of whole GPUs that running pods hold (beside MIG device names).
WHOLE = "<whole GPU>"
_RESOURCE_PREFIX = "nvidia.com/mig-"
_WHOLE_RESOURCE = "nvidia.com/gpu"
# The device plugin's renameByDefault appends this to a time-sliced resource (nvidia.com/mig-1g.10gb.shared).
_SHARED_SUFFIX = ".shared"
_WHOLE_RESOURCES = (_WHOLE_RESOURCE, _WHOLE_RESOURCE + _SHARED_SUFFIX)
_PROFILE = checks.pattern(r"(?P<base>[1-9][0-9]*g\.[1-9][0-9]*gb)(?P<attr>(?:[.+-][a-z]+)*)")
_PROFILE_GIB = checks.pattern(r"[0-9]+g\.([0-9]+)gb.*")
# Beyond any GPU (sizes of a demand item); a larger value is a typo, refused rather than reported unmet.
_MEMORY_GIB_MAX = 1 << 20
_SLICES_MAX = 64


class PlanInputError(GpuopsError):
    """Input the planner cannot use: found before anything is planned, nothing applies."""


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def profile_from_resource(resource: str) -> str | None:
    """nvidia.com/mig-1g.5gb.me -> 1g.5gb+me (the device plugin writes '+' as '.'); None if not MIG.
    A time-sliced resource renamed with '.shared' is its profile too (nvidia.com/mig-1g.10gb.shared -> 1g.10gb)."""
    if not resource.startswith(_RESOURCE_PREFIX):
        return None
    suffix = resource[len(_RESOURCE_PREFIX):]
    if suffix.endswith(_SHARED_SUFFIX):
        suffix = suffix[:-len(_SHARED_SUFFIX)]
    match = checks.whole(_PROFILE, suffix)
    if not match:
        return suffix
    attr = match.group("attr")
    if attr.startswith("."):
        attr = "+" + attr[1:]
    return match.group("base") + attr


def _count(value, where):
    # A string of up to 18 ASCII digits is a count too (extra vars and surveys give strings);
    # " 2" is not.
    number = checks.count(value)
    if number is None:
        raise PlanInputError("%s: count must be a non-negative integer, got %s" % (where, describe(value)))
    return number


def _number(value, where, what, most):
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 < value <= most):
        raise PlanInputError("%s: %s must be a number above 0 and at most %d, got %s"
                             % (where, what, most, describe(value)))
    return value


def _flag(value, where):
    if not isinstance(value, bool):
        raise PlanInputError("%s must be true or false, got %s" % (where, describe(value)))
    return value


def _names(value, where, what="a list of node names"):
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise PlanInputError("%s must be %s, got %s" % (where, what, describe(value)))
    return value


class _Dim(object):
    """One demanded kind of device, with the nodes that may supply it."""

    def __init__(self, key, text, nodes, strict):
        self.key = key          # ("profile", name) or ("size", memory_gib, compute_slices)
        self.text = text
        self.nodes = nodes      # frozenset or None (any node)
        self.count = 0
        self.spare = 0
        self.strict = strict
        self.sources = []
        self.accepts = {}       # geometry id -> device name or None

    @property
    def total(self):
        return self.count + self.spare

    def accepted_name(self, geometry):
        gid = id(geometry)
        if gid not in self.accepts:
            self.accepts[gid] = _accepted_name(self.key, geometry)
        return self.accepts[gid]


def _accepted_name(key, geometry):
    if key[0] == "profile":
        try:
            device_type = geometry.device_type(key[1])
        except layout.LayoutError:
            return None
        # Only full GPU instances are MIG resources the device plugin advertises.
        return device_type.name if device_type.is_full else None
    memory_gib, compute = key[1], key[2]
    fits = [p for p in geometry.profiles
            if _profile_gib(p, geometry) >= memory_gib and p.sm_slices >= compute]
    if not fits:
        return None
    base = [p for p in fits if "+" not in p.name and "-" not in p.name] or fits
    best = min(base, key=lambda p: (p.memory_slices, p.sm_slices, p.name))
    return best.name


def _profile_gib(profile, geometry):
    # The name carries the memory: 3g.40gb -> 40 (what users and the device plugin see).
    match = checks.whole(_PROFILE_GIB, profile.name)
    return int(match.group(1)) if match else 0


def demand_items(demand: Any) -> list[Any]:
    """The demand option as a list of items: {name: count} becomes [{profile: name, count: count}]."""
    if demand is None:
        return []
    if isinstance(demand, Mapping):
        return [{"profile": name, "count": count} for name, count in demand.items()]
    if isinstance(demand, list):
        return list(demand)
    raise PlanInputError("demand must be a mapping of MIG profile to count, or a list of items; got %s"
                         % describe(demand))


def _parse_demand(demand, node_groups, policy_spare, strict_default=True):
    """Demand items -> [_Dim]; unknown profiles in explicit demand raise."""
    items = demand_items(demand)
    dims = {}
    order = []
    for i, item in enumerate(items):
        where = "demand[%d]" % i
        if not isinstance(item, Mapping):
            raise PlanInputError("%s: an item must be a mapping, got %s" % (where, describe(item)))
        unknown = set(item) - {"profile", "memory_gib", "compute_slices", "count", "nodes", "group", "source",
                               "strict", "spare"}
        if unknown:
            raise PlanInputError("%s: unknown key(s) %s; allowed: profile, memory_gib, compute_slices, count, "
                                 "nodes, group" % (where, ", ".join(sorted(map(repr, unknown)))))
        label = item.get("profile") if isinstance(item.get("profile"), str) and item.get("profile") else "size"
        count = _count(item.get("count", 1), "%s (%s)" % (where, label))
        strict = _flag(item.get("strict", strict_default), "%s: strict" % where)
        spare = _flag(item.get("spare", False), "%s: spare" % where)
        source = item.get("source")
        if source is not None and not isinstance(source, str):
            raise PlanInputError("%s: source must be a string, got %s" % (where, describe(source)))
        if "profile" in item:
            if "memory_gib" in item or "compute_slices" in item:
                raise PlanInputError("%s: give a profile or a size (memory_gib, compute_slices), not both" % where)
            name = item["profile"]
            if not isinstance(name, str) or not name:
                raise PlanInputError("%s: profile must be a MIG profile name such as 1g.10gb, got %s"
                                     % (where, describe(name)))
            key = ("profile", name)
            text = _text(name)
        elif "memory_gib" in item:
            memory = _number(item["memory_gib"], where, "memory_gib", _MEMORY_GIB_MAX)
            compute = item.get("compute_slices", 1)
            if isinstance(compute, bool) or not isinstance(compute, int) or not 1 <= compute <= _SLICES_MAX:
                raise PlanInputError("%s: compute_slices must be an integer from 1 to %d, got %s"
                                     % (where, _SLICES_MAX, describe(compute)))
            key = ("size", memory, compute)
            text = ">=%sGiB/%dg" % (memory, compute)
        else:
            raise PlanInputError("%s: needs a profile (e.g. 1g.10gb) or a size (memory_gib, compute_slices)" % where)
        allowed = None
        if item.get("group") is not None:
            group = item["group"]
            if not isinstance(group, str) or group not in (node_groups or {}):
                raise PlanInputError("%s: unknown node group %s" % (where, describe(group)))
            allowed = frozenset(node_groups[group])
            text += " on %s" % _text(group)
        if item.get("nodes") is not None:
            _names(item["nodes"], "%s: nodes" % where)
            listed = frozenset(item["nodes"])
            allowed = listed if allowed is None else allowed & listed
            if item.get("group") is None:
                text += " on %s" % ",".join(_text(n) for n in sorted(listed))
        dim_key = (key, allowed)
        if dim_key not in dims:
            dims[dim_key] = _Dim(key, text, allowed, strict)
            order.append(dim_key)
        dim = dims[dim_key]
        dim.strict = dim.strict and strict
        if spare:
            dim.spare += count
        else:
            dim.count += count
        if source:
            dim.sources.append(source)
    for name, count in (policy_spare or {}).items():
        if not isinstance(name, str) or not name:
            raise PlanInputError("policy spare: keys must be MIG profile names, got %s" % describe(name))
        count = _count(count, "policy spare %s" % name)
        dim_key = (("profile", name), None)
        if dim_key not in dims:
            dims[dim_key] = _Dim(("profile", name), _text(name), None, True)
            order.append(dim_key)
        dims[dim_key].spare += count
    return [dims[k] for k in order]


# --------------------------------------------------------------------------
# Demand from the cluster
# --------------------------------------------------------------------------

_FINISHED = ("Succeeded", "Failed")


def _pod_requests(pod, name):
    """{resource: quantity} a pod asks for (limits, else requests; summed over its containers)."""
    out = {}
    spec = _part(pod, "spec", name)
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise PlanInputError("pod %s: spec.containers must be a list, got %s" % (name, describe(containers)))
    for container in containers:
        if not isinstance(container, Mapping):
            raise PlanInputError("pod %s: each container must be a mapping, got %s" % (name, describe(container)))
        resources = _part(container, "resources", name)
        asked = dict(_part(resources, "requests", name))
        asked.update(_part(resources, "limits", name))
        for resource, quantity in asked.items():
            if not isinstance(resource, str):
                raise PlanInputError("pod %s: resource names must be strings, got %s" % (name, describe(resource)))
            if resource.startswith(_RESOURCE_PREFIX) or resource in _WHOLE_RESOURCES:
                number = checks.count(quantity) if isinstance(quantity, str) else quantity
                if isinstance(number, bool) or not isinstance(number, int):
                    raise PlanInputError("pod %s asks for %s %s, which is not a whole number"
                                         % (name, resource, describe(quantity)))
                out[resource] = out.get(resource, 0) + number
    return out


def _part(obj, key, name, kind="pod "):
    """obj[key] as a mapping ({} when absent); PlanInputError naming the pod (or claim) when it is something else."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PlanInputError("%s%s: %s must be a mapping, got %s" % (kind, name, key, describe(value)))
    return value


def _pod_name(pod):
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        meta = {}
    return "%s/%s" % (_text(meta.get("namespace", "default")), _text(meta.get("name", "?")))


def _text(value):
    """A name from the input as it is when it is a short printable string, else escaped and cut."""
    if isinstance(value, str) and value.isprintable() and 0 < len(value) <= 80:
        return value
    return describe(value)


def _single_profile(pod, default, name):
    selector = _part(_part(pod, "spec", name), "nodeSelector", name)
    product = selector.get("nvidia.com/gpu.product", "")
    if isinstance(product, str) and "-MIG-" in product:
        return product.rsplit("-MIG-", 1)[1]
    return default


def demand_from_pods(pods: Any, strategy: str = "mixed", node_names: Mapping[str, str] | None = None,
                     single_profile: str | None = None, fleet: Mapping[str, Any] | None = None,
                     replicas: Mapping[str, int] | None = None
                     ) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]], int, list[dict[str, Any]]]:
    """Pending MIG requests and devices in use, from pod manifests (kubernetes.core.k8s_info resources).

    Returns (demand items, in_use {inventory node: {device name: count}}, whole-GPU pods pending,
    unresolved [{request, count, reason, sources}]).

    mixed: nvidia.com/mig-<profile> is a MIG device ('.' in the resource stands for '+');
    nvidia.com/gpu is a whole GPU. single: nvidia.com/gpu is a MIG device of the node's one
    profile; for a pending pod the profile comes from its nodeSelector
    nvidia.com/gpu.product (<model>-MIG-<profile>), else ``single_profile``, else it is unresolved.
    ``node_names`` maps Kubernetes node names to inventory names (default: the same).

    ``replicas`` {profile: replicas per device} names the time-sliced profiles (the device plugin's
    sharing): a request for one of them, or for its '.shared' resource, asks for replicas, not devices.
    Pending replicas need ceil(replicas / per device) free devices; running pods' replicas hold as many
    devices as there are replicas, at most the node's devices of the profile (the plugin's default
    allocation policy, distributed, spreads replicas over devices). A '.shared' request for a profile
    without replicas is unresolved.
    """
    replicas = _replicas_per_device(replicas)
    if strategy not in ("mixed", "single"):
        raise PlanInputError("strategy must be mixed or single, got %s" % describe(strategy))
    node_names = node_names or {}
    if not isinstance(node_names, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in node_names.items()):
        raise PlanInputError("k8s_node_names must be a mapping of Kubernetes node name to inventory host, got %s"
                             % describe(node_names))
    if single_profile is not None and (not isinstance(single_profile, str) or not single_profile):
        raise PlanInputError("single_profile must be a MIG profile name such as 1g.10gb, got %s"
                             % describe(single_profile))
    if pods is not None and not isinstance(pods, list):
        raise PlanInputError("pods must be a list of pod manifests, got %s" % describe(pods))
    demand = {}
    sources = {}
    in_use = {}
    whole_pending = 0
    unresolved = []
    pending_replicas = {}
    held_replicas = {}
    for pod in pods or []:
        if not isinstance(pod, Mapping):
            raise PlanInputError("pods must be pod manifests (mappings), got %s" % describe(pod))
        name = _pod_name(pod)
        if _part(pod, "status", name).get("phase") in _FINISHED:
            continue
        asked = _pod_requests(pod, name)
        if not asked:
            continue
        node = _part(pod, "spec", name).get("nodeName")
        if node is not None and not isinstance(node, str):
            raise PlanInputError("pod %s: spec.nodeName must be a string, got %s" % (name, describe(node)))
        for resource, quantity in sorted(asked.items()):
            if quantity <= 0:
                continue
            shared = resource.endswith(_SHARED_SUFFIX)
            if resource == _WHOLE_RESOURCE + _SHARED_SUFFIX and strategy == "mixed":
                unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                   "reason": "time-sliced whole GPUs are not MIG devices; the planner does not "
                                             "plan them"})
                continue
            if resource == _WHOLE_RESOURCE and strategy == "mixed":
                if node:
                    host = node_names.get(node, node)
                    in_use.setdefault(host, {})[WHOLE] = in_use.get(host, {}).get(WHOLE, 0) + quantity
                else:
                    whole_pending += quantity
                continue
            if resource in _WHOLE_RESOURCES:
                profile = None
                if node:
                    profile = _node_single_profile(fleet, node_names.get(node, node))
                else:
                    profile = _single_profile(pod, single_profile, name)
                if profile is None:
                    unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                       "reason": "under the single strategy a pending pod's MIG profile comes from "
                                                 "its nodeSelector nvidia.com/gpu.product (<model>-MIG-<profile>) "
                                                 "or the single_profile option; neither is set"})
                    continue
            else:
                profile = profile_from_resource(resource)
            if shared and profile not in replicas:
                unresolved.append({"request": resource, "count": quantity, "sources": [name],
                                   "reason": "a time-sliced resource, but how many replicas each %s device gives is "
                                             "not known (the sharing option)" % _text(profile)})
                continue
            # Time-sliced: the quantities are replicas; they become devices once all pods are counted.
            if node:
                host = node_names.get(node, node)
                target = held_replicas.setdefault(host, {}) if profile in replicas else in_use.setdefault(host, {})
                target[profile] = target.get(profile, 0) + quantity
            else:
                target = pending_replicas if profile in replicas else demand
                target[profile] = target.get(profile, 0) + quantity
                sources.setdefault(profile, []).append(name)
    for profile, count in pending_replicas.items():
        demand[profile] = demand.get(profile, 0) + -(-count // replicas[profile])
    for host, held in held_replicas.items():
        for profile, count in held.items():
            devices = _node_devices(fleet, host, profile)
            busy = min(count, devices) if devices else count
            in_use.setdefault(host, {})[profile] = in_use.get(host, {}).get(profile, 0) + busy
    items = [{"profile": p, "count": c, "strict": False, "source": ", ".join(sources[p])}
             for p, c in sorted(demand.items())]
    return items, in_use, whole_pending, unresolved


# NVIDIA's DRA driver: the DeviceClass of MIG devices, and a CEL selector naming the profile
# (device.attributes['gpu.nvidia.com'].profile == '1g.10gb', the attribute its ResourceSlices publish).
MIG_DEVICE_CLASS = "mig.nvidia.com"
_CEL_PROFILE = checks.pattern(r"""\.profile\s*==\s*['"]([^'"]{1,40})['"]""")


def _claim_requests(claim, name):
    """(device class, CEL expressions, count) per request of a ResourceClaim: resource.k8s.io/v1 puts them under
    `exactly` (or takes the first of `firstAvailable`), v1beta1 on the request itself."""
    spec = _part(_part(claim, "spec", name, ""), "devices", name, "")
    requests = spec.get("requests") or []
    if not isinstance(requests, list):
        raise PlanInputError("claim %s: spec.devices.requests must be a list, got %s" % (name, describe(requests)))
    out = []
    for request in requests:
        if not isinstance(request, Mapping):
            raise PlanInputError("claim %s: a request must be a mapping, got %s" % (name, describe(request)))
        first = request.get("firstAvailable")
        body = request.get("exactly") or (first[0] if isinstance(first, list) and first else request)
        if not isinstance(body, Mapping):
            raise PlanInputError("claim %s: a request must be a mapping, got %s" % (name, describe(body)))
        count = body.get("count", 1) if body.get("allocationMode", "ExactCount") == "ExactCount" else None
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise PlanInputError("claim %s: count must be a whole number, got %s" % (name, describe(count)))
        selectors = body.get("selectors") or []
        expressions = [((sel.get("cel") or {}).get("expression") or "") for sel in selectors
                       if isinstance(sel, Mapping) and isinstance(sel.get("cel"), Mapping)]
        out.append((body.get("deviceClassName"), [e for e in expressions if isinstance(e, str)], count))
    return out


def demand_from_claims(claims: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pending MIG requests of NVIDIA's DRA driver, from ResourceClaim manifests (kubernetes.core.k8s_info
    resources): a claim without status.allocation that asks the DeviceClass mig.nvidia.com adds its count of the
    profile its CEL selector names. Allocated claims hold devices that exist; they add nothing.

    Returns (demand items, unresolved [{request, count, reason, sources}])."""
    if claims is not None and not isinstance(claims, list):
        raise PlanInputError("claims must be a list of ResourceClaim manifests, got %s" % describe(claims))
    demand, sources, unresolved = {}, {}, []
    for claim in claims or []:
        if not isinstance(claim, Mapping):
            raise PlanInputError("claims must be ResourceClaim manifests (mappings), got %s" % describe(claim))
        name = "claim " + _pod_name(claim)
        if _part(claim, "status", name, "").get("allocation"):
            continue
        for device_class, expressions, count in _claim_requests(claim, name):
            if device_class != MIG_DEVICE_CLASS or count == 0:
                continue
            profiles = [m.group(1) for e in expressions for m in [_CEL_PROFILE.search(e)] if m]
            if count is None or len(set(profiles)) != 1:
                unresolved.append({"request": MIG_DEVICE_CLASS, "count": count or 1, "sources": [name],
                                   "reason": "a claim of %s counts toward the plan when it asks for an exact count "
                                             "and one profile through its CEL selector (device.attributes"
                                             "['gpu.nvidia.com'].profile == '<profile>')" % MIG_DEVICE_CLASS})
                continue
            demand[profiles[0]] = demand.get(profiles[0], 0) + count
            sources.setdefault(profiles[0], []).append(name)
    items = [{"profile": p, "count": c, "strict": False, "source": ", ".join(sources[p])}
             for p, c in sorted(demand.items())]
    return items, unresolved


def _replicas_per_device(replicas):
    """{profile: replicas per device} checked: names, and whole numbers of 1 or more."""
    if replicas is None:
        return {}
    if not isinstance(replicas, Mapping):
        raise PlanInputError("sharing must be a mapping of MIG profile to replicas per device, got %s"
                             % describe(replicas))
    for profile, count in replicas.items():
        if not isinstance(profile, str) or not profile:
            raise PlanInputError("sharing: keys must be MIG profile names, got %s" % describe(profile))
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PlanInputError("sharing %s: replicas must be a whole number of 1 or more, got %s"
                                 % (_text(profile), describe(count)))
    return dict(replicas)


def _node_mig_devices(fleet, host):
    """The node's MIG device counts per GPU ({name: count} mappings) from its facts; [] when unknown."""
    facts = (fleet or {}).get(host)
    if isinstance(facts, Mapping) and "gpuops_mig" in facts:
        facts = facts["gpuops_mig"]
    gpus = facts.get("gpus") if isinstance(facts, Mapping) else None
    found = []
    for gpu in gpus if isinstance(gpus, list) else []:
        devices = gpu.get("mig_devices") if isinstance(gpu, Mapping) else None
        if isinstance(devices, Mapping):
            found.append(devices)
    return found


def _node_devices(fleet, host, profile):
    return sum(d[profile] for d in _node_mig_devices(fleet, host) if _is_int(d.get(profile)))


def _node_single_profile(fleet, host):
    names = set()
    for devices in _node_mig_devices(fleet, host):
        names.update(n for n in devices if isinstance(n, str))
    return names.pop() if len(names) == 1 else None
