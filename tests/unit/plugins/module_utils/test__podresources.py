"""Which pod holds which device: the PodResources client (plugins/module_utils/_podresources.py)
against real gRPC servers on unix sockets in tmp_path."""

import socket
import sys
import threading
import time

import grpc
import pytest
from concurrent import futures

from ansible_collections.gpuops.mig.plugins.module_utils import _podresources as podresources
from tests.support.podresources_server import SERVICE, PodResourcesServer

MIG_A = "MIG-11111111-1111-5111-8111-111111111111"
MIG_B = "MIG-22222222-2222-5222-8222-222222222222"
GPU_1 = "GPU-33333333-3333-5333-8333-333333333333"


def pod(namespace, name, *containers):
    return {"namespace": namespace, "name": name,
            "containers": [{"name": c, "devices": [{"resource_name": r, "device_ids": ids} for r, ids in devs]}
                           for c, devs in containers]}


@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "kubelet.sock")


def test_each_device_maps_to_its_pod_container_and_resource(sock):
    pods = [
        pod("ml", "train-0", ("main", [("nvidia.com/mig-1g.10gb", [MIG_A])]), ("sidecar", [])),
        pod("default", "web-0", ("web", [("example.com/fpga", ["fpga-0"])])),     # not an NVIDIA device
        pod("ml", "infer-0", ("main", [("nvidia.com/gpu", [GPU_1]), ("nvidia.com/mig-3g.40gb", [MIG_B])])),
    ]
    with PodResourcesServer(sock, lambda: pods) as server:
        got = podresources.read_allocations(sock)
    assert server.calls == 1
    assert got["allocations_source"] == "podresources" and got["allocations_error"] is None
    assert got["allocations"] == [
        {"device_uuid": MIG_A, "namespace": "ml", "pod": "train-0", "container": "main",
         "resource": "nvidia.com/mig-1g.10gb"},
        {"device_uuid": GPU_1, "namespace": "ml", "pod": "infer-0", "container": "main",
         "resource": "nvidia.com/gpu"},
        {"device_uuid": MIG_B, "namespace": "ml", "pod": "infer-0", "container": "main",
         "resource": "nvidia.com/mig-3g.40gb"},
    ]


def test_an_empty_node_reads_as_an_empty_list(sock):
    with PodResourcesServer(sock, lambda: []):
        assert podresources.read_allocations(sock) == {"allocations": [], "allocations_source": "podresources",
                                                       "allocations_error": None}


def test_time_slicing_replicas_are_one_allocation_each_of_the_stripped_uuid(sock):
    pods = [pod("a", "p1", ("c", [("nvidia.com/mig-1g.10gb", [MIG_A + "::0", MIG_A + "::3"])])),
            pod("b", "p2", ("c", [("nvidia.com/mig-1g.10gb.shared", [MIG_A + "::1"])])),
            pod("b", "p3", ("c", [("nvidia.com/gpu", [GPU_1 + "::2"])]))]
    with PodResourcesServer(sock, lambda: pods):
        allocations = podresources.read_allocations(sock)["allocations"]
    expected = [(MIG_A, "p1"), (MIG_A, "p1"), (MIG_A, "p2"), (GPU_1, "p3")]
    assert [(a["device_uuid"], a["pod"]) for a in allocations] == expected
    # Two replicas in one container are one holder; two pods sharing a device are two.
    assert podresources.holders_by_device(allocations) == {MIG_A: ("a/p1/c", "b/p2/c"), GPU_1: ("b/p3/c",)}


@pytest.mark.parametrize("device_id, expected", [
    (MIG_A, (MIG_A, None)), (MIG_A + "::7", (MIG_A, 7)), (GPU_1, (GPU_1, None)),
    ("MIG-GPU-3333/1/0", ("MIG-GPU-3333/1/0", None)),        # the pre-R470 MIG UUID form
    ("0", (None, None)), ("fpga-0::1", (None, None)), ("", (None, None)),
])
def test_split_device_id(device_id, expected):
    assert podresources.split_device_id(device_id) == expected


def unreadable(result):
    assert result["allocations"] is None and result["allocations_source"] is None
    return result["allocations_error"]


