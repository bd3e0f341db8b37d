"""PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.

Strategic merge follows the rules of k8s.io/apimachinery/pkg/util/strategicpatch
for the lists below. The real server reads each list's strategy from the Go
struct tags; this emulator knows them by field name. Lists not named here are
atomic and replaced whole -- as on a real server for `tolerations`, `taints`,
`args`, `command` and `matchExpressions`.
"""

from __future__ import annotations

import copy

import jsonpatch

from .errors import ApiError, bad_request

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "ownerReferences": "uid",
    "conditions": "type",
    "addresses": "type",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "secrets": "name",
    # Container ports merge on containerPort, Service ports on port (chosen per list below).
    "ports": None,
}
PRIMITIVE_MERGE = {"finalizers"}

_DELETE = object()  # a `$patch: delete` map: the caller removes the key


def json_patch(target: dict, operations) -> dict:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(target, operations)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise ApiError(422, "Invalid", f"the request is invalid: {exc}") from exc


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: dict, patch: dict) -> dict:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    merged = _merge_map(target, patch)
    return {} if merged is _DELETE else merged


def _is_directive(key: str) -> bool:
    return key in ("$patch", "$retainKeys") or key.startswith(("$setElementOrder/", "$deleteFromPrimitiveList/"))


def _strip(value):
    """New content from a patch, without the directives that only steer merging."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not _is_directive(k) and v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if not (isinstance(v, dict) and v.get("$patch") in ("delete", "replace"))]
    return value


def _merge_map(target, patch: dict):
    action = patch.get("$patch")
    if action == "delete":
        return _DELETE
    if action == "replace":
        return _strip(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if _is_directive(key):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
    for key, order in patch.items():
        if key.startswith("$setElementOrder/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = _reorder(field, result[field], order)
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_key(field: str, items) -> str | None:
    if field not in MERGE_KEYS:
        return None
    if field == "ports":
        return "containerPort" if any(isinstance(i, dict) and "containerPort" in i for i in items) else "port"
    return MERGE_KEYS[field]


def _merge_list(field: str, target, patch: list) -> list:
    target = target if isinstance(target, list) else []
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return _strip(patch)
    if field in PRIMITIVE_MERGE:
        return target + [v for v in patch if v not in target]
    key = _merge_key(field, target + patch)
    if key is None:
        return _strip(patch)
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"strategic merge patch: an element of {field} lacks its merge key {key!r}")
        index = next((i for i, old in enumerate(result) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            result = [old for old in result if old.get(key) != item[key]]
        elif index is None:
            result.append(_strip(item))
        else:
            result[index] = _merge_map(result[index], item)
    return result


def _reorder(field: str, items: list, order: list) -> list:
    key = _merge_key(field, items)

    def ident(item):
        return item.get(key) if key and isinstance(item, dict) else item

    wanted = [ident(o) for o in order]
    listed = sorted((i for i in items if ident(i) in wanted), key=lambda i: wanted.index(ident(i)))
    return listed + [i for i in items if ident(i) not in wanted]
