# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Handing a node to a dynamic MIG partitioner, and taking it back (mig_node_operator_mode=dynamic-dra
or dynamic-hami; docs/gpu-operator.md, "Hand-off to dynamic partitioners"). Controller-side decisions on plain data; nothing
here talks to a node or the API.

The partitioners, as their sources describe them:
- nvidia-dra: NVIDIA's DRA driver for GPUs with its DynamicMIG feature gate (kubernetes-sigs/dra-driver-nvidia-gpu
  cmd/gpu-kubelet-plugin driver.go, nvlib.go). At start its kubelet plugin destroys the MIG devices it did not
  create, then publishes every MIG profile at every placement (and the whole GPU where MIG mode can be toggled
  without a reset, Hopper and later) in the node's pool of ResourceSlices, with one shared counter set per GPU.
  On Ampere, MIG mode must be on before it starts.
- hami: HAMi's device plugin in the `mig` operating mode of its per-node config (ConfigMap hami-device-plugin, key
  config.json, nodeconfig[].operatingmode), Project-HAMi/HAMi docs/develop/dynamic-mig-migration.md. At start it
  clears the MIG instances of idle GPUs and registers the GPUs in the node annotation hami.io/node-nvidia-register
  with mode `mig` and the profiles it may create (migProfiles).
Each plugin runs where its DaemonSet's nodeSelector matches: the hand-off sets those labels on the node, the
take-back removes them (an operand deploy label of the GPU Operator is set to false instead: the operator puts a
missing one back to true).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    ANNOTATION_HANDED_OFF,
    HAMI_POD_LABEL,
    LABEL_DEPLOY_PREFIX,
    is_dra_kubelet_plugin,
    is_hami_device_plugin,
)

PARTITIONERS = ("nvidia-dra", "hami")
# mig_node_operator_mode's hand-off values: who partitions the node from then on.
HANDOFF_MODES = {"dynamic-dra": "nvidia-dra", "dynamic-hami": "hami"}
DRA_DRIVER = "gpu.nvidia.com"
HAMI_CONFIGMAP = "hami-device-plugin"
HAMI_CONFIG_KEY = "config.json"
HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_MODE = "mig"
LABEL_MIG_MANAGER = LABEL_DEPLOY_PREFIX + "mig-manager"

# What the node holds when it is handed over: MIG mode on for every MIG-capable GPU (a GPU that is not is
# skipped by `all`), no MIG device (the partitioner creates them per claim or per pod).
HANDOFF_LAYOUT = ({"gpus": "all", "mig_enabled": True, "devices": {}},)
HANDOFF_LABEL = "dynamic"


class HandoffError(RefusedError):
    """A hand-off or take-back the rollout must not start, with the reason (nothing was changed)."""


def split_mode(mode: str | None) -> tuple[str, str | None]:
    """(the node's path, the partitioner) of mig_node_operator_mode: ('dynamic', partitioner) for a
    hand-off value, else (mode, None)."""
    wanted = (mode or "").strip().lower()
    if wanted in HANDOFF_MODES:
        return "dynamic", HANDOFF_MODES[wanted]
    return mode, None


def mode_of(partitioner: str) -> str:
    """The mig_node_operator_mode value that hands a node to `partitioner`."""
    return next((mode for mode, name in HANDOFF_MODES.items() if name == partitioner), partitioner)


def check_partitioner(name: str | None, host: str) -> str:
    name = (name or "").strip().lower()
    if name not in PARTITIONERS:
        raise HandoffError("%s: a hand-off needs mig_node_operator_mode %s, not '%s'. Nothing was changed."
                           % (host, " or ".join(HANDOFF_MODES), name))
    return name


