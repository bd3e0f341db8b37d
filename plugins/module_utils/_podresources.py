# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pod holds which NVIDIA device on this node, from the kubelet's PodResources API.

One gRPC call, ``v1.PodResourcesLister/List``, on the kubelet's unix socket. The answer lists every
active pod's containers and the device IDs device plugins gave them. NVIDIA's device plugin names
devices by UUID: ``MIG-...`` for a MIG device, ``GPU-...`` for a whole GPU, and under time-slicing a
replica ``<UUID>::<n>``, so each replica a container holds is one allocation of that UUID.

grpcio and protobuf are optional on managed hosts: they are imported only when a socket is there,
and every way the read can fail (no socket, refused, no answer in time, an answer that does not
decode, no grpcio) comes back as a sentence in ``allocations_error``, never as an exception; the
caller then knows nothing about pods and falls back to treating the whole node as in use.

Private to the collection; no Ansible imports. The messages are _podresources_api_pb2 (generated
from _podresources_api.proto by scripts/gen-podresources.sh), which needs protobuf 7.35 or later; with
an older protobuf (3.20 on) the same messages are built at run time from the same descriptor.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Iterable, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils._errors import AllocationsUnreadable

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
SOURCE = "podresources"
TIMEOUT = 5.0                             # seconds for connecting and answering together
MAX_MESSAGE = 16 * 1024 * 1024            # what the kubelet's own client accepts (podresources.DefaultMaxMsgSize)
DEVICE_PREFIXES = ("MIG-", "GPU-")
REPLICA_SEPARATOR = "::"                  # NVIDIA's device plugin: <UUID>::<replica> under time-slicing


def read_allocations(socket_path: str = DEFAULT_SOCKET, timeout: float = TIMEOUT) -> dict[str, Any]:
    """``{"allocations", "allocations_source", "allocations_error"}`` for this node.

    allocations: per device ID a container holds, ``{"device_uuid", "namespace", "pod", "container",
    "resource"}`` (the UUID without a replica suffix); None when the API could not be read, and then
    allocations_error says why and allocations_source is None.
    """
    try:
        answer = list_pod_resources(socket_path, timeout)
    except AllocationsUnreadable as e:
        return {"allocations": None, "allocations_source": None, "allocations_error": str(e)}
    return {"allocations": allocations_from(answer), "allocations_source": SOURCE, "allocations_error": None}


def split_device_id(device_id: str) -> tuple[str | None, int | None]:
    """``(UUID, replica)`` of an NVIDIA device plugin's device ID (replica None without a suffix);
    ``(None, None)`` for an ID that names no NVIDIA GPU or MIG device."""
    uuid, _sep, replica = device_id.partition(REPLICA_SEPARATOR)
    if not uuid.startswith(DEVICE_PREFIXES):
        return None, None
    return uuid, checks.count(replica)


def allocations_from(answer: Any) -> list[dict[str, str]]:
    """The allocations in a ListPodResourcesResponse, in the order the kubelet lists them."""
    out = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    uuid = split_device_id(device_id)[0]
                    if uuid is not None:
                        out.append({"device_uuid": uuid, "namespace": pod.namespace, "pod": pod.name,
                                    "container": container.name, "resource": devices.resource_name})
    return out


def holder(allocation: Mapping[str, Any]) -> str:
    """One holder as ``namespace/pod/container`` (what ComputeInstance.pods carries); ``namespace/pod`` for a
    DRA claim's, which belongs to the pod (_dra_claims)."""
    if not allocation.get("container"):
        return "%s/%s" % (allocation["namespace"], allocation["pod"])
    return "%s/%s/%s" % (allocation["namespace"], allocation["pod"], allocation["container"])


def holders_by_device(allocations: Iterable[Mapping[str, Any]] | None) -> dict[str, tuple[str, ...]]:
    """{UUID: sorted tuple of distinct holders}; a container holding several replicas is one holder."""
    found = {}
    for allocation in allocations or ():
        found.setdefault(allocation["device_uuid"], set()).add(holder(allocation))
    return dict((uuid, tuple(sorted(names))) for uuid, names in found.items())


