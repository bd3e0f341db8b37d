"""The emulator's Leases and Events as the real API server serves them, through the kubernetes Python client:
optimistic concurrency on metadata.resourceVersion (409 Conflict and AlreadyExists with the API server's Status
body, 422 for a Lease PUT without one) and Events about a Node found by field selector, as kubectl describe
finds them."""

import json

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from tests.support.kubeapi import seed

STALE = ('Operation cannot be fulfilled on leases.coordination.k8s.io "gpuops-mig-n1": the object has been '
         "modified; please apply your changes to the latest version and try again")


def lease(name, holder, rv=None, duration=60):
    metadata = {"name": name, "namespace": "default"}
    if rv:
        metadata["resourceVersion"] = rv
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration}}


def failure(call, *args, **kwargs):
    with pytest.raises(ApiException) as raised:
        call(*args, **kwargs)
    return raised.value.status, json.loads(raised.value.body)


def test_lease_writes_carry_the_resource_version_they_read(kube_api):
    api_client = k8s_config.new_client_from_config(kube_api.kubeconfig)
    leases = k8s_client.CoordinationV1Api(api_client)
    created = leases.create_namespaced_lease("default", lease("gpuops-mig-n1", "run-a"))
    first_rv = created.metadata.resource_version

    status, body = failure(leases.create_namespaced_lease, "default", lease("gpuops-mig-n1", "run-b"))
    assert status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'leases.coordination.k8s.io "gpuops-mig-n1" already exists'

    renewed = leases.replace_namespaced_lease("gpuops-mig-n1", "default", lease("gpuops-mig-n1", "run-a", first_rv, 61))
    assert renewed.metadata.resource_version != first_rv

    # The second writer read before the first one wrote: its update with the old resourceVersion loses.
    status, body = failure(leases.replace_namespaced_lease, "gpuops-mig-n1", "default",
                           lease("gpuops-mig-n1", "run-b", first_rv))
    assert (status, body["kind"], body["status"], body["reason"], body["code"]) == (409, "Status", "Failure", "Conflict", 409)
    assert body["message"] == STALE
    assert body["details"] == {"name": "gpuops-mig-n1", "group": "coordination.k8s.io", "kind": "leases"}
    status, body = failure(leases.patch_namespaced_lease, "gpuops-mig-n1", "default",
                           {"metadata": {"resourceVersion": first_rv}, "spec": {"holderIdentity": "run-b"}})
    assert (status, body["reason"]) == (409, "Conflict")
    # A Lease is never updated blindly (its strategy allows no unconditional update); a patch without
    # a resourceVersion applies to the stored object.
    status, body = failure(leases.replace_namespaced_lease, "gpuops-mig-n1", "default", lease("gpuops-mig-n1", "run-b"))
    assert (status, body["reason"]) == (422, "Invalid")
    assert "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update" in body["message"]
    assert kube_api.get("Lease", "gpuops-mig-n1")["spec"]["holderIdentity"] == "run-a"
    # A delete with a stale precondition loses too.
    status, body = failure(leases.delete_namespaced_lease, "gpuops-mig-n1", "default",
                           body=k8s_client.V1DeleteOptions(preconditions=k8s_client.V1Preconditions(
                               resource_version=first_rv)))
    assert (status, body["reason"]) == (409, "Conflict")
    leases.delete_namespaced_lease("gpuops-mig-n1", "default", body=k8s_client.V1DeleteOptions(
        preconditions=k8s_client.V1Preconditions(resource_version=renewed.metadata.resource_version)))
    assert kube_api.find("Lease", "gpuops-mig-n1") is None
    status, body = failure(leases.read_namespaced_lease, "gpuops-mig-n1", "default")
    assert (status, body["message"]) == (404, 'leases.coordination.k8s.io "gpuops-mig-n1" not found')


def test_events_about_a_node_by_field_selector(kube_api):
    kube_api.seed(seed.node("n1"), seed.node("n2"))
    core = k8s_client.CoreV1Api(k8s_config.new_client_from_config(kube_api.kubeconfig))
    for node, reason in (("n1", "MigReconfigureFailed"), ("n2", "MigReconfigured")):
        core.create_namespaced_event("default", {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": "%s.x" % node},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason, "message": "m", "type": "Normal"})
    found = core.list_namespaced_event("default", field_selector="involvedObject.kind=Node,involvedObject.name=n1")
    assert [e.reason for e in found.items] == ["MigReconfigureFailed"]
