"""The device plugin's per-node config and its sharing, for the plugin and GFD stand-ins (deviceplugin.py).

As NVIDIA/k8s-device-plugin v0.20.0 does, when a plugin or GFD pod starts on a node:

- The config is an entry of the ConfigMap the pod mounts as `available-configs` (the chart's
  `config.map` / `config.name`). The entry is the node label `nvidia.com/device-plugin.config`; without
  the label, the pod's DEFAULT_CONFIG; without that, the fallback strategies (FALLBACK_STRATEGIES, default
  `named,single`: an entry called `default`, else the only entry). A label or default naming a missing
  entry, or no entry at all, stops the pod (cmd/config-manager/main.go, updateConfigName). A pod without
  that volume runs without a config file.
- `sharing.timeSlicing.resources[{name, replicas}]` turns each device of the resource into `replicas`
  devices; `renameByDefault` advertises them as `<name>.shared` (api/config/v1/replicas.go, consts.go;
  internal/rm/device_map.go). Fewer than 2 replicas, no resources, or another `version` than v1 are
  refused when the config is read (api/config/v1/replicas.go, config.go).
- GFD labels a replicated resource `<name>.replicas`, `<name>.sharing-strategy` and, not renamed, appends
  `-SHARED` to `<name>.product` (internal/lm/resource.go).
- `failRequestsGreaterThanOne`: a container asking for more than one replica is refused at Allocate
  (internal/rm/rm.go ValidateRequest); the kubelet fails such a pod with UnexpectedAdmissionError.
- MPS (`sharing.mps`) with migStrategy=mixed (cmd/nvidia-device-plugin/main.go validateFlags) or over MIG
  devices (internal/plugin/mps.go) stops the plugin: its pod crash-loops and nothing is advertised.

Not modelled: the config-manager sidecar switching a running pod's config when the label changes (the
stand-ins read the config when a pod starts; the collection restarts the plugin after a change),
`devices` subsets of a resource, the plugin's `flags` other than none, MPS's control daemon and GFD's
`mps.capable` label.
"""

from __future__ import annotations

import weakref

import yaml

CONFIG_LABEL = "nvidia.com/device-plugin.config"
CONFIG_VOLUME = "available-configs"
SHARED_SUFFIX = ".shared"
DEFAULT_FALLBACKS = ("named", "single")
NAMED_FALLBACK = "default"

# (cluster) -> {node name: the sharing the node's running plugin applies}
_active: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (cluster) -> {node name: uids of the pods the running plugin has admitted (or found running when it started)}
_admitted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ConfigError(Exception):
    """The plugin cannot start with this config (what it logs before it exits)."""


def _env(pod: dict, name: str):
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == name and "value" in env:
                return env["value"]
    return None


def config_map_name(pod: dict):
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == CONFIG_VOLUME and volume.get("configMap"):
            return volume["configMap"].get("name")
    return None


def select_entry(files: dict, label: str, default: str, fallbacks) -> str:
    """The entry config-manager links for the plugin (updateConfigName)."""
    if not files:
        raise ConfigError("error getting list of configuration files: no configuration files available")
    if label:
        if label not in files:
            raise ConfigError(f"specified config {label} does not exist")
        return label
    if default:
        if default not in files:
            raise ConfigError(f"specified config {default} does not exist")
        return default
    for fallback in fallbacks:
        if fallback == "named" and NAMED_FALLBACK in files:
            return NAMED_FALLBACK
        if fallback == "single" and len(files) == 1:
            return next(iter(files))
        if fallback == "empty":
            return ""
    raise ConfigError("no config was set, no default was provided, and all fallbacks failed")


def parse(text: str) -> dict:
    """The sharing of a config file: {strategy, rename, fail_requests_greater_than_one, replicas {name: n}}."""
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"unable to parse config file: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError("unable to parse config file: not a mapping")
    if config.get("version", "v1") != "v1":
        raise ConfigError(f"unable to parse config file: unknown version: {config.get('version')}")
    sharing = config.get("sharing") or {}
    mps = sharing.get("mps")
    chosen = mps if mps is not None else sharing.get("timeSlicing")
    view = {"strategy": "none", "rename": False, "fail_requests_greater_than_one": mps is not None, "replicas": {}}
    if not chosen:
        return view
    if not chosen.get("resources"):
        raise ConfigError("unable to parse config file: no resources specified")
    for resource in chosen["resources"]:
        if not resource.get("name"):
            raise ConfigError("unable to parse config file: no resource name specified")
        replicas = resource.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
            raise ConfigError("unable to parse config file: number of replicas must be >= 2")
        name = resource["name"] if "/" in resource["name"] else "nvidia.com/" + resource["name"]
        view["replicas"][name] = replicas
    view["rename"] = bool(chosen.get("renameByDefault", False))
    if "failRequestsGreaterThanOne" in chosen:
        view["fail_requests_greater_than_one"] = bool(chosen["failRequestsGreaterThanOne"])
    view["strategy"] = "mps" if mps is not None else "time-slicing"
    return view


