# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Is this Node MIG-ready, and if not, what exactly is missing: decided from the Kubernetes API
alone.

A node is MIG-ready when its declared layout (from the inventory, the node pool's mapping or its
nvidia.com/mig.config label) is what the device plugin advertises in status.allocatable and what
GPU Feature Discovery labels, with no whole-GPU resource left where every GPU is MIG, and no
failure recorded on it (gpuops.mig/last-error, nvidia.com/mig.config.state=failed). The watcher
(playbooks/mig_ready.yml) and the fleet report use it; gpuops.mig.mig_node_ready writes the
verdict. No Ansible imports.
"""

from __future__ import annotations

from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError
from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils._input import pattern, whole
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    ANNOTATION_LAST_ERROR,
    LABEL_CONFIG,
    LABEL_STATE,
)
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._node_status import (
    CONDITION_TYPE,
    TaintError,
    basis_of,
    condition_of,
    has_taint,
    parse_taint,
)

__all__ = [
    "MigReadyError",
    "declared_layout",
    "decide",
    "verdicts",
    "parse_taint",
    "CONDITION_TYPE",
]

READY = "MIGLayoutReady"
NOT_ADVERTISED = "MIGLayoutNotAdvertised"
FAILED = "MIGReconfigureFailed"
PENDING = "MIGLayoutPending"
INVALID = "MIGLayoutInvalid"
CHANGING = "MIGLayoutChanging"  # a rollout holds the node (roles/mig_node)

MIG_PREFIX = "nvidia.com/mig-"
WHOLE = "nvidia.com/gpu"
# The most compute slices any MIG GPU has (A100, H100, H200, B200: 7; A30: 4).
MAX_SLICES = 7
# The settings of the inventory that declare a host's layout (the mig_node role's variables).
HOST_KEYS = (
    ("config", "mig_node_config"),
    ("config_file", "mig_node_config_file"),
    ("layouts", "mig_node_layouts"),
    ("config_name", "mig_node_config_name"),
)
POOL_KEYS = ("node_labels", "config", "config_file", "config_name", "layouts", "gpus")
_PROFILE = pattern(r"(?:[0-9]+c\.)?([0-9]+)g\.([0-9]+)gb(?:[+][a-z]+)*")


class MigReadyError(ValueError):
    """A declaration that cannot be checked: names the node, the source and the entry."""


def _unset(value):
    return value in (None, "", [], {})


def _pool_for(node_name, labels, pools):
    """(pool name, pool) whose node_labels all match the node's labels; None when none does."""
    if _unset(pools):
        return None
    if not isinstance(pools, Mapping):
        raise MigReadyError(
            "gpuops_mig_ready_pools must map a pool name to its layout, got %s"
            % type(pools).__name__
        )
    found = []
    for name, pool in sorted(pools.items()):
        where = "gpuops_mig_ready_pools[%s]" % name
        if not isinstance(pool, Mapping):
            raise MigReadyError(
                "%s: a pool must be a mapping with node_labels and a layout" % where
            )
        unknown = sorted(set(pool) - set(POOL_KEYS))
        if unknown:
            raise MigReadyError(
                "%s: unknown key(s) %s; allowed: %s"
                % (where, ", ".join(unknown), ", ".join(POOL_KEYS))
            )
        selector = pool.get("node_labels")
        if not isinstance(selector, Mapping) or not selector:
            raise MigReadyError(
                "%s: node_labels must be a non-empty mapping of the labels its nodes "
                "carry" % where
            )
        if all(labels.get(str(k)) == str(v) for k, v in selector.items()):
            found.append((name, pool))
    if len(found) > 1:
        raise MigReadyError(
            "Node %s: matches pools %s of gpuops_mig_ready_pools; a node belongs to one"
            % (node_name, ", ".join(entry[0] for entry in found))
        )
    return found[0] if found else None


