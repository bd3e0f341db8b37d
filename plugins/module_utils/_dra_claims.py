# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pod holds which MIG device on a node served by NVIDIA's DRA driver, from the ResourceClaims.

Where NVIDIA's DRA driver for GPUs (driver ``gpu.nvidia.com``) serves a node, the kubelet's PodResources
answer lists no device plugin IDs for its pods. The same map comes from the API server instead:

* the driver's kubelet plugin publishes the node's devices in ResourceSlices (``spec.driver``
  gpu.nvidia.com, ``spec.nodeName`` the node, one pool named after the node); a MIG device is named after
  its placement (``gpu-0-mig-2g20gb-14-0``) and carries its MIG device UUID in the ``uuid`` attribute, a
  whole GPU (``gpu-0``) its GPU UUID;
* a ResourceClaim allocated on the node lists in ``status.allocation.devices.results`` one entry per
  device (driver, pool, device, request), and ``status.reservedFor`` the pods using it (resource
  ``pods``, name, uid), in the claim's namespace.

``node_allocations`` joins the two into the allocations shape of _podresources.read_allocations, with
``allocations_source`` ``dra``. Anything that cannot be joined (a result naming a device no slice of the
pool publishes, a device without a uuid, a malformed object) makes the whole map unknown, with a sentence
naming the node, claim and device, and the rollout falls back to the whole-node drain: a device under a pod
is never taken for idle. ``merge`` puts this map together with the kubelet's.

