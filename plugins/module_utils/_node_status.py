# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The JSON patch that removes zero-count extended resources from a Node's status (gpuops.mig.mig_node_stale_resources).

The kubelet keeps a resource its device plugin no longer advertises in status.capacity and status.allocatable
at 0 until the node restarts; removing it from the status subresource is what that restart would do. Each
removal is guarded by a ``test`` of the value read, so that a resource a device plugin advertises again
meanwhile makes the API server refuse the whole patch instead of losing it. Private to the collection; no
Ansible imports.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

FIELDS = ("capacity", "allocatable")


def _pointer(field, name):
    """The JSON pointer (RFC 6901) of status.<field>[name]: "/" in a name is written "~1", "~" is "~0"."""
    return "/status/%s/%s" % (field, name.replace("~", "~0").replace("/", "~1"))


def removal_patch(node: Mapping[str, Any] | None, names: Iterable[str]
                  ) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(operations, removed, kept) for removing ``names`` from the Node's status. A name is removed only where
    every field that lists it says 0; one with devices (or an odd quantity) in either field is kept."""
    status = (node or {}).get("status") or {}
    operations, removed, kept = [], [], []
    for name in sorted(set(names)):
        where = [field for field in FIELDS if name in (status.get(field) or {})]
        if not where:
            continue
        if any(str(status[field][name]).strip() != "0" for field in where):
            kept.append(name)
            continue
        for field in where:
            operations.append({"op": "test", "path": _pointer(field, name), "value": status[field][name]})
            operations.append({"op": "remove", "path": _pointer(field, name)})
        removed.append(name)
    return operations, removed, kept