def _entries(settings, where, label_name):
    """(entries, config name) of a layout declaration: config/config_file (+ name) or layouts."""
    given = [k for k in ("config", "config_file", "layouts") if not _unset(settings.get(k))]
    if len(given) != 1:
        raise MigReadyError(
            "%s: %s; declare exactly one of config (a mig-parted config), config_file "
            "or layouts"
            % (where, "names no layout" if not given else "sets " + " and ".join(given))
        )
    try:
        if given == ["layouts"]:
            layouts = settings["layouts"]
            return migparted.entries_from_layouts(layouts, origin="layouts"), "custom"
        if given == ["config_file"]:
            path = str(settings["config_file"])
            config = migparted.load_config(migparted.read_config_file(path), origin=path)
        else:
            config = migparted.load_config(settings["config"], origin="config")
        name = settings.get("config_name") or label_name or None
        return config.select(name), name or config.names[0]
    except ConfigError as e:
        raise MigReadyError("%s: %s" % (where, e))


def declared_layout(
    node: Mapping[str, Any], pools: Any = None, host: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The layout declared for ``node``: {source, name, entries, gpus}.

    ``host``: the node's inventory settings (mig_node_config, _config_file, _config_name,
    _layouts), which win; else the pool of ``pools`` (gpuops_mig_ready_pools) whose node_labels the
    node carries; the config name is the setting's, else the node's nvidia.com/mig.config label.
    MigReadyError names the node, the source and the entry when none declares it or the declaration
    is wrong."""
    meta = node.get("metadata") or {}
    name = meta.get("name", "?")
    labels = meta.get("labels") or {}
    label_name = labels.get(LABEL_CONFIG)
    settings = dict((key, (host or {}).get(var)) for key, var in HOST_KEYS)
    gpus = None
    if any(not _unset(settings.get(k)) for k in ("config", "config_file", "layouts")):
        source = "Node %s, inventory" % name
    else:
        pool = _pool_for(name, labels, pools)
        if pool is None:
            why = (
                (
                    "carries %s=%s but no pool of gpuops_mig_ready_pools nor the inventory "
                    "says which config file holds it" % (LABEL_CONFIG, label_name)
                )
                if label_name
                else "no layout is declared for it (inventory, gpuops_mig_ready_pools or %s)"
                % LABEL_CONFIG
            )
            raise MigReadyError("Node %s: %s" % (name, why))
        source = "Node %s, gpuops_mig_ready_pools[%s]" % (name, pool[0])
        settings = dict(
            (k, pool[1].get(k)) for k in ("config", "config_file", "layouts", "config_name")
        )
        gpus = pool[1].get("gpus")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise MigReadyError(
                "%s: gpus must be the number of GPUs of its nodes, got %r" % (source, gpus)
            )
    entries, config_name = _entries(settings, source, label_name)
    for entry in entries:
        if entry.device_filter:
            raise MigReadyError(
                "%s: %s selects GPUs by device-filter, which a Node does not show; "
                "give the pool a layout without device-filter" % (source, entry.label)
            )
    _check_fits(node, entries, source)
    return {"source": source, "name": config_name, "entries": entries, "gpus": gpus}


def _check_fits(node, entries, source):
    """Refuse a layout no GPU of the node can hold: more compute slices than a MIG GPU has, or more
    memory than GPU Feature Discovery says the node's GPUs have (nvidia.com/gpu.memory, when
    labelled; profile names round their memory up: an 80 GB H100 reports 81559 MiB, so 5 % are
    allowed)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    try:
        memory_gb = int(labels.get("nvidia.com/gpu.memory") or 0) / 1024.0
    except ValueError:
        memory_gb = 0
    for entry in entries:
        slices = memory = 0
        for profile, count in (entry.mig_devices or {}).items():
            match = whole(_PROFILE, profile)
            if match:
                slices += int(match.group(1)) * count
                memory += int(match.group(2)) * count
        if slices > MAX_SLICES or (memory_gb and memory > memory_gb * 1.05):
            raise MigReadyError(
                "%s: %s asks for %s per GPU: %d compute slices and %d GB, more than a GPU "
                "of this node holds (%d slices%s)"
                % (
                    source,
                    entry.label,
                    _devices_text(entry.mig_devices),
                    slices,
                    memory,
                    MAX_SLICES,
                    ", %d GB" % memory_gb if memory_gb else "",
                )
            )


def _devices_text(devices):
    shown = ["%d x %s" % (n, p) for p, n in sorted(devices.items()) if n]
    return " + ".join(shown) or "no MIG device"