def record_of(node: Mapping[str, Any] | None, host: str) -> dict[str, Any] | None:
    """The hand-off this collection recorded on the Node (annotation gpuops.mig/handed-off), or None."""
    text = (((node or {}).get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HANDED_OFF)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("partitioner") not in PARTITIONERS \
            or not isinstance(record.get("labels"), dict):
        raise HandoffError("%s: the node's annotation %s is not a hand-off record this collection wrote (%.80r). "
                           "Nothing was changed. Remove it by hand once you know who owns the node's MIG devices."
                           % (host, ANNOTATION_HANDED_OFF, text))
    return record


def plugin_of(partitioner: str, daemonsets: Sequence[Mapping[str, Any]] | None, host: str) -> dict[str, Any]:
    """The partitioner's DaemonSet: {daemonset, namespace, pod_selectors, node_labels (its nodeSelector)}."""
    if partitioner == "nvidia-dra":
        found = [ds for ds in daemonsets or () if is_dra_kubelet_plugin(ds) and dynamic_mig_gate(ds)]
        what = "NVIDIA's DRA kubelet plugin with DynamicMIG=true in its feature gates"
    else:
        found = [ds for ds in daemonsets or () if is_hami_device_plugin(ds)]
        what = "HAMi's device plugin (pods labelled %s=%s)" % HAMI_POD_LABEL
    if not found:
        raise HandoffError("%s: mig_node_operator_mode=%s, but no DaemonSet of %s was found. Nothing was "
                           "changed. Install it with a nodeSelector that picks the nodes handed to it."
                           % (host, mode_of(partitioner), what))
    ds = min(found, key=lambda d: (d["metadata"].get("namespace", ""), d["metadata"]["name"]))
    template = (ds.get("spec") or {}).get("template") or {}
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    name = "%s/%s" % (ds["metadata"].get("namespace", ""), ds["metadata"]["name"])
    if not selector:
        raise HandoffError("%s: the DaemonSet %s of %s has no nodeSelector, so it runs on every GPU node at once and "
                           "cannot be given one node. Nothing was changed. Give it a nodeSelector (for example "
                           "gpuops.mig/dynamic=%s) that only the nodes handed to it carry." % (host, name, what,
                                                                                               partitioner))
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    return {"daemonset": name, "namespace": ds["metadata"].get("namespace", ""),
            "pod_selectors": ["%s=%s" % item for item in sorted(pod_labels.items())],
            "node_labels": dict(selector)}


def dynamic_mig_gate(daemonset: Mapping[str, Any]) -> bool:
    """DynamicMIG=true in the FEATURE_GATES env or a --feature-gates argument of any container."""
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        values = [e.get("value") or "" for e in container.get("env") or [] if e.get("name") == "FEATURE_GATES"]
        args = container.get("args") or []
        values += [a.split("=", 1)[1] for a in args if a.startswith("--feature-gates=")]
        values += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--feature-gates"]
        for value in values:
            gates = dict(part.split("=", 1) for part in value.replace(" ", "").split(",") if "=" in part)
            if gates.get("DynamicMIG", "").lower() == "true":
                return True
    return False


def give(info: Mapping[str, Any], node: Mapping[str, Any] | None, settings: Mapping[str, Any],
         drain: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The hand-off of a node (path handoff), or None when it is already done (converged).

    settings: host, kubernetes, partitioner, daemonsets. drain: the decision's drain preview (or None)."""
    host = settings["host"]
    partitioner = check_partitioner(settings.get("partitioner"), host)
    if not settings.get("kubernetes"):
        raise HandoffError("%s: mig_node_operator_mode=%s hands the node to a partitioner that runs in "
                           "Kubernetes, but mig_node_kubernetes is false. Nothing was changed."
                           % (host, mode_of(partitioner)))
    record = record_of(node, host)
    if record and record["partitioner"] != partitioner:
        raise HandoffError("%s: the node is handed to %s (annotation %s), not %s. Nothing was changed. Take it back "
                           "first (mig_node_dynamic_take_back=true with a static layout), then hand it over again."
                           % (host, record["partitioner"], ANNOTATION_HANDED_OFF, partitioner))
    plugin = plugin_of(partitioner, settings.get("daemonsets"), host)
    labels = dict(((node or {}).get("metadata") or {}).get("labels") or {})
    # Handed over: the MIG devices are the partitioner's (created per claim or pod), only MIG mode is ours.
    if record and not record.get("pending") and not (info.get("change") or {}).get("mode") and \
            all(labels.get(k) == v for k, v in plugin["node_labels"].items()):
        return None
    busy = (drain or {}).get("mode") == "none" and [e["pod"] for e in (info.get("evictions") or {}).get("pods") or []]
    if busy:
        raise HandoffError("%s: pods hold MIG devices the hand-off to %s destroys: %s, and mig_node_drain is none. "
                           "Nothing was changed. Let the rollout drain them (mig_node_drain: devices or node), or "
                           "move them away first." % (host, partitioner, ", ".join(sorted(busy))))
    new = {"partitioner": partitioner, "daemonset": plugin["daemonset"], "namespace": plugin["namespace"],
           "pod_selectors": plugin["pod_selectors"], "labels": plugin["node_labels"],
           # The GPU Operator's mig-manager as it was, put back by the take-back.
           "mig_manager": labels.get(LABEL_MIG_MANAGER)}
    if record:
        # An earlier hand-off (cut short, or undone by someone): what the node had before the first one, not
        # what that one left (mig-manager's label false, HAMi's entry in mig mode).
        new["mig_manager"] = record.get("mig_manager")
        if "hami_entry" in record:
            new["hami_entry"] = record["hami_entry"]
    return dict(plugin, direction="give", partitioner=partitioner, annotation=ANNOTATION_HANDED_OFF,
                configmap=HAMI_CONFIGMAP, config_key=HAMI_CONFIG_KEY, record=new, finishing=bool(record and record.get("pending")))


def record_text(handoff: Mapping[str, Any], pending: bool, hami: Mapping[str, Any] | None = None) -> str:
    """The Node annotation that records a hand-off. Written pending before its first change (mig-manager off,
    HAMi's entry, the partitioner's labels), so that a crash leaves what the take-back needs to put back, and
    again, not pending, once the partitioner publishes the node's GPUs.

    hami: mig_hami_node_config's answer ({text, previous}) when HAMi's entry is turned to mig mode; its previous
    entry is recorded unless the record holds one already (from before an earlier attempt)."""
    record = dict(handoff["record"])
    if hami is not None and "hami_entry" not in record:
        record["hami_entry"] = hami.get("previous")
    if pending:
        record["pending"] = True
    return json.dumps(record, sort_keys=True)


def taken_back_node(node: Mapping[str, Any] | None, record: Mapping[str, Any]) -> dict[str, Any]:
    """The Node as it will be once taken back (the partitioner's labels off, mig-manager's deploy label as it
    was before the hand-off): the take-back's static layout is decided on it."""
    node = dict(node or {})
    metadata = dict(node.get("metadata") or {})
    labels = dict(metadata.get("labels") or {})
    for key, value in labels_off(record).items():
        labels.pop(key, None)
        if value is not None:
            labels[key] = value
    metadata["labels"] = labels
    node["metadata"] = metadata
    return node


def labels_off(record: Mapping[str, Any]) -> dict[str, str | None]:
    """The node labels that send the partitioner's plugin away and give mig-manager back its deploy label."""
    off = dict((key, "false" if key.startswith(LABEL_DEPLOY_PREFIX) else None) for key in record["labels"])
    off[LABEL_MIG_MANAGER] = record.get("mig_manager")
    return off


def take(record: Mapping[str, Any]) -> dict[str, Any]:
    """The take-back steps (roles/mig_node/tasks/take_back.yml) from the node's hand-off record."""
    return {"direction": "take", "partitioner": record["partitioner"], "daemonset": record.get("daemonset", ""),
            "namespace": record.get("namespace", ""), "pod_selectors": list(record.get("pod_selectors") or []),
            "labels": labels_off(record), "hami_entry": record.get("hami_entry"),
            # HAMi's entry is put back only when the hand-off recorded it, that is, before it changed it.
            "hami_restore": "hami_entry" in record,
            "configmap": HAMI_CONFIGMAP, "config_key": HAMI_CONFIG_KEY,
            "annotations": {ANNOTATION_HANDED_OFF: None}}


def skipped_summary(host: str, record: Mapping[str, Any]) -> str:
    handed = "a hand-off to the dynamic partitioner %s did not finish" if record.get("pending") else \
        "handed to the dynamic partitioner %s"
    return ("%s: %s (annotation %s): left to it. Set mig_node_dynamic_take_back=true to take it back to a static "
            "layout, or mig_node_operator_mode=%s to hand it over again."
            % (host, handed % record["partitioner"], ANNOTATION_HANDED_OFF, mode_of(record["partitioner"])))


def handoff_summary(host: str, handoff: Mapping[str, Any], decision: Mapping[str, Any]) -> str:
    steps = ["mig-manager off"] if decision.get("operator_mig_manager_off") else []
    steps += ["MIG mode on"] if decision.get("mode_change") else []
    steps += ["its static MIG devices destroyed"] if decision.get("geometry_change") else []
    steps += ["%s's plugin (%s) put on the node and restarted, its devices checked" % (
        handoff["partitioner"], handoff["daemonset"])]
    drain = "; %s" % decision["drain"]["text"] if decision.get("drain") else ""
    again = " (again: the node's record says an earlier hand-off did not finish)" if handoff.get("finishing") else ""
    return "%s: hand the node to the dynamic partitioner %s%s: %s%s." % (host, handoff["partitioner"], again,
                                                                         ", ".join(steps), drain)


# -- what the partitioner publishes --------------------------------------------------

def published(objects: Sequence[Mapping[str, Any]] | None, partitioner: str,
              gpus: Sequence[Mapping[str, Any]] | None, node_name: str,
              gone: bool = False) -> dict[str, Any]:
    """Whether the partitioner publishes the node's MIG-capable GPUs as dynamic: {ok, text}; with
    gone, whether its devices are gone from the node (withdrawn; gpus is not read).

    objects: the node's ResourceSlices (nvidia-dra) or [the Node] (hami); gpus: mig_facts GPUs."""
    if gone:
        return withdrawn(objects, partitioner, node_name)
    wanted = sorted(g["uuid"] for g in gpus or () if g.get("mig_capable", g.get("mig_enabled")))
    if partitioner == "nvidia-dra":
        devices = _slice_devices(objects, node_name)
        static = sorted(d["name"] for d in devices if _attr(d, "type") == "mig" and _attr(d, "uuid"))
        parents = set(_attr(d, "parentUUID") for d in devices if _attr(d, "type") == "mig" and not _attr(d, "uuid"))
        missing = [u for u in wanted if u not in parents]
        ok = bool(wanted) and not missing and not static
        text = "%d device(s) in the node's ResourceSlices of %s; GPUs without MIG placements: %s; static MIG " \
               "devices: %s" % (len(devices), DRA_DRIVER, ", ".join(missing) or "none", ", ".join(static) or "none")
        return {"ok": ok, "text": text}
    registered = _hami_registered(objects)
    missing = [u for u in wanted if not (registered.get(u, {}).get("mode") == HAMI_MODE
                                         and registered.get(u, {}).get("migProfiles"))]
    text = "annotation %s lists %d GPU(s); GPUs not registered in mode %s with MIG profiles: %s" % (
        HAMI_REGISTER, len(registered), HAMI_MODE, ", ".join(missing) or "none")
    return {"ok": bool(wanted) and not missing, "text": text}


def withdrawn(objects: Sequence[Mapping[str, Any]] | None, partitioner: str, node_name: str) -> dict[str, Any]:
    """Whether the partitioner's devices are gone from the node: NVIDIA's DRA driver's ResourceSlices (the
    kubelet deletes them once the plugin is unregistered). HAMi's scheduler drops a node whose device plugin
    stops answering its handshake by itself; its plugin pod gone is what counts there."""
    if partitioner != "nvidia-dra":
        return {"ok": True, "text": "HAMi's plugin is off the node"}
    devices = _slice_devices(objects, node_name)
    return {"ok": not devices, "text": "%d device(s) still in the node's ResourceSlices of %s" % (len(devices),
                                                                                                  DRA_DRIVER)}


def _slice_devices(slices, node_name):
    ours = [s for s in slices or () if (s.get("spec") or {}).get("driver") == DRA_DRIVER
            and (s.get("spec") or {}).get("nodeName", ((s.get("spec") or {}).get("pool") or {}).get("name")) == node_name]
    if not ours:
        return []
    newest = max((s["spec"].get("pool") or {}).get("generation", 0) for s in ours)
    return [d for s in ours if (s["spec"].get("pool") or {}).get("generation", 0) == newest
            for d in s["spec"].get("devices") or []]


def _attr(device, name):
    value = (device.get("attributes") or {}).get(name) or {}
    return value.get("string") if isinstance(value, dict) else None


def _hami_registered(nodes):
    annotations = ((((nodes or [{}])[0]) or {}).get("metadata") or {}).get("annotations") or {}
    try:
        devices = json.loads(annotations.get(HAMI_REGISTER) or "[]")
    except ValueError:
        return {}
    return dict((d.get("id"), d) for d in devices if isinstance(d, dict)) if isinstance(devices, list) else {}


# -- HAMi's per-node config ------------------------------------------------------------

def hami_node_config(text: str | None, node_name: str, entry: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """HAMi's config.json with the node's nodeconfig entry replaced: entry None removes it, "mig" sets its
    operatingmode to mig (kept otherwise as it was), a dict puts that entry back. Returns {text, previous}."""
    try:
        config = json.loads(text or "{}")
    except ValueError as e:
        raise HandoffError("ConfigMap %s: %s is not JSON (%s). Nothing was changed." % (HAMI_CONFIGMAP,
                                                                                        HAMI_CONFIG_KEY, e))
    if not isinstance(config, dict) or not isinstance(config.get("nodeconfig", []), list):
        raise HandoffError("ConfigMap %s: %s has no nodeconfig list. Nothing was changed." % (HAMI_CONFIGMAP,
                                                                                              HAMI_CONFIG_KEY))
    entries = list(config.get("nodeconfig") or [])
    previous = next((e for e in entries if isinstance(e, dict) and e.get("name") == node_name), None)
    entries = [e for e in entries if not (isinstance(e, dict) and e.get("name") == node_name)]
    if entry == HAMI_MODE:
        entries.append(dict(previous or {"name": node_name}, operatingmode=HAMI_MODE))
    elif isinstance(entry, dict):
        entries.append(dict(entry, name=node_name))
    config["nodeconfig"] = entries
    return {"text": json.dumps(config, indent=2, sort_keys=True), "previous": previous}