Private to the collection; plain data in and out, no Ansible or Kubernetes imports (the controller reads
the objects with kubernetes.core's client, _k8s_objects.read_cluster).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._errors import AllocationsUnreadable

DRIVER = "gpu.nvidia.com"          # NVIDIA's DRA driver for GPUs (cmd/gpu-kubelet-plugin, DriverName)
SOURCE = "dra"
KUBELET_SOURCE = "podresources"    # _podresources.SOURCE, repeated to keep this module free of grpc's
API_VERSION = "resource.k8s.io/v1"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(obj: Any) -> str:
    metadata = _mapping(_mapping(obj).get("metadata"))
    namespace = metadata.get("namespace")
    return "%s/%s" % (namespace, metadata.get("name")) if namespace else str(metadata.get("name"))


def served(node: str, slices: Iterable[Any], claims: Iterable[Any] = ()) -> bool:
    """Whether NVIDIA's DRA driver serves the node: a ResourceSlice of its driver names the node, or a claim
    holds a device of the node's pool (its slices may be gone while the claim still holds the device)."""
    if any(_mapping(_mapping(s).get("spec")).get("driver") == DRIVER
           and _mapping(_mapping(s).get("spec")).get("nodeName") == node for s in slices or ()):
        return True
    return any(_mapping(r).get("driver") == DRIVER and _mapping(r).get("pool") == node
               for claim in claims or () for r in _results(claim))


def _results(claim: Any) -> list:
    status = _mapping(_mapping(claim).get("status"))
    results = _mapping(_mapping(status.get("allocation")).get("devices")).get("results")
    return results if isinstance(results, list) else []


def published_devices(node: str, slices: Iterable[Any]) -> dict[tuple[str, str], Any]:
    """{(pool, device name): UUID or None (no uuid attribute)} of the driver's slices for the node.

    A pool is read at its highest generation only: slices of an older generation are being replaced, as the
    scheduler ignores them (resourceslice tracker)."""
    newest = {}   # pool -> (generation, [slice specs])
    for item in slices or ():
        spec = _mapping(_mapping(item).get("spec"))
        if spec.get("driver") != DRIVER or spec.get("nodeName") != node:
            continue
        pool = _mapping(spec.get("pool"))
        name, generation = pool.get("name"), pool.get("generation", 0)
        if not isinstance(name, str) or not name or not isinstance(generation, int) \
                or not isinstance(spec.get("devices", []), list):
            raise AllocationsUnreadable("%s: the ResourceSlice %s of %s is malformed (pool %r, generation %r, "
                                        "devices not a list?)" % (node, _name(item), DRIVER, name, generation))
        found = newest.get(name)
        if found is None or generation > found[0]:
            newest[name] = (generation, [spec])
        elif generation == found[0]:
            found[1].append(spec)
    devices = {}
    for pool, (dummy, specs) in newest.items():
        for spec in specs:
            for device in spec.get("devices") or ():
                name = _mapping(device).get("name")
                if not isinstance(name, str) or not name:
                    raise AllocationsUnreadable("%s: a ResourceSlice of %s in pool %s has a device without a name"
                                                % (node, DRIVER, pool))
                uuid = _mapping(_mapping(_mapping(device).get("attributes")).get("uuid")).get("string")
                devices[(pool, name)] = uuid if isinstance(uuid, str) and uuid else None
    return devices


def claim_allocations(node: str, claim: Any, devices: Mapping[tuple[str, str], Any]) -> list[dict[str, Any]]:
    """The allocations one ResourceClaim makes on the node: one per device of the driver allocated to it in one
    of the node's pools, and per pod it is reserved for. devices: published_devices for the node."""
    if not isinstance(claim, Mapping) or not _mapping(claim.get("metadata")).get("name"):
        raise AllocationsUnreadable("%s: a ResourceClaim without a name: %.80r" % (node, claim))
    where = "%s: ResourceClaim %s" % (node, _name(claim))
    status = _mapping(claim.get("status"))
    results = _mapping(_mapping(status.get("allocation")).get("devices")).get("results") or []
    reserved = status.get("reservedFor") or []
    if not isinstance(results, list) or not isinstance(reserved, list):
        raise AllocationsUnreadable("%s: status.allocation.devices.results and status.reservedFor must be lists"
                                    % where)
    # The driver names the node's pool after the node; a result there that no slice publishes is an error.
    pools = set(pool for pool, dummy in devices) | {node}
    mine = []
    for result in results:
        result = _mapping(result)
        if result.get("driver") != DRIVER or result.get("pool") not in pools:
            continue      # another driver's device, or one on another node
        device = result.get("device")
        if (result["pool"], device) not in devices:
            raise AllocationsUnreadable(
                "%s: request %s is allocated device %s of pool %s, which no ResourceSlice of %s for the node "
                "publishes (a slice being replaced, or one the driver removed)"
                % (where, result.get("request"), device, result["pool"], DRIVER))
        uuid = devices[(result["pool"], device)]
        if uuid is None:
            raise AllocationsUnreadable(
                "%s: device %s of pool %s has no uuid attribute in its ResourceSlice, so which MIG device it is "
                "is unknown (NVIDIA's DRA driver with DynamicMIG publishes devices before they exist)"
                % (where, device, result["pool"]))
        mine.append((uuid, device, result.get("request")))
    if not mine:
        return []
    namespace = _mapping(claim.get("metadata")).get("namespace")
    out = []
    for consumer in reserved:
        consumer = _mapping(consumer)
        if consumer.get("resource") != "pods" or consumer.get("apiGroup") not in (None, ""):
            raise AllocationsUnreadable("%s: reserved for %s %s, not a pod: which pods hold its devices (%s) is "
                                        "unknown" % (where, consumer.get("resource"), consumer.get("name"),
                                                     ", ".join(sorted(d for dummy, d, dummy2 in mine))))
        for uuid, device, request in mine:
            out.append({"device_uuid": uuid, "namespace": namespace, "pod": consumer.get("name"),
                        "pod_uid": consumer.get("uid"), "container": "", "resource": DRIVER,
                        "claim": _mapping(claim.get("metadata")).get("name"), "request": request, "device": device})
    return out


def node_allocations(node: str, slices: Iterable[Any], claims: Iterable[Any]) -> dict[str, Any] | None:
    """``{"allocations", "allocations_source", "allocations_error"}`` from the ResourceClaims for a node
    NVIDIA's DRA driver serves; None where it serves none (served).

    A claim allocated but reserved for no pod holds nothing running: it is left out. Anything that cannot be
    read makes allocations None, and allocations_error says why."""
    slices, claims = list(slices or ()), list(claims or ())
    if not served(node, slices, claims):
        return None
    try:
        devices = published_devices(node, slices)
        found = []
        for claim in claims:
            found.extend(claim_allocations(node, claim, devices))
    except AllocationsUnreadable as e:
        return {"allocations": None, "allocations_source": None,
                "allocations_error": "the DRA driver's ResourceClaims cannot be mapped to MIG devices: %s" % e}
    return {"allocations": found, "allocations_source": SOURCE, "allocations_error": None}


def unreadable(node: str, error: Any) -> dict[str, Any]:
    """What node_allocations says for a node whose slices or claims the API did not give."""
    return {"allocations": None, "allocations_source": None,
            "allocations_error": "%s: the ResourceSlices and ResourceClaims of NVIDIA's DRA driver (%s) cannot be "
                                 "read: %s" % (node, API_VERSION, error)}


def merge(kubelet: Mapping[str, Any], dra: Mapping[str, Any] | None) -> dict[str, Any]:
    """One map from the kubelet's read (_podresources.read_allocations) and node_allocations' (None: the node
    is not served by the DRA driver, or the claims were not read).

    The kubelet's comes first. With the DRA driver on the node, its claims join it (source
    ``podresources+dra``), or stand alone where the kubelet could not be read (``dra``; the GPU pods the map
    does not show are then evicted as devices unknown). A DRA map that could not be read makes the whole
    map unknown: a pod there may hold any device."""
    kubelet = dict(kubelet)
    if not dra:
        return kubelet
    bad = _malformed(dra)
    if bad:
        dra = {"allocations": None, "allocations_error": "the DRA allocations given are malformed: %s" % bad}
    if dra.get("allocations") is None:
        error = dra.get("allocations_error") or "the DRA driver's claims were not read"
        if kubelet.get("allocations_error"):
            error = "%s; and %s" % (error, kubelet["allocations_error"])
        return {"allocations": None, "allocations_source": None, "allocations_error": error}
    if kubelet.get("allocations") is None:
        return {"allocations": list(dra["allocations"]), "allocations_source": SOURCE, "allocations_error": None}
    return {"allocations": list(kubelet["allocations"]) + list(dra["allocations"]),
            "allocations_source": "%s+%s" % (kubelet.get("allocations_source") or KUBELET_SOURCE, SOURCE),
            "allocations_error": None}


def _malformed(dra: Any) -> str:
    """What is wrong with a node_allocations result handed to a module (empty: nothing)."""
    if not isinstance(dra, Mapping):
        return "not a mapping: %.80r" % (dra,)
    found = dra.get("allocations")
    if found is None:
        return ""
    if not isinstance(found, list):
        return "allocations is not a list: %.80r" % (found,)
    for item in found:
        if not isinstance(item, Mapping) or not all(isinstance(item.get(key), str) and item.get(key)
                                                    for key in ("device_uuid", "namespace", "pod")):
            return "an allocation without device_uuid, namespace and pod: %.80r" % (item,)
    return ""
