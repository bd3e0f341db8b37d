"""A kubelet PodResources v1 server (gRPC on a unix socket) for tests and simulated hosts.

It serves `/v1.PodResourcesLister/List` over the real gRPC protocol with the collection's own generated
messages (plugins/module_utils/_podresources_api_pb2.py), answering from `source()`, a callable that
returns the pods as the kubelet lists them:

    [{"namespace": "ml", "name": "train-0",
      "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/mig-1g.10gb",
                                                   "device_ids": ["MIG-..."]}]}]}]

    with PodResourcesServer(tmp_path / "kubelet.sock", lambda: pods):
        ...   # mig_node_info pod_resources_socket=<that path>

`node_source(cluster, node)` answers for one node of the test cluster, `cluster` being the
stand-ins' view (`cluster.stand_ins.view`, tests/support/controlplane/standins.py): the device
assignments of the kubelet's device manager stand-in (tests/support/kubeapi/allocations.py). Like
the kubelet (pkg/kubelet/apis/podresources/server_v1.go, List), it lists every active pod bound to
the node with each of its containers (restartable init containers first), with or without devices.
"""

from __future__ import annotations

import os
import sys
from concurrent import futures

import grpc

try:
    from ansible_collections.gpuops.mig.plugins.module_utils import _podresources_api_pb2 as messages
except ImportError:
    # run outside pytest (python -m tests.support.controlplane): the checkout's collection link
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".build", "collections"))
    from ansible_collections.gpuops.mig.plugins.module_utils import _podresources_api_pb2 as messages

SERVICE = "v1.PodResourcesLister"


class PodResourcesServer:
    def __init__(self, socket_path, source):
        self.socket_path = str(socket_path)
        self.source = source
        self.calls = 0                     # List calls answered, for assertions
        self._server = None

    def start(self) -> PodResourcesServer:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)    # a socket a stopped kubelet left behind
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=messages.ListPodResourcesRequest.FromString,
            response_serializer=messages.ListPodResourcesResponse.SerializeToString)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"List": handler}),))
        if not self._server.add_insecure_port("unix://" + os.path.abspath(self.socket_path)):
            raise RuntimeError("cannot listen on %s" % self.socket_path)
        self._server.start()
        return self

    def stop(self):
        if self._server is not None:
            self._server.stop(None).wait(5)
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _list(self, _request, _context):
        self.calls += 1
        return response(self.source())


def response(pods) -> messages.ListPodResourcesResponse:
    """A ListPodResourcesResponse from plain dicts (see the module docstring)."""
    answer = messages.ListPodResourcesResponse()
    for pod in pods:
        item = answer.pod_resources.add(name=pod["name"], namespace=pod["namespace"])
        for container in pod.get("containers") or ():
            entry = item.containers.add(name=container["name"])
            for devices in container.get("devices") or ():
                entry.devices.add(resource_name=devices["resource_name"], device_ids=list(devices["device_ids"]))
    return answer


def node_source(cluster, node: str):
    """A source answering for `node` of the test cluster; `cluster` is the stand-ins' view
    (cluster.stand_ins.view), whose device manager stand-in holds the assignments."""
    from tests.support.kubeapi import allocations

    return lambda: allocations.pod_resources(cluster, node)
