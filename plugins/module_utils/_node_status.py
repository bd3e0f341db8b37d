# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The MIG-ready gate on a Node: its startup taint and its condition (gpuops.mig.mig_node_ready).

Private to the collection; no Ansible imports.
"""

from __future__ import annotations

from typing import Any, Mapping

# A node registers with the startup taint (kubelet --register-with-taints, Karpenter
# startupTaints); the collection lifts it only once the node's declared MIG layout is applied and
# advertised, and says why not in the condition CONDITION_TYPE otherwise (gpuops.mig.mig_node_ready
# writes both).

CONDITION_TYPE = "gpuops.mig/MIGReady"
DEFAULT_TAINT = "gpuops.mig/not-ready:NoSchedule"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"


class TaintError(ValueError):
    """A taint that Kubernetes would refuse."""


def parse_taint(text: Any, what: str = "gpuops_mig_ready_taint") -> dict[str, str]:
    """{key, value, effect} of 'key[=value]:effect', checked as the API server checks a taint: the
    key a qualified name (an optional DNS subdomain prefix of at most 253 characters, '/', a name
    of at most 63), the value a label value, the effect one of TAINT_EFFECTS. TaintError names
    ``what`` and why."""
    import re
    if not isinstance(text, str) or ":" not in text:
        raise TaintError("%s: %r is not a taint; write key[=value]:effect, such as %s"
                         % (what, text, DEFAULT_TAINT))
    body, effect = text.rsplit(":", 1)
    key, dummy, value = body.partition("=")
    if effect not in TAINT_EFFECTS:
        raise TaintError("%s: %r has effect %r; a taint's effect is one of %s"
                         % (what, text, effect, ", ".join(TAINT_EFFECTS)))
    prefix, dummy, name = key.rpartition("/")
    bad = None
    if not re.fullmatch(_NAME, name) or len(name) > 63:
        bad = "its name %r must be at most 63 letters, digits, '-', '_' or '.', starting and " \
              "ending with a letter or digit" % name
    elif "/" in key and (len(prefix) > 253 or not all(
            re.fullmatch(_DNS_LABEL, part) for part in prefix.split("."))):
        bad = "its prefix %r must be a lowercase DNS subdomain" % prefix
    elif value and (len(value) > 63 or not re.fullmatch(_NAME, value)):
        bad = "its value %r must be a label value (at most 63 characters)" % value
    if bad:
        raise TaintError("%s: %r is not a valid Kubernetes taint: %s" % (what, text, bad))
    return {"key": key, "value": value, "effect": effect}


def _ours(taint: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    return taint.get("key") == wanted["key"] and taint.get("effect") == wanted["effect"]


def has_taint(node: Mapping[str, Any] | None, wanted: Mapping[str, str]) -> bool:
    return any(_ours(t, wanted) for t in ((node or {}).get("spec") or {}).get("taints") or [])


def taint_patch(
    node: Mapping[str, Any], wanted: Mapping[str, str], present: bool
) -> list[dict[str, Any]]:
    """The JSON patch that adds (present) or removes the taint, guarded by a test of the taints
    read: a taint list changed in between makes the API server refuse it (422). [] when nothing
    changes."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    if has_taint(node, wanted) == present:
        return []
    if present:
        new = taints + [dict((k, v) for k, v in wanted.items() if v)]
    else:
        new = [t for t in taints if not _ours(t, wanted)]
    if not taints:
        return [{"op": "add", "path": "/spec/taints", "value": new}]
    return [{"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": new}]


def condition_of(
    node: Mapping[str, Any] | None, kind: str = CONDITION_TYPE
) -> dict[str, Any] | None:
    for condition in ((node or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def condition_patch(node: Mapping[str, Any], ready: bool, reason: str, message: str, now: str
                    ) -> list[dict[str, Any]]:
    """The JSON patch of the status subresource that sets the MIG-ready condition (the transition
    time kept while the status stays), guarded by a test of the conditions read. [] when it already
    says so."""
    conditions = list((node.get("status") or {}).get("conditions") or [])
    status = "True" if ready else "False"
    old = condition_of(node)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
        status, reason, message
    ):
        return []
    new = {"type": CONDITION_TYPE, "status": status, "reason": reason, "message": message,
           "lastHeartbeatTime": now,
           "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status
           and old.get("lastTransitionTime") else now}
    if not conditions:
        return [{"op": "add", "path": "/status/conditions", "value": [new]}]
    index = next((i for i, c in enumerate(conditions) if c.get("type") == CONDITION_TYPE), None)
    test = {"op": "test", "path": "/status/conditions", "value": conditions}
    if index is None:
        return [test, {"op": "add", "path": "/status/conditions/-", "value": new}]
    return [test, {"op": "replace", "path": "/status/conditions/%d" % index, "value": new}]


def basis_of(node: Mapping[str, Any] | None) -> str:
    """A digest of what the MIG-ready decision reads from a Node (labels, annotations, the
    nvidia.com resources it advertises, its taints): a lift decided on one read is refused once any
    has changed."""
    import hashlib
    import json
    node = node or {}
    meta = node.get("metadata") or {}
    allocatable = ((node.get("status") or {}).get("allocatable")) or {}
    seen = {"labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {},
            "allocatable": dict((k, v) for k, v in allocatable.items()
                                if k.startswith("nvidia.com/")),
            "taints": (node.get("spec") or {}).get("taints") or []}
    return hashlib.sha256(json.dumps(seen, sort_keys=True, default=str).encode()).hexdigest()[:16]
