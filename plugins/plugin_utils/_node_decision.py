# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the mig_node role decides for a node, on the controller (the filters in plugins/filter call these).

Inputs are plain data: gpuops.mig.mig_node_info's result, the Kubernetes Node, the
cluster's ClusterPolicy and DaemonSets. Nothing here talks to a node or the API.
Facts about the GPU Operator: docs/gpu-operator.md, "What the collection finds out by itself".
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    DEFAULT_OPERATOR_CONFIG,
    LABEL_CONFIG,
    LABEL_DEPLOY_PREFIX as LABEL_DEPLOY,
    LABEL_STATE,
    PAUSED_VALUE as PAUSED,
    is_dra_kubelet_plugin,
)
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _lease
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _handoff, _node_pods, _node_records

LABEL_MIG_MANAGER = LABEL_DEPLOY + "mig-manager"
STRATEGIES = ("none", "single", "mixed")
OPERATOR_MODES = ("auto", "mig-manager", "takeover", "dynamic")
# The GPU clients of GPU Operator v26.7's GPUCluster, by their deploy labels (NVIDIA/gpu-operator
# controllers/state_manager.go gpuClusterStateLabels): the DRA kubelet plugin, DCGM and its exporter. The
# operator writes "true" only where such a label is absent or empty (nodelabeling_controller.go
# updateGPUClusterStateLabels), so paused-for-mig-change holds until the run writes "true" back, as for the
# ClusterPolicy's operands. The driver and the DRA validator hold no GPU and are left running.
GPU_CLUSTER_CLIENTS = ("dra-driver", "dcgm-dra", "dcgm-exporter-dra")


# nvidia.com/mig.config.state while mig-manager works on the node (pending; rebooting until its pod comes back
# after the reboot and runs again), and when its run has ended (NVIDIA/mig-parted pkg/mig/reconfigure).
MIG_MANAGER_IN_FLIGHT = ("pending", "rebooting")
MIG_MANAGER_FINISHED = ("success", "failed")


# -- the GPU Operator ------------------------------------------------------------

def operator_view(policies: Sequence[Mapping[str, Any]] | None, node: Mapping[str, Any] | None = None,
                  daemonsets: Iterable[Mapping[str, Any]] | None = (),
                  gpu_clusters: Sequence[Mapping[str, Any]] | None = ()) -> dict[str, Any]:
    """What the GPU Operator manages, for one node: {present: False} without a ClusterPolicy.

    policies: the ClusterPolicy objects; node: the Node object (or None);
    daemonsets: the cluster's DaemonSets (for NVIDIA's DRA driver); gpu_clusters: the GPUCluster objects
    (nvidia.com/v1alpha1, GPU Operator v26.7's DRA stack), reported under gpu_cluster where no ClusterPolicy is.
    """
    labels = _labels(node)
    view = {"present": False, "dra": dra_view(daemonsets, labels), "gpu_cluster": None}
    if not policies:
        view["gpu_cluster"] = gpu_cluster_view(gpu_clusters)
        return view
    policy = active_policy(policies)
    spec = policy.get("spec") or {}
    strategy = (spec.get("mig") or {}).get("strategy") or ""
    mig_manager = spec.get("migManager") or {}
    config = mig_manager.get("config") or {}
    enabled = mig_manager.get("enabled") is not False     # unset means enabled
    deploy = labels.get(LABEL_MIG_MANAGER, "")
    node_name = (node or {}).get("metadata", {}).get("name", "")
    config_maps = [config["name"]] if config.get("name") else ["%s-mig-config" % node_name, DEFAULT_OPERATOR_CONFIG]
    view.update(
        present=True,
        name=policy["metadata"]["name"],
        namespace=(policy.get("status") or {}).get("namespace") or "gpu-operator",
        # Unset (CRs written by hand or by OLM carry none): the operator sets no MIG_STRATEGY env on the device
        # plugin and GFD (NVIDIA/gpu-operator controllers/object_controls.go applyMIGConfiguration), so they run
        # with their own default, none.
        mig_strategy=strategy or "none",
        mig_strategy_set=bool(strategy),
        device_plugin=(spec.get("devicePlugin") or {}).get("enabled") is not False,
        # The ConfigMap of per-node device-plugin configs (the nvidia.com/device-plugin.config label picks one).
        device_plugin_config=(((spec.get("devicePlugin") or {}).get("config") or {}).get("name") or ""),
        gfd=(spec.get("gfd") or {}).get("enabled") is not False,
        mig_manager={
            "enabled": enabled,
            # The operator schedules mig-manager where this label is "true"; paused counts as there.
            "on_node": enabled and deploy in ("true", PAUSED),
            "deploy_label": deploy or None,
            # Named: that ConfigMap, key config.yaml. Empty: mig-manager generates <node>-mig-config from the
            # hardware (default-mig-parted-config is only its fallback, and the operator rewrites it).
            "config_maps": config_maps,
            "config_default": config.get("default", "all-disabled"),
            # WITH_REBOOT: a mode change that does not take effect reboots the node (state rebooting), and
            # the driver container rebuilds before mig-manager goes on.
            "with_reboot": any(e.get("name") == "WITH_REBOOT" and _go_bool(e.get("value"))
                               for e in mig_manager.get("env") or [] if isinstance(e, dict)),
        },
    )
    return view


