"""Deprecated filters (meta/runtime.yml plugin_routing): the routing and each filter's documentation agree, and
nothing the collection ships still calls one (a playbook of ours must not print a deprecation warning)."""

import glob
import os
import re

import yaml

from ansible_collections.gpuops.mig.plugins.filter import node_decision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def runtime():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        return yaml.safe_load(handle)


def deprecated_filters():
    routing = (runtime().get("plugin_routing") or {}).get("filter") or {}
    return dict((name, entry["deprecation"]) for name, entry in routing.items() if "deprecation" in entry)


def test_the_unused_filters_are_deprecated_for_removal_in_1_0_0():
    found = deprecated_filters()
    assert sorted(found) == ["mig_config_from_configmaps", "mig_node_decision", "mig_operator_view"]
    assert set(entry["removal_version"] for entry in found.values()) == {"1.0.0"}
    assert set(found) <= set(node_decision.FilterModule().filters())      # still there until then


def test_each_deprecated_filter_documents_its_deprecation_as_the_routing_does():
    for name, entry in deprecated_filters().items():
        with open(os.path.join(ROOT, "plugins", "filter", name + ".yml")) as handle:
            documented = yaml.safe_load(handle)["DOCUMENTATION"]
        assert documented["deprecated"]["removed_in"] == entry["removal_version"], name
        assert documented["deprecated"]["why"] and documented["deprecated"]["alternative"], name


def test_nothing_the_collection_ships_calls_a_deprecated_filter():
    pattern = re.compile(r"\b(?:gpuops\.mig\.)?(%s)\b *\(" % "|".join(deprecated_filters()))
    callers = []
    for path in glob.glob(os.path.join(ROOT, "roles", "**", "*.yml"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True):
        with open(path) as handle:
            callers += ["%s: %s" % (os.path.relpath(path, ROOT), m) for m in pattern.findall(handle.read())]
    assert callers == []
