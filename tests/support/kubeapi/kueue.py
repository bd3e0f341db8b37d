"""Kueue's Workloads, served as the custom resource Kueue installs (kueue.x-k8s.io).

What is followed (kubernetes-sigs/kueue):

- config/components/crd/bases/kueue.x-k8s.io_workloads.yaml: the CRD workloads.kueue.x-k8s.io, namespaced,
  versions v1beta2 (stored) and v1beta1 (served), a status subresource. The API server serves
  both (no conversion webhook: only apiVersion changes), v1beta2 preferred, and only while the CRD
  exists: without it discovery does not list the group and kubernetes.core.k8s_info answers
  api_found false, as on a cluster without Kueue.
- apis/kueue/v1beta2/workload_types.go: spec.podSets[] (name, count, template: a PodTemplateSpec),
  spec.queueName, spec.active, and status.conditions of the types QuotaReserved, Admitted, Finished and
  Evicted. `workload()` builds one as Kueue's job integration does for a suspended Job: owned by the Job,
  no pods.

Not modelled: Kueue's controllers (queues, quota reservation, admission checks, unsuspending the job and the
pods it then creates), the pod integration's gated pods, conversion between versions, validation webhooks
and the printer columns. A test writes the status conditions it needs.
"""

from __future__ import annotations

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
CRD = "workloads." + GROUP


def crd() -> dict:
    names = {"kind": "Workload", "listKind": "WorkloadList", "plural": "workloads", "singular": "workload",
             "shortNames": ["wl"], "categories": ["kueue"]}
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD, "labels": {"app.kubernetes.io/name": "kueue"}},
        "spec": {"group": GROUP, "scope": "Namespaced", "names": names,
                 "versions": [{"name": name, "served": True, "storage": name == VERSION,
                               "subresources": {"status": {}}, "schema": schema}
                              for name in ("v1beta1", VERSION)]},
        "status": {"acceptedNames": names, "storedVersions": [VERSION],
                   "conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}]},
    }


def pod_set(name: str, count: int, requests: dict) -> dict:
    """A pod set of `count` pods whose one container requests `requests` (limits equal, as for extended
    resources)."""
    return {"name": name, "count": count, "template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": name, "image": "registry.example/train:1",
                        "resources": {"requests": dict(requests), "limits": dict(requests)}}]}}}


def workload(name: str, pod_sets: list, *, namespace: str = "default", queue: str = "team",
             admitted: bool = False) -> dict:
    """A Workload for a suspended Job `name`: waiting (QuotaReserved False, reason Pending) or admitted."""
    condition = "True" if admitted else "False"
    conditions = [{"type": "QuotaReserved", "status": condition, "reason": "QuotaReserved" if admitted else "Pending",
                   "message": "" if admitted else "couldn't assign flavors to pod set main",
                   "lastTransitionTime": "2026-11-25T08:00:00Z"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
                           "lastTransitionTime": "2026-11-25T08:00:00Z"})
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload",
        "metadata": {"name": f"job-{name}", "namespace": namespace, "labels": {"kueue.x-k8s.io/job-uid": name},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": f"uid-{name}", "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"queueName": queue, "active": True, "podSets": list(pod_sets)},
        "status": {"conditions": conditions},
    }
