# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Kueue Workloads as MIG demand for the planner (gpuops.mig.mig_plan, docs/planning.md).

Kueue (kueue.x-k8s.io, Workload in v1beta2, the stored version, and v1beta1, which has the same fields read
here; kubernetes-sigs/kueue apis/kueue/v1beta2/workload_types.go) holds a job back, suspended and without pods,
until its Workload is admitted. Such a Workload asks for devices no pod shows yet: each of its
``spec.podSets`` will run ``count`` pods of ``template``. Once ``Admitted`` is True the job's pods exist and
the planner counts them as pods, so only Workloads still waiting are read here:

- ``Admitted`` not True (``QuotaReserved`` may be True while admission checks are pending: still no pods),
- not ``Finished``, not being deleted, not deactivated (``spec.active: false`` is never admitted),
- not owned by a Pod: Kueue's pod integration makes Workloads for pods that exist already (gated by
  scheduling gates), and those pods are counted as pending pods.

Each waiting pod set becomes one pending pod manifest whose containers ask for the template's
``nvidia.com/*`` quantities times ``count`` (limits over requests, as the planner reads pods), with the
template's nodeSelector (the single strategy reads the profile from it). The planner's pod reading then applies
the MIG strategy and time-slicing to them as to any pending pod, so a Workload and a pod asking for the same
profile add up. A Workload that cannot be read (a count or a quantity that is not a whole number, a template
that is not a mapping) is skipped with a warning naming it; it never stops the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import describe

# What the planner counts: nvidia.com/mig-<profile>, nvidia.com/gpu and their .shared forms.
RESOURCE_PREFIX = "nvidia.com/"
# Kueue's PodSet.count is an int32.
_MAX_COUNT = 2 ** 31 - 1


class WorkloadError(ValueError):
    """One Workload that cannot be read; the message names the field."""


def pending_pods(workloads: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """(pod manifests, warnings) for the Workloads that wait for admission and ask for nvidia.com/ resources.

    workloads: the resources of kubernetes.core.k8s_info (kind Workload); None means Kueue is not installed.
    Each warning names the Workload it skipped and why."""
    pods, warnings = [], []
    for workload in workloads or ():
        name = workload_name(workload)
        try:
            pods.extend(_workload_pods(workload, name))
        except WorkloadError as e:
            warnings.append("Kueue Workload %s skipped, its demand is not counted: %s" % (name, e))
    return pods, warnings


def workload_name(workload: Any) -> str:
    meta = workload.get("metadata") if isinstance(workload, Mapping) else None
    if not isinstance(meta, Mapping):
        return "(without metadata)"
    return "%s/%s" % (_text(meta.get("namespace", "default")), _text(meta.get("name", "?")))


def waiting(workload: Any) -> bool:
    """Whether a Workload waits for admission (so its pods do not exist yet)."""
    meta = _mapping(workload, "metadata")
    if meta.get("deletionTimestamp"):
        return False
    owners = meta.get("ownerReferences") or []
    if not isinstance(owners, list):
        raise WorkloadError("metadata.ownerReferences must be a list, got %s" % describe(owners))
    if any(isinstance(o, Mapping) and o.get("kind") == "Pod" and o.get("apiVersion") == "v1" for o in owners):
        return False
    if _mapping(workload, "spec").get("active", True) is False:
        return False
    conditions = _mapping(workload, "status").get("conditions") or []
    if not isinstance(conditions, list):
        raise WorkloadError("status.conditions must be a list, got %s" % describe(conditions))
    true = set(c.get("type") for c in conditions if isinstance(c, Mapping) and c.get("status") == "True")
    return not true & {"Admitted", "Finished"}


def _workload_pods(workload, name):
    if not isinstance(workload, Mapping):
        raise WorkloadError("not a Workload manifest (a mapping), got %s" % describe(workload))
    if not waiting(workload):
        return []
    pod_sets = _mapping(workload, "spec").get("podSets")
    if not isinstance(pod_sets, list):
        raise WorkloadError("spec.podSets must be a list, got %s" % describe(pod_sets))
    meta = _mapping(workload, "metadata")
    namespace, workload_only = _text(meta.get("namespace", "default")), _text(meta.get("name", "?"))
    pods = []
    for index, pod_set in enumerate(pod_sets):
        if not isinstance(pod_set, Mapping):
            raise WorkloadError("spec.podSets[%d] must be a mapping, got %s" % (index, describe(pod_set)))
        where = "pod set %s" % _text(pod_set.get("name", index))
        count = pod_set.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_COUNT:
            raise WorkloadError("%s: count must be a whole number from 0 to %d, got %s"
                                % (where, _MAX_COUNT, describe(count)))
        spec = _mapping(_mapping(pod_set, "template", where), "spec", where + " template")
        asked = _asked(spec, where)
        if not asked or count == 0:
            continue
        pod_spec = {"containers": [{"name": "workload", "resources": {
            "limits": dict((resource, quantity * count) for resource, quantity in sorted(asked.items()))}}]}
        selector = spec.get("nodeSelector")
        if isinstance(selector, Mapping) and all(isinstance(v, str) for v in selector.values()):
            pod_spec["nodeSelector"] = dict(selector)
        # The planner names a pod by namespace/name in its report: this reads "Workload <ns>/<name> ...".
        pods.append({"metadata": {"namespace": "Workload " + namespace,
                                  "name": "%s (%s x%d)" % (workload_only, where, count)},
                     "spec": pod_spec, "status": {"phase": "Pending"}})
    return pods


def _asked(pod_spec, where):
    """{resource: quantity per pod} of nvidia.com/ resources over the template's containers."""
    containers = pod_spec.get("containers") or []
    if not isinstance(containers, list):
        raise WorkloadError("%s: template.spec.containers must be a list, got %s" % (where, describe(containers)))
    asked = {}
    for container in containers:
        if not isinstance(container, Mapping):
            raise WorkloadError("%s: a container must be a mapping, got %s" % (where, describe(container)))
        resources = _mapping(container, "resources", where)
        wanted = dict(_mapping(resources, "requests", where))
        wanted.update(_mapping(resources, "limits", where))      # the device plugin's limits win, as for pods
        for resource, quantity in wanted.items():
            if not isinstance(resource, str) or not resource.startswith(RESOURCE_PREFIX):
                continue
            number = checks.count(quantity) if isinstance(quantity, str) else quantity
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise WorkloadError("%s asks for %s %s, which is not a whole number"
                                    % (where, _text(resource), describe(quantity)))
            asked[resource] = asked.get(resource, 0) + number
    return dict((k, v) for k, v in asked.items() if v > 0)


def _mapping(obj, key, where=""):
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise WorkloadError("%s%s must be a mapping, got %s" % (where + ": " if where else "", key, describe(value)))
    return value


def _text(value):
    if isinstance(value, str) and value.isprintable() and 0 < len(value) <= 80:
        return value
    return describe(value)
