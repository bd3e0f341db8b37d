# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes access a rollout needs, and the check that the run's identity has it.

ROLLOUT is what rbac/rollout.yml grants (a unit test holds the two equal; docs/rbac.md says why
each rule is there). A rollout checks it with SelfSubjectAccessReviews before its first change,
so a missing rule stops the batch with the verb and resource named, not half-way through a node.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

# (API group, resource, verbs); "" is the core group.
ROLLOUT: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "patch")),
    ("", "nodes/status", ("patch",)),
    ("", "pods", ("get", "list", "create", "patch", "delete")),
    ("", "pods/eviction", ("create",)),
    ("", "configmaps", ("get", "create", "patch")),
    ("", "events", ("get", "create", "patch")),
    ("apps", "daemonsets", ("get", "list")),
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
    ("resource.k8s.io", "resourceclaims", ("get", "list")),
    ("resource.k8s.io", "resourceslices", ("get", "list")),
    ("nvidia.com", "clusterpolicies", ("get", "list", "patch")),
    ("nvidia.com", "gpuclusters", ("get", "list", "patch")),
)
# Where a rule is needed in one namespace only, the review asks there: a Role there suffices.
EVENT_NAMESPACE = "default"


def reviews(
    rules: Iterable[tuple[str, str, Sequence[str]]], lease_namespace: str
) -> list[dict[str, Any]]:
    """The SelfSubjectAccessReview bodies for `rules` (leases in `lease_namespace`, events in
    the namespace the collection writes them to, the rest in every namespace)."""
    out = []
    for group, resource, verbs in rules:
        name, dummy, sub = resource.partition("/")
        namespace = {"leases": lease_namespace, "events": EVENT_NAMESPACE}.get(name, "")
        for verb in verbs:
            attributes = {"group": group, "resource": name, "verb": verb}
            if sub:
                attributes["subresource"] = sub
            if namespace:
                attributes["namespace"] = namespace
            out.append(
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes},
                }
            )
    return out


def describe(review: dict[str, Any]) -> str:
    """'create pods/eviction' or 'update leases.coordination.k8s.io in default'."""
    a = review["spec"]["resourceAttributes"]
    resource = a["resource"] + ("." + a["group"] if a["group"] else "")
    resource += "/" + a["subresource"] if a.get("subresource") else ""
    return f"{a['verb']} {resource}" + (f" in {a['namespace']}" if a.get("namespace") else "")


def missing(create: Callable[[dict[str, Any]], dict[str, Any]], lease_namespace: str) -> list[str]:
    """What of ROLLOUT the identity behind `create` (which posts a review and returns the answer)
    may not do, each as describe() names it."""
    out = []
    for review in reviews(ROLLOUT, lease_namespace):
        status = create(review).get("status") or {}
        if not status.get("allowed"):
            out.append(describe(review))
    return out


def message(gaps: Sequence[str]) -> str:
    """What a node whose rollout stops for `gaps` says (after its name)."""
    return (
        f"this run's Kubernetes identity may not {'; '.join(gaps)}. A rollout needs what "
        "rbac/rollout.yml grants (docs/rbac.md). Nothing was changed."
    )