def list_pod_resources(socket_path: str, timeout: float = TIMEOUT) -> Any:
    """The kubelet's ListPodResourcesResponse; AllocationsUnreadable with the reason otherwise."""
    where = "the kubelet's PodResources socket %s" % socket_path
    try:
        mode = os.stat(socket_path).st_mode
    except (OSError, ValueError) as e:   # ValueError: a NUL in the path
        raise AllocationsUnreadable(
            "%s cannot be used: %s. No kubelet on this host, or it keeps its root directory"
            " elsewhere: set mig_node_pod_resources_socket (the modules' pod_resources_socket)"
            % (where, getattr(e, "strerror", None) or e))
    if not stat.S_ISSOCK(mode):
        raise AllocationsUnreadable("%s is not a unix socket" % where)
    grpc, messages = _import_grpc()
    channel = grpc.insecure_channel("unix://" + os.path.abspath(socket_path),
                                    options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                             ("grpc.enable_retries", 0),
                                             # a fresh connection, not one an earlier read left in the process
                                             ("grpc.use_local_subchannel_pool", 1)])
    try:
        call = channel.unary_unary(LIST_METHOD, request_serializer=messages.ListPodResourcesRequest.SerializeToString,
                                   response_deserializer=messages.ListPodResourcesResponse.FromString)
        return call(messages.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        raise AllocationsUnreadable(_rpc_failure(where, e, timeout))
    finally:
        channel.close()


def _import_grpc():
    try:
        import grpc
        import google.protobuf  # noqa: F401  pylint: disable=unused-import
    except ImportError as e:
        raise AllocationsUnreadable("the Python packages grpcio and protobuf are needed on the host to read which "
                                    "pods hold which GPU devices: %s" % e)
    try:
        from ansible_collections.gpuops.mig.plugins.module_utils import _podresources_api_pb2 as messages
    except Exception:  # pylint: disable=broad-except
        # The generated module wants protobuf 7.35 or later (ImportError or VersionError before that);
        # an older protobuf (Debian 12's 3.21, say) gets the same messages built from the same descriptor.
        messages = _messages_from_descriptor()
    return grpc, messages


# _podresources_api_pb2's serialized FileDescriptorProto (a unit test keeps the two equal).
_DESCRIPTOR = (
    b'\n\x17_podresources_api.proto\x12\x02v1"\x19\n\x17ListPodResourcesRequest"C\n\x18ListPodResource'
    b'sResponse\x12\'\n\rpod_resources\x18\x01 \x03(\x0b2\x10.v1.PodResources"[\n\x0cPodResources\x12\x0c'
    b'\n\x04name\x18\x01 \x01(\t\x12\x11\n\tnamespace\x18\x02 \x01(\t\x12*\n\ncontainers\x18\x03 \x03('
    b'\x0b2\x16.v1.ContainerResources"I\n\x12ContainerResources\x12\x0c\n\x04name\x18\x01 \x01(\t\x12%'
    b'\n\x07devices\x18\x02 \x03(\x0b2\x14.v1.ContainerDevices"=\n\x10ContainerDevices\x12\x15\n\rreso'
    b'urce_name\x18\x01 \x01(\t\x12\x12\n\ndevice_ids\x18\x02 \x03(\t2Y\n\x12PodResourcesLister\x12C\n'
    b'\x04List\x12\x1b.v1.ListPodResourcesRequest\x1a\x1c.v1.ListPodResourcesResponse"\x00b\x06proto3'
)


def _messages_from_descriptor():
    """The two messages of List, built at run time from _DESCRIPTOR in a private descriptor pool."""
    try:
        from google.protobuf import descriptor_pool, message_factory
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(_DESCRIPTOR)
        make = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
        return _Messages(make(pool.FindMessageTypeByName("v1.ListPodResourcesRequest")),
                         make(pool.FindMessageTypeByName("v1.ListPodResourcesResponse")))
    except Exception as e:  # pylint: disable=broad-except
        raise AllocationsUnreadable("the protobuf package on the host cannot build the PodResources messages: "
                                    "%s: %s" % (type(e).__name__, e))


class _Messages(object):
    def __init__(self, request, response):
        self.ListPodResourcesRequest = request       # pylint: disable=invalid-name
        self.ListPodResourcesResponse = response     # pylint: disable=invalid-name


def _rpc_failure(where, error, timeout):
    """A sentence for a failed List call, by its gRPC status."""
    code = getattr(error.code(), "name", str(error.code()))
    details = error.details() or ""
    if code == "DEADLINE_EXCEEDED":
        return "%s did not answer within %g s" % (where, timeout)
    if code == "UNAVAILABLE":
        lowered = details.lower()
        if "refused" in lowered:
            return "%s refuses connections (is the kubelet running?): %s" % (where, details)
        if "http" in lowered:
            return "%s does not speak gRPC: %s" % (where, details)
        return "%s cannot be reached: %s" % (where, details)
    if code == "UNIMPLEMENTED":
        return "%s does not serve v1 PodResourcesLister/List (a kubelet before 1.20?): %s" % (where, details)
    if code == "INTERNAL" and "serializ" in details.lower():
        return "%s answered something that is not a PodResources List answer: %s" % (where, details)
    return "%s failed: %s: %s" % (where, code, details)