def _count(value):
    """A quantity as the API server writes it ("4"), or 0 for anything else."""
    return checks.count(value) or 0


def _advertised(node):
    allocatable = ((node.get("status") or {}).get("allocatable")) or {}
    return dict((k, _count(v)) for k, v in allocatable.items() if k.startswith("nvidia.com/"))


def _expected(declared, advertised):
    """{resource: count} the node must advertise under the mixed strategy, and the GPU count, or a
    reason why it cannot be told (a GPU count not given that what is advertised does not
    reveal)."""
    entries, gpus = declared["entries"], declared["gpus"]
    every = [e for e in entries if e.devices == "all"]
    indexed = dict((i, e) for e in entries if e.devices != "all" for i in e.devices)
    count = gpus
    if count is None and every:
        per = (
            dict((p, n) for p, n in every[-1].mig_devices.items() if n)
            if every[-1].mig_enabled
            else {}
        )
        if per and not indexed:
            ratios = set(advertised.get(MIG_PREFIX + p, 0) / float(n) for p, n in per.items())
            whole_ratio = ratios.pop() if len(ratios) == 1 else None
            if whole_ratio is None or whole_ratio != int(whole_ratio) or whole_ratio < 1:
                return (
                    None,
                    None,
                    "device plugin advertises %s, which is not a whole number of GPUs "
                    "of %s" % (_resources_text(advertised, per), _devices_text(per)),
                )
            count = int(whole_ratio)
        elif not indexed:
            count = advertised.get(WHOLE, 0) or None
    if count is None:
        count = max(list(indexed) + [-1]) + 1
    want, whole = {}, 0
    for index in range(count):
        entry = indexed.get(index) or (every[-1] if every else None)
        if entry is None:
            continue
        if not entry.mig_enabled:
            whole += 1
            continue
        for profile, n in entry.mig_devices.items():
            if n:
                want[MIG_PREFIX + profile] = want.get(MIG_PREFIX + profile, 0) + n
    return want, whole, None


def _resources_text(advertised, per):
    return ", ".join(
        "%s: %d" % (MIG_PREFIX + p, advertised.get(MIG_PREFIX + p, 0)) for p in sorted(per)
    )


def _failure(node):
    """(reason, message) of a failure recorded on the Node, else None."""
    meta = node.get("metadata") or {}
    error = (meta.get("annotations") or {}).get(ANNOTATION_LAST_ERROR)
    if error:
        import json

        try:
            record = json.loads(error)
            text = "%s at step %s" % (record.get("message") or "?", record.get("step") or "?")
        except (ValueError, AttributeError):
            text = str(error)
        return FAILED, "%s says the last MIG change failed: %s" % (
            ANNOTATION_LAST_ERROR,
            text[:600],
        )
    state = (meta.get("labels") or {}).get(LABEL_STATE)
    if state == "failed":
        return FAILED, "%s is failed: mig-manager could not apply the layout" % LABEL_STATE
    if state in ("pending", "rebooting"):
        return PENDING, "%s is %s: the layout is being applied" % (LABEL_STATE, state)
    return None


