"""mig_node_stale_resources decides on the Node it reads which MIG resources are stale
(plugins/modules/mig_node_stale_resources.py; the decision in module_utils/_stale_resources.py)."""

import types

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError

from ansible_collections.gpuops.mig.plugins.modules import mig_node_stale_resources as module

OLD, NEW = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
EXPECTED = {"resources": {NEW: 2}, "labels": {}}


class FakeNodes(object):
    """The dynamic client's Node resource: each get returns the next status, each patch is kept
    (or refused with ``refuse`` as the API server's status)."""

    def __init__(self, *statuses, refuse=()):
        self.statuses, self.refuse, self.patches = list(statuses), list(refuse), []
        self.status = "nodes/status"
        self.client = self

    def get(self, name):
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        node = {"metadata": {"name": name}, "status": {"capacity": dict(status),
                                                       "allocatable": dict(status)}}
        return types.SimpleNamespace(to_dict=lambda: node)

    def patch(self, resource, body, name, content_type):
        self.patches.append(body)
        if self.refuse:
            raise DynamicApiError(ApiException(status=self.refuse.pop(0), reason="refused"))


def test_the_resources_the_layout_does_not_promise_are_removed_at_zero():
    nodes = FakeNodes({"cpu": "16", OLD: "0", OLD + ".shared": "0", NEW: "2"})
    assert module.remove_stale(nodes, "gpu-1", EXPECTED, False) == [OLD, OLD + ".shared"]
    removed = [op["path"] for op in nodes.patches[0] if op["op"] == "remove"]
    assert "/status/capacity/nvidia.com~1mig-1g.10gb" in removed and len(removed) == 4


def test_check_mode_reads_and_says_what_it_would_remove_without_a_patch():
    nodes = FakeNodes({OLD: "0", NEW: "2"})
    assert module.remove_stale(nodes, "gpu-1", EXPECTED, True) == [OLD]
    assert nodes.patches == []


def test_nothing_stale_writes_nothing():
    nodes = FakeNodes({NEW: "2", OLD: "1"})       # devices left on OLD: not stale
    assert module.remove_stale(nodes, "gpu-1", EXPECTED, False) == []
    assert nodes.patches == []


def test_a_refused_guard_reads_the_node_and_decides_again():
    # The device plugin advertised OLD again between the read and the patch.
    nodes = FakeNodes({OLD: "0", NEW: "2"}, {OLD: "1", NEW: "2"}, refuse=[422])
    assert module.remove_stale(nodes, "gpu-1", EXPECTED, False) == []
    assert len(nodes.patches) == 1


def test_other_api_errors_are_raised_and_endless_refusals_give_up():
    with pytest.raises(DynamicApiError):
        module.remove_stale(FakeNodes({OLD: "0"}, refuse=[403]), "gpu-1", EXPECTED, False)
    with pytest.raises(RuntimeError, match="changed under this run 5 times"):
        module.remove_stale(FakeNodes({OLD: "0"}, refuse=[422] * 5), "gpu-1", EXPECTED, False)


def test_an_expected_without_resources_is_refused_before_any_request(run_module):
    result = run_module(module, {"name": "gpu-1", "expected": {"labels": {}}})
    assert result["failed"]
    assert "expected must be the result of mig_expected_advertisement" in result["msg"]