def node_sharing(cluster, node: dict, pod: dict) -> dict:
    """The sharing of the config the pod starts with on the node (ConfigError when it cannot start)."""
    name = config_map_name(pod)
    if not name:
        return parse("")
    configmap = cluster.find("ConfigMap", name, pod["metadata"]["namespace"]) or {}
    files = configmap.get("data") or {}
    fallbacks = [f for f in (_env(pod, "FALLBACK_STRATEGIES") or ",".join(DEFAULT_FALLBACKS)).split(",") if f]
    entry = select_entry(files, (node["metadata"].get("labels") or {}).get(CONFIG_LABEL, ""),
                         _env(pod, "DEFAULT_CONFIG") or "", fallbacks)
    return parse(files.get(entry, "") if entry else "")


def apply(cluster, node: dict, pod: dict, view: dict, strategy: str, plugin: bool) -> dict:
    """``view`` (deviceplugin.advertise) as the plugin (``plugin``) or GFD publishes it under the node's config."""
    try:
        sharing = node_sharing(cluster, node, pod)
        if sharing["strategy"] == "mps":
            if strategy == "mixed":
                raise ConfigError("unable to validate flags: using --mig-strategy=mixed is not supported with MPS")
            if strategy == "single" and "-MIG-" in view["labels"].get("nvidia.com/gpu.product", ""):
                raise ConfigError("sharing using MPS is not supported for MIG devices")
    except ConfigError as e:
        if plugin:
            _active.setdefault(cluster, {}).pop(node["metadata"]["name"], None)
            return dict(view, resources={}, plugin_ok=False, plugin_error=str(e))
        return view     # GFD keeps the labels it would write without sharing (its own errors are not modelled)
    if plugin:
        name = node["metadata"]["name"]
        _active.setdefault(cluster, {})[name] = sharing
        # Pods already on the node went through an earlier Allocate; only new ones meet this config.
        _admitted.setdefault(cluster, {})[name] = {
            p["metadata"]["uid"] for p in cluster.list("Pod", field_selector=f"spec.nodeName={name}")}
    if not view.get("plugin_ok", True):
        return view
    resources, labels = dict(view["resources"]), dict(view["labels"])
    for name, replicas in sharing["replicas"].items():
        if name not in resources:
            continue
        count = resources.pop(name)
        resources[name + SHARED_SUFFIX if sharing["rename"] else name] = count * replicas
        labels[name + ".replicas"] = str(replicas)
        labels[name + ".sharing-strategy"] = sharing["strategy"]
        if not sharing["rename"] and name + ".product" in labels:
            labels[name + ".product"] += "-SHARED"
    return dict(view, resources=resources, labels=labels)


def refuse_oversized_requests(cluster, node_name: str, pods) -> None:
    """failRequestsGreaterThanOne: fail the pods new on the node that ask one container for more than one
    replica (kwok, the kubelet, marks a bound pod Running without an Allocate; this stands in for
    the plugin's refusal there, once the pod runs, so kwok's status does not overwrite it)."""
    sharing = _active.get(cluster, {}).get(node_name)
    if not sharing or not sharing["fail_requests_greater_than_one"] or not sharing["replicas"]:
        return
    shared = {name + SHARED_SUFFIX if sharing["rename"] else name for name in sharing["replicas"]}
    admitted = _admitted.setdefault(cluster, {}).setdefault(node_name, set())
    for pod in pods:
        if pod["metadata"]["uid"] in admitted or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (pod.get("status") or {}).get("phase") != "Running":
            continue    # judged once started: kwok (the kubelet) would overwrite a refusal
        admitted.add(pod["metadata"]["uid"])
        for container in (pod.get("spec") or {}).get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            counts = [int(str(limits[n])) for n in sorted(shared) if str(limits.get(n, "")).isdigit()]
            asked = max(counts, default=0)
            if asked > 1:
                cluster.set_status("Pod", pod["metadata"]["name"], {
                    "phase": "Failed", "reason": "UnexpectedAdmissionError",
                    "message": "Allocate failed due to rpc error: code = Unknown desc = invalid request: maximum "
                               f"request size for shared resources is 1; found {asked}, which is unexpected"},
                    pod["metadata"]["namespace"])
                break