def test_a_missing_socket_says_so(sock):
    error = unreadable(podresources.read_allocations(sock))
    assert sock in error and "No such file or directory" in error and "pod_resources_socket" in error


def test_a_path_with_a_nul_is_refused_without_a_traceback():
    assert "embedded null byte" in unreadable(podresources.read_allocations("/run/kubelet\x00.sock"))


def test_a_file_that_is_not_a_socket_says_so(tmp_path):
    path = tmp_path / "plain"
    path.write_text("")
    assert unreadable(podresources.read_allocations(str(path))).endswith("%s is not a unix socket" % path)


def test_a_socket_nobody_listens_on_is_refused(sock):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock)          # the file stays after close: what a kubelet that died leaves behind
    dead.close()
    error = unreadable(podresources.read_allocations(sock, timeout=3))
    assert "refuses connections" in error and sock in error


def read_from_raw_server(sock, handlers):
    """read_allocations against a bare gRPC server with these PodResourcesLister method handlers."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    if handlers:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port("unix://" + sock)
    server.start()
    try:
        return unreadable(podresources.read_allocations(sock))
    finally:
        server.stop(None)


def test_an_answer_that_does_not_decode_is_garbage(sock):
    garbage = grpc.unary_unary_rpc_method_handler(lambda request, context: b"\xff\xff\xff\xff\x0f",
                                                  request_deserializer=None, response_serializer=None)
    error = read_from_raw_server(sock, {"List": garbage})
    assert "answered something that is not a PodResources List answer" in error


def speak_http_only(listener, stop):
    while not stop.is_set():
        try:
            conn, _address = listener.accept()
        except OSError:
            return
        with conn:
            # As an HTTP/1.1 server does: read what the client sent (gRPC's HTTP/2 preface), answer, and let
            # the client close first. Closing before reading made the client's write fail with a broken pipe
            # now and then, before it could read the answer.
            conn.settimeout(2)
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                while conn.recv(65536):
                    pass
            except OSError:
                pass


def test_a_server_that_speaks_something_else_is_reported(sock):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    listener.listen(4)
    stop = threading.Event()
    thread = threading.Thread(target=speak_http_only, args=(listener, stop), daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        error = unreadable(podresources.read_allocations(sock, timeout=2))
        assert time.monotonic() - started < 10
    finally:
        stop.set()
        listener.close()
    assert "does not speak gRPC" in error and sock in error


def test_a_server_that_does_not_answer_in_time_times_out(sock):
    def slow():
        time.sleep(3)
        return []
    with PodResourcesServer(sock, slow):
        started = time.monotonic()
        error = unreadable(podresources.read_allocations(sock, timeout=0.5))
        assert time.monotonic() - started < 2.5
    assert error.endswith("did not answer within 0.5 s")


def test_a_server_without_the_service_is_unimplemented(sock):
    assert "does not serve v1 PodResourcesLister/List" in read_from_raw_server(sock, {})


def test_without_grpc_on_the_host_it_says_what_to_install(sock, monkeypatch):
    with PodResourcesServer(sock, lambda: []):
        monkeypatch.setitem(sys.modules, "grpc", None)     # import grpc now raises ImportError
        error = unreadable(podresources.read_allocations(sock))
    assert "grpcio and protobuf" in error and "grpc" in error


def test_the_descriptor_for_older_protobuf_is_the_generated_one():
    from ansible_collections.gpuops.mig.plugins.module_utils import _podresources_api_pb2 as generated
    assert podresources._DESCRIPTOR == generated.DESCRIPTOR.serialized_pb


def test_messages_built_from_the_descriptor_read_the_same_answer(sock, monkeypatch):
    pods = [pod("ml", "train-0", ("main", [("nvidia.com/mig-1g.10gb", [MIG_A + "::1"])]))]
    with PodResourcesServer(sock, lambda: pods):
        expected = podresources.read_allocations(sock)
        # As on a host whose protobuf is older than the generated module (there: ImportError or VersionError).
        monkeypatch.setitem(sys.modules, "ansible_collections.gpuops.mig.plugins.module_utils._podresources_api_pb2",
                            None)
        assert podresources.read_allocations(sock) == expected
    assert expected["allocations"][0]["device_uuid"] == MIG_A