def decide(node: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """{ready, reason, message} for ``node`` (a Node object) and its ``declared`` layout
    (declared_layout()). Not ready names the first thing missing, as the condition's message."""
    failure = _failure(node)
    if failure:
        return {"ready": False, "reason": failure[0], "message": failure[1]}
    advertised = _advertised(node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    what = "layout %s (%s)" % (declared["name"], declared["source"].split(", ", 1)[-1])
    if not advertised:
        return _not("no device plugin advertises a GPU resource yet; declared %s" % what)
    want, whole, why = _expected(declared, advertised)
    if why:
        return _not("%s; declared %s" % (why, what))
    strategy = labels.get("nvidia.com/mig.strategy")
    total = sum(want.values())
    if strategy == "single":
        profiles = sorted(r[len(MIG_PREFIX) :] for r in want)
        product = labels.get("nvidia.com/gpu.product", "")
        if (
            advertised.get(WHOLE, 0) != total
            or len(profiles) > 1
            or (profiles and not product.endswith("-MIG-" + profiles[0]))
        ):
            return _not(
                "device plugin advertises %s: %d (MIG strategy single, product %s), declared "
                "%s of %s"
                % (
                    WHOLE,
                    advertised.get(WHOLE, 0),
                    product or "unlabelled",
                    _devices_text(dict((p, want[MIG_PREFIX + p]) for p in profiles)),
                    what,
                )
            )
        return _ready(what, want)
    for resource in sorted(set(want) | set(r for r in advertised if r.startswith(MIG_PREFIX))):
        if resource.endswith(".shared") or advertised.get(resource, 0) == want.get(resource, 0):
            continue
        return _not(
            "device plugin advertises %s: %d, declared %d (%s)"
            % (resource, advertised.get(resource, 0), want.get(resource, 0), what)
        )
    if advertised.get(WHOLE, 0) != whole:
        return _not(
            "device plugin advertises %s: %d, declared %d whole GPU%s (%s)"
            % (WHOLE, advertised.get(WHOLE, 0), whole, "" if whole == 1 else "s", what)
        )
    if want and not labels.get("nvidia.com/gpu.product"):
        return _not("GPU Feature Discovery has not labelled the node yet; declared %s" % what)
    for resource, count in sorted(want.items()):
        label = resource + ".count"
        if labels.get(label) is not None and _count(labels[label]) != count:
            return _not(
                "GPU Feature Discovery labels %s=%s, declared %d (%s)"
                % (label, labels[label], count, what)
            )
    return _ready(what, want)


def _not(message):
    return {"ready": False, "reason": NOT_ADVERTISED, "message": message}


def _ready(what, want):
    shown = ", ".join("%s: %d" % kv for kv in sorted(want.items())) or "no MIG device"
    return {
        "ready": True,
        "reason": READY,
        "message": "%s advertised: %s; no whole GPU left where MIG is declared" % (what, shown),
    }


def candidate(node: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """Whether the gate looks at this node: it carries the startup taint, or the GPU Operator's
    nvidia.com/mig.config label without the success state."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return has_taint(node, taint) or (
        bool(labels.get(LABEL_CONFIG)) and labels.get(LABEL_STATE) != "success"
    )


def verdicts(
    nodes: Any, taint: Any, pools: Any = None, hostvars: Any = None
) -> list[dict[str, Any]]:
    """One verdict per Node of ``nodes`` that carries the taint ``taint`` (key[=value]:effect) or
    the operator's label without success: {node, ready, reason, message, tainted, resource_version,
    basis (what the decision read, for mig_node_ready's guard), condition (the one it has)}. A
    wrong declaration is a verdict too (not ready, reason MIGLayoutInvalid, the message naming
    node, source and entry): the node stays tainted."""
    try:
        wanted = parse_taint(taint)
    except TaintError as e:
        raise MigReadyError(str(e))
    out = []
    for node in nodes or []:
        if not candidate(node, wanted):
            continue
        name = node["metadata"]["name"]
        host = None
        if hostvars is not None and name in hostvars:
            host = dict((pair[1], hostvars[name].get(pair[1])) for pair in HOST_KEYS)
        try:
            verdict = decide(node, declared_layout(node, pools, host))
        except MigReadyError as e:
            verdict = {"ready": False, "reason": INVALID, "message": str(e)}
        verdict.update(
            node=name,
            tainted=has_taint(node, wanted),
            resource_version=node["metadata"].get("resourceVersion"),
            basis=basis_of(node),
            condition=condition_of(node),
        )
        out.append(verdict)
    return out


def ready_cell(node: Mapping[str, Any] | None) -> str:
    """The fleet report's MIG-ready column: the condition's status and reason, '-' without one."""
    condition = condition_of(node)
    if not condition:
        return "-"
    return "%s (%s)" % (
        "yes" if condition.get("status") == "True" else "no",
        condition.get("reason") or "?",
    )


def _created(node, now):
    import datetime

    stamp = (node.get("metadata") or {}).get("creationTimestamp")
    try:
        when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
        return when.replace(tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return now


class GateTracker(object):
    """What the event source gpuops.mig.mig_ready knows of the Nodes: which the gate holds
    (candidate()), which of those changed since the last event (labels, annotations, advertised
    resources, taints), and which have been held longer than ``converge_seconds`` since they
    registered (each said once).
    """

    def __init__(self, taint: Mapping[str, str], converge_seconds: float = 300.0) -> None:
        self.taint = taint
        self.converge = float(converge_seconds)
        self.held: dict[str, dict[str, Any]] = {}
        self.changed: set[str] = set()
        self.last_change = 0.0

    def replace(self, nodes: list[dict[str, Any]], now: float) -> None:
        """A fresh listing: forget Nodes that are gone, look at every one listed."""
        names = set()
        for node in nodes:
            names.add(node["metadata"]["name"])
            self.apply("MODIFIED", node, now)
        for name in set(self.held) - names:
            self.held.pop(name)
            self.changed.discard(name)

    def apply(self, event_type: str, node: Mapping[str, Any], now: float) -> None:
        name = node["metadata"]["name"]
        if event_type == "DELETED" or not candidate(node, self.taint):
            self.held.pop(name, None)
            self.changed.discard(name)
            return
        basis = basis_of(node)
        seen = self.held.get(name)
        if seen is not None and seen["basis"] == basis:
            return
        self.held[name] = {
            "basis": basis,
            "since": seen["since"] if seen else _created(node, now),
            "overdue": seen["overdue"] if seen else False,
        }
        self.changed.add(name)
        self.last_change = now

    def due(self, now: float, settle: float) -> dict[str, Any] | None:
        """The event to emit now: {nodes: held Nodes changed (settled ``settle`` seconds), overdue:
        held Nodes past the convergence time, said once each, held_seconds: {node: seconds}}; None
        when none.
        """
        overdue = sorted(
            name
            for name, seen in self.held.items()
            if not seen["overdue"] and now - seen["since"] >= self.converge
        )
        settled = self.changed and now - self.last_change >= settle
        if not overdue and not settled:
            return None
        nodes = sorted((self.changed if settled else set()) | set(overdue))
        for name in overdue:
            self.held[name]["overdue"] = True
        if settled:
            self.changed = set()
        return {
            "nodes": nodes,
            "overdue": overdue,
            "held_seconds": dict((n, round(now - self.held[n]["since"], 1)) for n in nodes),
        }

    def wait(self, now: float, settle: float) -> float:
        """Seconds until due() may have something (at most 5)."""
        waits = [5.0]
        if self.changed:
            waits.append(self.last_change + settle - now)
        waits += [
            seen["since"] + self.converge - now
            for seen in self.held.values()
            if not seen["overdue"]
        ]
        return max(0.05, min(waits))


def bootstrap_layout(pools: Any, pool: Any, host: str) -> dict[str, Any]:
    """What the bootstrap (playbooks/bootstrap.yml) installs on ``host`` for its node pool
    ``pool``: {config | layouts, config_name, pool}, validated before anything changes.
    MigReadyError names the bake host, gpuops_mig_ready_pools and the entry."""
    where = "bake host %s" % host
    if _unset(pool):
        raise MigReadyError(
            "%s: no node pool: set gpuops_mig_pool, or have the cloud's bootstrap write "
            "its name to /etc/gpuops-mig/pool" % where
        )
    if not isinstance(pools, Mapping) or str(pool) not in pools:
        raise MigReadyError(
            "%s: gpuops_mig_pool %r names no pool of gpuops_mig_ready_pools; known: %s"
            % (where, pool, ", ".join(sorted(pools or {})) or "none")
        )
    entry = pools[str(pool)]
    source = "%s, gpuops_mig_ready_pools[%s]" % (where, pool)
    if not isinstance(entry, Mapping):
        raise MigReadyError("%s: a pool must be a mapping with node_labels and a layout" % source)
    settings = dict((k, entry.get(k)) for k in ("config", "config_file", "layouts", "config_name"))
    entries, name = _entries(settings, source, None)
    out = {"pool": str(pool), "config_name": None if settings.get("layouts") else name}
    if not _unset(settings.get("layouts")):
        out["layouts"] = settings["layouts"]
    elif not _unset(settings.get("config_file")):
        out["config"] = migparted.read_config_file(str(settings["config_file"]))
    else:
        out["config"] = settings["config"]
    return out
