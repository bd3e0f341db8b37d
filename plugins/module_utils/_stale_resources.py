# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which MIG resources a Node still lists at zero after a layout change
(gpuops.mig.mig_node_stale_resources removes them).

When the device plugin stops advertising a resource (a MIG profile the new layout no longer has,
or its ``.shared`` name after the sharing changed), the kubelet keeps it in the Node's
status.capacity and status.allocatable at 0 until the node restarts (k8s-device-plugin #214,
#240). Some schedulers count such a resource as one the node serves (KAI scheduler #1120).
Removing it from the status subresource is what that restart would do. Each removal is guarded by
a ``test`` of the value read, so a resource advertised again meanwhile makes the API server refuse
the whole patch (422) instead of losing it. Private to the collection; no Ansible imports.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
FIELDS = ("capacity", "allocatable")


class StaleResourcesError(ValueError):
    """The input is not a Node and an expected advertisement."""


def _count(value):
    """A quantity as the API server writes it ("0", "4"), or None for anything else."""
    return checks.count(value)


def promised(expected: Any) -> dict:
    """The resources ``expected`` (mig_expected_advertisement) promises: the module checks them
    before it reads the Node."""
    if not isinstance(expected, dict) or not isinstance(expected.get("resources"), dict):
        raise StaleResourcesError("expected must be the result of mig_expected_advertisement, "
                                  "with its resources")
    return expected["resources"]


def stale_resources(node: Any, expected: Any) -> list[str]:
    """Sorted names of the MIG resources (nvidia.com/mig-*, .shared names included) that the Node
    lists in status.capacity or status.allocatable at 0 in each field that has them, and that
    ``expected`` (mig_expected_advertisement) does not promise. A resource with devices left in
    either field (an unhealthy device keeps its capacity) is never stale."""
    if not isinstance(node, dict):
        raise StaleResourcesError("a Node object was expected, not %s" % type(node).__name__)
    resources = promised(expected)
    status = node.get("status") or {}
    fields = [status.get(field) or {} for field in FIELDS]
    names = set(name for field in fields for name in field
                if str(name).startswith(MIG_RESOURCE_PREFIX))
    return sorted(name for name in names if name not in resources
                  and all(_count(field[name]) == 0 for field in fields if name in field))


def _pointer(field, name):
    """The JSON pointer (RFC 6901) of status.<field>[name]: "/" is written "~1", "~" "~0"."""
    return "/status/%s/%s" % (field, name.replace("~", "~0").replace("/", "~1"))


def removal_patch(node: Any, expected: Any) -> tuple[list[dict], list[str]]:
    """(operations, removed): the JSON patch of the Node's status that removes its stale resources
    (stale_resources), each removal guarded by a test of the value read."""
    removed = stale_resources(node, expected)
    status = node.get("status") or {}
    operations = []
    for name in removed:
        for field in FIELDS:
            if name in (status.get(field) or {}):
                operations.append({"op": "test", "path": _pointer(field, name),
                                   "value": status[field][name]})
                operations.append({"op": "remove", "path": _pointer(field, name)})
    return operations, removed