def gpu_cluster_view(gpu_clusters: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """A GPUCluster (the operator's singleton gpu-cluster; the oldest if several): {name, namespace, dynamic_mig},
    or None. It runs NVIDIA's DRA driver and no mig-manager, device plugin or GFD: its MIG devices must be
    set up beforehand (NVIDIA/gpu-operator api/nvidia/v1alpha1/gpucluster_types.go), the static layout the
    collection applies itself."""
    if not gpu_clusters:
        return None
    cluster = active_policy(gpu_clusters)
    gates = (((cluster.get("spec") or {}).get("draDriver") or {}).get("featureGates") or {})
    return {"name": cluster["metadata"]["name"],
            "namespace": (cluster.get("status") or {}).get("namespace") or "gpu-operator",
            "dynamic_mig": _go_bool(gates.get("DynamicMIG"))}


def _go_bool(value):
    """strconv.ParseBool's true, as mig-manager reads its WITH_REBOOT env."""
    return str(value if value is not None else "").strip() in ("1", "t", "T", "TRUE", "true", "True")


def active_policy(policies: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The ClusterPolicy the operator acts on: the oldest (creationTimestamp, then name), as its controllers
    select it (NVIDIA/gpu-operator controllers/active_config.go getSingletonClusterPolicy); the others it
    marks ignored. RFC 3339 timestamps of the API server sort as text; a missing one sorts first, as Go's zero
    time does."""
    return min(policies, key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "",
                                        p["metadata"]["name"]))


def dra_view(daemonsets: Iterable[Mapping[str, Any]] | None, node_labels: Mapping[str, str]) -> dict[str, Any]:
    """NVIDIA's DRA kubelet plugin on this node (by its DaemonSet's nodeSelector), and its DynamicMIG gate."""
    for ds in daemonsets or ():
        if not is_dra_kubelet_plugin(ds):
            continue
        template = (ds.get("spec") or {}).get("template") or {}
        pod_labels = (template.get("metadata") or {}).get("labels") or {}
        name = ds["metadata"]["name"]
        spec = template.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        # A deploy label a run left paused still counts: the repair puts "true" back before the change.
        if any(node_labels.get(k) != v and not (v == "true" and k.startswith(LABEL_DEPLOY)
                                                and node_labels.get(k) == PAUSED) for k, v in selector.items()):
            continue
        return {"present": True, "daemonset": "%s/%s" % (ds["metadata"].get("namespace", ""), name),
                "pod_selectors": ["%s=%s" % item for item in sorted(pod_labels.items())],
                "dynamic_mig": _handoff.dynamic_mig_gate(ds)}
    return {"present": False}


# -- the config from the cluster ------------------------------------------------------

def config_from_configmaps(configmaps: Iterable[Mapping[str, Any]] | None, candidates: Iterable[str], namespace: str,
                           key: str, host: str) -> dict[str, Any]:
    """The mig-parted config text from the first of ``candidates`` that exists in ``configmaps``.

    Returns {config, origin, configmap, error}: error names the node and the source when there is none."""
    by_name = dict((c["metadata"]["name"], c) for c in configmaps or ())
    for name in candidates:
        if name not in by_name:
            continue
        origin = "ConfigMap %s/%s (key %s)" % (namespace, name, key)
        data = by_name[name].get("data") or {}
        if key not in data:
            return {"config": None, "origin": origin, "configmap": name,
                    "error": "%s: ConfigMap %s/%s has no key '%s' (it has: %s). Nothing was changed."
                             % (host, namespace, name, key, ", ".join(sorted(data)) or "no data")}
        return {"config": data[key], "origin": origin, "configmap": name, "error": None}
    return {"config": None, "origin": None, "configmap": None,
            "error": "%s: no ConfigMap %s in namespace %s holds the MIG config. Nothing was changed."
                     % (host, " or ".join(candidates) or "(none named)", namespace)}


# -- settings -------------------------------------------------------------------

def effective_strategy(declared: str | None, operator: Mapping[str, Any], host: str) -> str:
    """The MIG strategy: declared, else the operator's, else mixed. A declared one the operator contradicts
    is refused: the operator's device plugin advertises what ClusterPolicy says, not what we declare."""
    declared = (declared or "").strip().lower()
    if declared and declared not in STRATEGIES:
        raise RefusedError("%s: mig_node_mig_strategy must be none, single or mixed, not '%s'" % (host, declared))
    theirs = operator.get("mig_strategy") if operator.get("present") else ""
    if declared and theirs and declared != theirs:
        has = ("has mig.strategy '%s'" % theirs) if operator.get("mig_strategy_set", True) else \
            "sets no mig.strategy (its device plugin and GFD run with their default, '%s')" % theirs
        raise RefusedError(
            "%s: mig_node_mig_strategy is '%s' but the GPU Operator's ClusterPolicy %s %s. "
            "Nothing was changed. Declare '%s' (or leave mig_node_mig_strategy empty), or change the ClusterPolicy."
            % (host, declared, operator["name"], has, theirs))
    return declared or theirs or "mixed"


def operator_mode(wanted: str | None, operator: Mapping[str, Any], source: str | None, host: str) -> str:
    """How this node is worked on: none (no operator), mig-manager (drive it), takeover, or dynamic (hand it to
    a dynamic MIG partitioner, with or without an operator).

    source: 'configmap' when the layout comes from the operator's ConfigMap, else the inventory's kind."""
    wanted = (wanted or "auto").strip().lower()
    if wanted not in OPERATOR_MODES:
        raise RefusedError("%s: mig_node_operator_mode must be auto, mig-manager, takeover, dynamic-dra or "
                           "dynamic-hami, not '%s'"
                           % (host, wanted))
    if wanted == "dynamic":
        return "dynamic"
    if not operator.get("present"):
        if wanted == "mig-manager":
            raise RefusedError("%s: mig_node_operator_mode=mig-manager, but no GPU Operator ClusterPolicy "
                               "was found%s. Nothing was changed." % (host, _gpu_cluster_note(operator)))
        return "none"
    manager = operator["mig_manager"]
    if wanted == "takeover":
        return "takeover"
    if wanted == "mig-manager":
        if not manager["on_node"]:
            raise RefusedError(
                "%s: mig_node_operator_mode=mig-manager, but mig-manager does not run on this node (%s). "
                "Nothing was changed." % (host, _why_not_on_node(manager)))
        return "mig-manager"
    if not manager["on_node"]:
        return "takeover"            # nobody else reconfigures this node's GPUs
    if source == "configmap":
        return "mig-manager"
    raise RefusedError(
        "%s: the GPU Operator's mig-manager runs on this node and reconfigures its GPUs from the "
        "nvidia.com/mig.config label, so a layout from %s would be fought over. Nothing was changed. "
        "Either let the collection drive mig-manager with the operator's config (leave the layout out, or set "
        "mig_node_config_configmap), or set mig_node_operator_mode=takeover to switch mig-manager off on the node."
        % (host, source))


def mig_manager_run(node: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the node's nvidia.com/mig.config.state says of mig-manager's run: {state, in_flight, finished,
    settled, restart_helps, paused_operands}. A run in flight ends with its own success or failed
    whatever the label asks meanwhile (mig-manager reads a new nvidia.com/mig.config value only
    between runs), so the label is changed only once it is settled. A run still `pending` after the
    wait (or no state at all: mig-manager never took the label up) is what a new pod gets out of;
    `rebooting` is a node going down and back (WITH_REBOOT), which a pod restart cannot shorten.
    paused_operands: after a failed run, the operand labels to put back (paused_operands); else
    none."""
    state = _labels(node).get(LABEL_STATE, "")
    return {"state": state, "in_flight": state in MIG_MANAGER_IN_FLIGHT, "finished": state in MIG_MANAGER_FINISHED,
            "settled": state not in MIG_MANAGER_IN_FLIGHT,
            "restart_helps": state in ("pending", ""),
            "paused_operands": paused_operands(node) if state == "failed" else {}}


def paused_operands(node: Mapping[str, Any] | None) -> dict[str, str]:
    """The operand deploy labels a mig-manager run left at paused-for-mig-change, with the value its setState
    would have written back ("true"). mig-manager restores them at most once per pod (NVIDIA/mig-parted
    pkg/mig/reconfigure: NoRestartK8sDaemonsetsOnExit is set by the first run that restarts the GPU clients and
    never reset), so after a failure they stay paused and the node advertises no GPUs."""
    return dict((k, "true") for k, v in sorted(_labels(node).items())
                if k.startswith(LABEL_DEPLOY) and k != LABEL_MIG_MANAGER and v == PAUSED)


def check_mig_manager_config(operator: Mapping[str, Any], configmap: str | None, explicit: bool | None,
                             host: str) -> None:
    """Driving mig-manager, the layout must come from the config mig-manager reads: the ClusterPolicy's
    migManager.config.name, else the config it generated for the node (<node>-mig-config). A ConfigMap named
    in the inventory that is neither would be checked here and then looked up by mig-manager in another config
    (a different layout under the same name, or none)."""
    reads = operator["mig_manager"]["config_maps"][0]
    if not explicit or configmap == reads:
        return
    named = operator["mig_manager"]["config_maps"] == [reads] and reads != DEFAULT_OPERATOR_CONFIG
    raise RefusedError(
        "%s: the GPU Operator's mig-manager reads its MIG config from ConfigMap %s/%s (%s), not from %s, so the "
        "layout would be checked against a config mig-manager does not use. Nothing was changed. Name your "
        "ConfigMap in the ClusterPolicy (migManager.config.name) and leave mig_node_config_configmap out, or "
        "set mig_node_operator_mode=takeover.%s"
        % (host, operator["namespace"], reads,
           "its migManager.config.name" if named else "generated by mig-manager from the node's GPUs, since the "
           "ClusterPolicy names no migManager.config.name", configmap,
           " The operator rewrites %s from its own asset: never put layouts there." % DEFAULT_OPERATOR_CONFIG
           if configmap == DEFAULT_OPERATOR_CONFIG else ""))


def _why_not_on_node(manager):
    if not manager["enabled"]:
        return "ClusterPolicy migManager.enabled is false"
    return "its label %s is %s" % (LABEL_MIG_MANAGER, manager["deploy_label"] or "missing")


def _gpu_cluster_note(operator):
    cluster = operator.get("gpu_cluster")
    if not cluster:
        return ""
    return (" (the GPUCluster %s runs NVIDIA's DRA driver and no mig-manager: its MIG devices are a static layout "
            "the collection applies itself; leave mig_node_operator_mode at auto)" % cluster["name"])


def refuse_dynamic_mig(operator: Mapping[str, Any], host: str) -> None:
    cluster = operator.get("gpu_cluster") or {}
    if cluster.get("dynamic_mig"):
        raise RefusedError(
            "%s: the GPUCluster %s runs NVIDIA's DRA driver with its DynamicMIG feature gate, which creates MIG "
            "devices per claim and destroys those it did not create. Nothing was changed. Leave this node to the "
            "DRA driver, or turn DynamicMIG off." % (host, cluster["name"]))
    dra = operator.get("dra") or {}
    if dra.get("present") and dra.get("dynamic_mig"):
        raise RefusedError(
            "%s: NVIDIA's DRA driver (%s) runs here with its DynamicMIG feature gate, which destroys MIG devices "
            "it did not create. Nothing was changed. Leave this node to the DRA driver, or turn DynamicMIG off."
            % (host, dra["daemonset"]))


# -- the decision ----------------------------------------------------------------

def single_strategy_problem(planned: Sequence[Mapping[str, Any]], config_label: str | None, host: str) -> str | None:
    """The single strategy needs every GPU MIG-enabled with one device type, or MIG off everywhere."""
    enabled = [g for g in planned if g["mig_enabled"]]
    if not enabled:
        return None
    types = set(name for g in enabled for name in g["devices"])
    if len(enabled) == len(planned) and all(g["devices"] for g in enabled) and len(types) == 1:
        return None
    parts = []
    for g in planned:
        if not g["mig_enabled"]:
            parts.append("GPU %d (%s): MIG disabled" % (g["index"], g["name"]))
        elif not g["devices"]:
            parts.append("GPU %d (%s): MIG enabled, no devices" % (g["index"], g["name"]))
        else:
            parts.append("GPU %d (%s): %s" % (g["index"], g["name"], ", ".join(sorted(g["devices"]))))
    return ("%s: with mig_node_mig_strategy=single every GPU of the node must be MIG-enabled with one and the same MIG "
            "device type (or MIG must be off on all of them), but the declared layout '%s' gives: %s. "
            "Nothing was changed. Use the mixed strategy or a uniform layout." % (host, config_label, "; ".join(parts)))


def decide(info: Mapping[str, Any], node: Mapping[str, Any] | None, operator: Mapping[str, Any] | None,
           settings: Mapping[str, Any]) -> dict[str, Any]:
    """The node's path and what each step needs.

    settings: host, kubernetes (bool), strategy (declared, may be empty), operator_mode (wanted),
    source (where the layout comes from: configmap, mig_node_config, ...), config_label,
    cordoned_annotation. Returns a dict; raises RefusedError for a node that must not be touched.
    """
    try:
        return _decide(info, node, operator or {"present": False}, settings)
    except _handoff.HandoffError as e:
        raise RefusedError(str(e))


def _decide(info, node, operator, settings):
    host = settings["host"]
    # A node handed to a dynamic partitioner (its record on the Node) is left to it, unless it is handed over
    # again or taken back (the action decided the take-back's layout on the node as it will be then).
    dynamic = (settings.get("operator_mode") or "").strip().lower() == "dynamic"
    record = _handoff.record_of(node, host)
    take_back = bool(record) and not dynamic and bool(settings.get("take_back"))
    if record and not dynamic and not take_back:
        return dict(left_alone(node, operator, dict(settings, info=info)), handed_off=record["partitioner"],
                    summary=_handoff.skipped_summary(host, record))
    if info.get("change") is None:
        return left_alone(node, operator, dict(settings, info=info))
    if not dynamic and not take_back:
        refuse_dynamic_mig(operator, host)
    settings = dict(settings, strategy=effective_strategy(settings.get("strategy"), operator, host),
                    mode=operator_mode(settings.get("operator_mode"), operator, settings.get("source"), host))
    if settings["strategy"] == "single" and not dynamic:
        problem = single_strategy_problem(info["planned"], settings["config_label"], host)
        if problem:
            raise RefusedError(problem)
    labels = _labels(node)
    change = info["change"]
    mode = settings["mode"]
    if mode == "mig-manager":
        check_mig_manager_config(operator, settings.get("configmap"), settings.get("configmap_explicit"), host)
    path = "converged" if not change["any"] else ("mig-manager" if mode == "mig-manager" else "reconfigure")
    if dynamic:
        path = "handoff"
    elif take_back and path == "converged":      # the take-back runs, and the layout is checked after it
        path = "mig-manager" if mode == "mig-manager" else "reconfigure"
    decision = {
        "path": path,
        "mode_change": change["mode"],
        "geometry_change": change["geometry"],
        "wants_mig": info["wants_mig"],
        "operator_mode": mode,
        "strategy": settings["strategy"],
        # Our own modules change the GPUs: mig-manager must be off on the node first (and stay off).
        # Handed to a dynamic partitioner: mig-manager must be off too (two owners of the MIG devices).
        "operator_mig_manager_off": mode in ("takeover", "dynamic") and bool(operator.get("present"))
        and labels.get(LABEL_MIG_MANAGER) != "false",
        "host_mig_manager": host_mig_manager_action(info, mode),
        "persist": mode != "mig-manager",
        "restore_in_step": bool((info.get("restore") or {}).get("in_step", True)),
        "cordoned_earlier": settings.get("cordoned_annotation", "") in _annotations(node),
        "unschedulable": bool(((node or {}).get("spec") or {}).get("unschedulable")),
        "converged_labels": {},
        # A mig-manager run already in flight is waited out before the label changes (drive.yml).
        "mig_manager_run": mig_manager_run(node) if mode == "mig-manager" else None,
        "gpu_cluster": (operator.get("gpu_cluster") or {}).get("name"),
        # Paused beside mig_node_operand_components (clients_pause.yml): a GPUCluster's operands hold the GPUs.
        "operand_components": list(GPU_CLUSTER_CLIENTS) if operator.get("gpu_cluster") else [],
        # With WITH_REBOOT a mode change may reboot the node and wait for the driver container's rebuild: the
        # wait for mig-manager gets twice mig_node_reboot_timeout more.
        "mig_manager_may_reboot": mode == "mig-manager" and (
            (bool(change["mode"]) and bool(operator["mig_manager"].get("with_reboot")))
            or _labels(node).get(LABEL_STATE) == "rebooting"),
    }
    decision["handoff"], decision["drain"] = None, None
    decision["take_back"] = _handoff.take(record) if take_back else None
    if take_back and decision["operator_mig_manager_off"]:   # taken over: mig-manager's label stays false
        decision["take_back"]["labels"][LABEL_MIG_MANAGER] = "false"
    if dynamic:
        decision["drain"] = _drain_preview(settings, info, path, host)
        decision["handoff"] = _handoff.give(info, node, dict(settings, daemonsets=settings.get("daemonsets")),
                                            decision["drain"])
        if decision["handoff"] is None:    # handed over already, the GPUs as the hand-off left them
            decision["path"], decision["drain"], path = "converged", None, "converged"
    if settings.get("kubernetes") and path == "converged" and not dynamic:
        wanted = {LABEL_CONFIG: settings["config_label"]}
        if mode != "mig-manager":     # mig-manager writes the state label itself
            wanted[LABEL_STATE] = "success"
        decision["converged_labels"] = dict((k, v) for k, v in wanted.items() if labels.get(k) != v)
    # A converged node with none of these is finished by its preview alone (site.yml skips its steady pass).
    decision["repair"] = repair_plan(node, host, path, validate=True, info=info,
                                     bounds=owed_bounds(settings, operator, node))
    decision["drain"] = decision["drain"] if dynamic else \
        (_drain_preview(settings, info, path, host) if path != "converged" else None)
    decision["mig_manager_failure_hint"] = mounted_config_hint(operator, node, settings["config_label"]) \
        if path == "mig-manager" else ""
    # takeover.yml does both: the operator's mig-manager off, NVIDIA's host unit off (or back on at hand-back).
    decision["switch_off_mig_manager"] = decision["operator_mig_manager_off"] or bool(decision["host_mig_manager"])
    decision["steady_work"] = [name for name, due in (
        ("repair", bool(decision["repair"]) and path == "converged"),
        ("lease", abandoned_lease(settings.get("lease")) and path == "converged"),
        ("switch off mig-manager", decision["operator_mig_manager_off"]),
        ("disable nvidia-mig-manager.service", decision["host_mig_manager"] == "disable"),
        ("enable nvidia-mig-manager.service again", decision["host_mig_manager"] == "enable"),
        ("restore", decision["persist"] and not decision["restore_in_step"]),
        ("labels", bool(decision["converged_labels"])),
        ("uncordon", decision["cordoned_earlier"] and path == "converged")) if due]
    decision["summary"] = _summary(host, settings["config_label"], decision)
    if decision["handoff"]:
        decision["summary"] = _handoff.handoff_summary(host, decision["handoff"], decision)
    elif dynamic:
        decision["summary"] = "%s: handed to the dynamic partitioner %s already: nothing disruptive to do." % (
            host, record["partitioner"])
    elif take_back:
        decision["summary"] = "%s: take the node back from the dynamic partitioner %s (its plugin sent away, its " \
                              "devices gone), then %s" % (host, record["partitioner"],
                                                          decision["summary"].split(": ", 1)[1])
    return decision


def _drain_preview(settings, info, path, host):
    """Which pods the change will evict (chosen again inside the cordoned window); None: not said."""
    if "drain" not in settings:
        return None
    try:
        return _node_pods.drain_preview(settings["drain"], info, path)
    except ValueError as e:
        raise RefusedError("%s: %s. Nothing was changed." % (host, e))


def mounted_config_hint(operator: Mapping[str, Any], node: Mapping[str, Any] | None, config_label: str | None) -> str:
    """What a `failed` from mig-manager may mean when it reads a ConfigMap of the user's: the pod reads the
    ConfigMap as mounted, and the kubelet refreshes a mounted ConfigMap only on its sync period (about a
    minute), so a config name added just before the rollout is not there yet for it. A generated
    <node>-mig-config is read once, at the pod's start, and has no such delay."""
    manager = operator["mig_manager"]
    if len(manager["config_maps"]) != 1:
        return ""
    return ("; if '%s' was added to ConfigMap %s/%s in the last minutes, mig-manager may not see it yet (a mounted "
            "ConfigMap reaches the pod only after the kubelet's sync, about a minute): wait, or restart the node's "
            "mig-manager pod (kubectl delete pod -n %s -l app=nvidia-mig-manager --field-selector "
            "spec.nodeName=%s), then run again"
            % (config_label, operator["namespace"], manager["config_maps"][0], operator["namespace"],
               ((node or {}).get("metadata") or {}).get("name", "")))


def host_mig_manager_action(info: Mapping[str, Any], mode: str) -> str | None:
    """NVIDIA's host unit nvidia-mig-manager.service (mig_node_info's host_mig_manager): "disable" where the
    collection applies a MIG layout itself and the unit would apply its own config at the next boot, after the
    collection's boot-time restore; "enable" where MIG is declared off (the hand-back: no restore any more) and
    the collection is the one that disabled it; else None. Its override.conf is never touched."""
    unit = info.get("host_mig_manager") or {}
    if not unit.get("present") or mode == "mig-manager":
        return None
    if info.get("wants_mig") and unit.get("enabled"):
        return "disable"
    if not info.get("wants_mig") and not unit.get("enabled") and unit.get("disabled_by_gpuops"):
        return "enable"
    return None


def left_alone(node: Mapping[str, Any] | None, operator: Mapping[str, Any] | None,
               settings: Mapping[str, Any]) -> dict[str, Any]:
    """The decision for a node with no layout to apply (a plan that leaves a node without MIG-capable GPUs as
    it is): converged, no labels, no boot-time restore; only a cordon an earlier failed run left is lifted."""
    host = settings["host"]
    cordoned = settings.get("cordoned_annotation", "") in _annotations(node)
    repair = repair_plan(node, host, "converged", validate=False, info=settings.get("info"),
                         bounds=owed_bounds(settings, operator, node))
    return {
        "path": "converged", "mode_change": False, "geometry_change": False, "wants_mig": False,
        "operator_mode": "none", "strategy": effective_strategy(settings.get("strategy"), operator, host),
        "switch_off_mig_manager": False, "operator_mig_manager_off": False, "host_mig_manager": None,
        "persist": False, "restore_in_step": True,
        "cordoned_earlier": cordoned, "unschedulable": bool(((node or {}).get("spec") or {}).get("unschedulable")),
        "converged_labels": {}, "repair": repair,
        "steady_work": ((["repair"] if repair else []) + (["uncordon"] if cordoned else [])
                        + (["lease"] if abandoned_lease(settings.get("lease")) else [])),
        "summary": "%s: the plan leaves this node as it is (no MIG layout for its GPUs): %s." % (
            host, "first, " + repair["message"] if repair else "nothing to do"),
    }


def abandoned_lease(lease: Mapping[str, Any] | None, now: datetime.datetime | None = None) -> bool:
    """Whether the node's Lease (as the API serves it) is held by a run that stopped renewing it: a converged
    node takes it over and releases it, so no dead run's hold is left behind."""
    if not lease:
        return False
    record = _lease.from_lease(lease)
    return bool(record["holder_identity"]) and _lease.expired(record, now or _lease.utc_now())


def owed_bounds(settings: Mapping[str, Any], operator: Mapping[str, Any] | None,
                node: Mapping[str, Any] | None) -> dict[str, Any]:
    """What an owed record may ask of this run (_node_records.owed_bounds): the configured GPU
    clients, the operand components (a GPUCluster's too) and the node's Lease as read before this
    run took it."""
    components = list(settings.get("operand_components") or ())
    if (operator or {}).get("gpu_cluster"):
        components += GPU_CLUSTER_CLIENTS
    return _node_records.owed_bounds(settings.get("gpu_clients"), components,
                                     settings.get("lease"), kubernetes=node is not None)


def repair_plan(node: Mapping[str, Any] | None, host: str, path: str, validate: bool,
                info: Mapping[str, Any] | None = None,
                bounds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the node's owed record (gpuops.mig/owed, left by a run that did not finish) asks this run to put
    right first, once it holds the node's lease (roles/mig_node/tasks/repair.yml); {} when nothing is owed.

    The record is an instruction anyone who may patch the Node could write: only what `bounds`
    (owed_bounds) allows is acted on, and anything else refuses the node, for a person to look at.
    A node about to change keeps the device-plugin restart owed (its own change restarts the plugin); a
    converged node gets it now, validated when `validate` (the node has a declared layout to check)."""
    try:
        # Outside Kubernetes (no Node) the record is a file on the host, read by mig_node_info.
        owed_file = (info or {}).get("owed") or {}
        bounds = bounds or _node_records.owed_bounds((), (), None)
        record = _node_records.trusted_owed(node, bounds, owed_file.get("text"),
                                            owed_file.get("path"))
    except _node_records.OwedRecordError as exc:
        raise RefusedError("%s: %s. Nothing was changed and nothing it names was started or "
                           "relabelled. Check the node's host GPU services and its "
                           "nvidia.com/gpu.deploy.* labels by hand, then remove the record."
                           % (host, exc))
    if not record:
        return {}
    restart = record["device_plugin"] and path == "converged"
    now_done = ("services", "operands") + (("device_plugin",) if restart else ())
    return {
        "services": record["services"], "operands": record["operands"],
        "device_plugin": restart, "validate": restart and validate,
        # The interrupted run may have changed the GPUs and died before /dev/nvidia-caps and the CDI spec
        # followed; a node about to change gets both from its own change.
        "devices": path == "converged",
        # What is still owed once this run's repair is done (services, operands, device_plugin);
        # repair.yml records it as this run's, which holds the lease now.
        "left": dict((part, _node_records.settled(record, *now_done).get(part, empty))
                     for part, empty in zip(_node_records.OWED_PARTS, ([], {}, False))),
        "message": "%s; this run puts that right before anything else" % _node_records.describe_owed(record),
    }


def _summary(host, label, decision):
    first = "; first, %s" % decision["repair"]["message"] if decision.get("repair") else ""
    if decision["path"] == "converged":
        return "%s: layout '%s' is already in place: nothing disruptive to do%s." % (host, label, first)
    parts = (["MIG mode change"] if decision["mode_change"] else []) + \
            (["geometry change"] if decision["geometry_change"] else [])
    how = " (applied by the GPU Operator's mig-manager)" if decision["path"] == "mig-manager" else ""
    drain = "; %s" % decision["drain"]["text"] if decision.get("drain") else ""
    if decision.get("gpu_cluster"):
        how = " (a static layout under the GPUCluster %s, which runs no mig-manager)" % decision["gpu_cluster"]
    run = decision.get("mig_manager_run") or {}
    if decision["path"] == "mig-manager" and run.get("in_flight"):
        how += ", once its run in flight (nvidia.com/mig.config.state=%s) has ended" % run["state"]
    return "%s: layout '%s' is not in place: %s needed%s%s%s." % (host, label, " and ".join(parts), how, drain, first)


# -- what the node must advertise afterwards ---------------------------------------

def expected_advertisement(gpus: Sequence[Mapping[str, Any]], strategy: str,
                           with_labels: bool = True) -> dict[str, Any]:
    """The device plugin's resources and GFD's labels for these GPUs (NVIDIA/k8s-device-plugin
    internal/rm/device_map.go; GFD internal/lm/mig-strategy.go).

    gpus: mig_facts GPUs (name, mig_enabled, mig_devices). Values are strings, as on a Node.
    """
    mig = [g for g in gpus if g.get("mig_enabled")]
    whole = [g for g in gpus if not g.get("mig_enabled")]
    product = (gpus[0]["name"] if gpus else "none").replace(" ", "-")
    resources, labels = {}, {}
    if strategy == "none":
        resources["nvidia.com/gpu"] = len(gpus)
        labels.update({"nvidia.com/gpu.count": len(gpus), "nvidia.com/gpu.product": product})
    elif strategy == "mixed":
        if whole:
            resources["nvidia.com/gpu"] = len(whole)
        labels.update({"nvidia.com/gpu.count": len(whole), "nvidia.com/mig.strategy": "mixed"})
        for gpu in mig:
            for name, count in sorted((gpu.get("mig_devices") or {}).items()):
                if checks.count(name[:1]) is None or "g." not in name:
                    continue
                key = "nvidia.com/mig-" + name.replace("+", ".")
                resources[key] = resources.get(key, 0) + count
                labels[key + ".count"] = resources[key]
    else:
        types = sorted(set(name for g in mig for name in (g.get("mig_devices") or {})))
        labels["nvidia.com/mig.strategy"] = "single"
        if mig and len(mig) == len(gpus) and len(types) == 1:
            total = sum(g["mig_devices"][types[0]] for g in mig)
            resources["nvidia.com/gpu"] = total
            labels.update({"nvidia.com/gpu.count": total,
                           "nvidia.com/gpu.product": "%s-MIG-%s" % (product, types[0].replace("+", "."))})
        elif not mig:
            resources["nvidia.com/gpu"] = len(gpus)
            labels["nvidia.com/gpu.count"] = len(gpus)
    return {"resources": dict((k, str(v)) for k, v in resources.items()),
            "labels": dict((k, str(v)) for k, v in labels.items()) if with_labels else {}}


def advertised(node: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> dict[str, Any]:
    """What a Node advertises, in the shape of expected_advertisement() (only the keys it speaks of)."""
    allocatable = ((node or {}).get("status") or {}).get("allocatable") or {}
    resources = dict((k, str(v)) for k, v in allocatable.items()
                     if (k in ("nvidia.com/gpu", "nvidia.com/gpu.shared") or k.startswith("nvidia.com/mig-"))
                     and str(v) != "0")
    labels = dict((k, v) for k, v in _labels(node).items() if k in expected["labels"])
    return {"resources": resources, "labels": labels}


def expected_slices(gpus: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """For NVIDIA's DRA driver: the sorted (parent UUID, profile) pairs of MIG devices, and the whole GPUs."""
    mig = sorted((g["uuid"], name) for g in gpus if g.get("mig_enabled")
                 for name, count in (g.get("mig_devices") or {}).items() for _copy in range(count))
    whole = sorted(g["uuid"] for g in gpus if not g.get("mig_enabled"))
    return {"mig": [list(pair) for pair in mig], "gpus": whole}


def published_slices(slices: Iterable[Mapping[str, Any]] | None, node_name: str) -> dict[str, list[Any]]:
    """The node's ResourceSlices of gpu.nvidia.com (newest pool generation) in expected_slices()' shape."""
    ours = [s for s in slices or () if (s.get("spec") or {}).get("driver") == "gpu.nvidia.com"
            and (s.get("spec") or {}).get("nodeName") == node_name]
    if not ours:
        return {"mig": [], "gpus": []}
    newest = max((s["spec"].get("pool") or {}).get("generation", 0) for s in ours)
    mig, whole = [], []
    for s in ours:
        if (s["spec"].get("pool") or {}).get("generation", 0) != newest:
            continue
        for device in s["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            kind = (attrs.get("type") or {}).get("string")
            if kind == "mig":
                mig.append([(attrs.get("parentUUID") or {}).get("string"), (attrs.get("profile") or {}).get("string")])
            elif kind == "gpu":
                whole.append((attrs.get("uuid") or {}).get("string"))
    return {"mig": sorted(mig), "gpus": sorted(whole)}


def _labels(node):
    return dict(((node or {}).get("metadata") or {}).get("labels") or {})


def _annotations(node):
    return dict(((node or {}).get("metadata") or {}).get("annotations") or {})
