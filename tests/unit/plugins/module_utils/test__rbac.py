"""The rollout's RBAC rules: one list in Python, the same in the shipped manifest."""

import os

import yaml

from ansible_collections.gpuops.mig.plugins.module_utils import _rbac as rbac

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def test_the_shipped_clusterrole_grants_exactly_what_the_check_asks():
    with open(os.path.join(REPO, "rbac", "rollout.yml"), encoding="utf-8") as f:
        role = yaml.safe_load(f)
    shipped = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    checked = {
        (group, resource, verb) for group, resource, verbs in rbac.ROLLOUT for verb in verbs
    }
    assert shipped == checked


def test_reviews_ask_leases_and_events_in_their_namespace_and_the_rest_everywhere():
    reviews = rbac.reviews(rbac.ROLLOUT, "gpu-leases")
    by_name = {rbac.describe(r): r["spec"]["resourceAttributes"] for r in reviews}
    assert by_name["update leases.coordination.k8s.io in gpu-leases"]["namespace"] == "gpu-leases"
    assert by_name["create events in default"]["namespace"] == "default"
    assert by_name["create pods/eviction"] == {
        "group": "",
        "resource": "pods",
        "verb": "create",
        "subresource": "eviction",
    }
    assert len(reviews) == sum(len(rule[2]) for rule in rbac.ROLLOUT)


def test_missing_names_each_refused_verb_and_the_message_says_nothing_changed():
    refused = {"patch pods", "create pods/eviction"}
    gaps = rbac.missing(
        lambda body: {"status": {"allowed": rbac.describe(body) not in refused}}, "default"
    )
    assert gaps == ["patch pods", "create pods/eviction"]
    text = rbac.message(gaps)
    assert "may not patch pods; create pods/eviction." in text and "Nothing was changed" in text
