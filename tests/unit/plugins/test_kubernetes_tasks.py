"""Every Kubernetes call of the roles and playbooks is bounded, and none puts a cluster object
that may hold credentials into job output (issue 37): each kubernetes.core task of the mig_node
role has a task timeout, and each task that reads or writes Pods, DaemonSets or ConfigMaps is
no_log."""

import glob
import os

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
K8S = ("kubernetes.core.k8s", "kubernetes.core.k8s_info", "kubernetes.core.k8s_drain")
SECRET_KINDS = ("Pod", "DaemonSet", "ConfigMap")


def tasks(path):
    """(file, task) for every task of a task file or playbook, blocks opened."""

    def walk(items):
        for item in items or ():
            if not isinstance(item, dict):
                continue
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks"):
                yield from walk(item.get(key))
            yield item

    with open(path) as handle:
        yield from ((os.path.relpath(path, ROOT), task) for task in walk(yaml.safe_load(handle)))


def kubernetes_tasks(pattern):
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        for where, task in tasks(path):
            module = next((name for name in K8S if name in task), None)
            if module:
                yield where, task, module, task[module] or {}


def handles_secret_kinds(args):
    kind = str(args.get("kind") or "")
    definition = str(args.get("definition") or "")
    # A templated definition (the pods to evict, the plugin pods to restart) is Pods; a literal one
    # names its kind.
    return (
        kind in SECRET_KINDS
        or any(k in definition for k in SECRET_KINDS)
        or ("{{" in definition and "Node" not in kind and "event" not in definition.lower())
    )


@pytest.mark.parametrize(
    "where, task, module, args",
    list(kubernetes_tasks("roles/mig_node/tasks/*.yml")),
    ids=lambda value: value if isinstance(value, str) and value.endswith(".yml") else "",
)
def test_each_kubernetes_call_of_the_node_workflow_has_a_timeout(where, task, module, args):
    assert "timeout" in task, "%s: %r has no task timeout" % (where, task.get("name"))


@pytest.mark.parametrize(
    "pattern", ["roles/*/tasks/*.yml", "playbooks/*.yml", "playbooks/tasks/*.yml"]
)
def test_tasks_that_read_or_write_pods_daemonsets_or_configmaps_are_no_log(pattern):
    leaking = [
        "%s: %s" % (where, task.get("name"))
        for where, task, module, args in kubernetes_tasks(pattern)
        if handles_secret_kinds(args)
        and task.get("no_log") is not True
        and "smoke" not in str(task.get("name")).lower()
    ]  # the smoke pods are the role's own
    assert leaking == []
