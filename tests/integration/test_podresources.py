"""Which pod holds which MIG device, end to end, on the real test cluster: the device-plugin
stand-in gives MIG devices of a simulated host to the pods kwok runs on its node
(tests/support/kubeapi/allocations.py), a PodResources gRPC server on a unix socket serves them
as the kubelet does (tests/support/podresources_server.py), and gpuops.mig.mig_node_info, run by
ansible-playbook, reads them."""

import json
import os
import subprocess
import sys

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from tests.support.kubeapi import allocations, seed
from tests.support.podresources_server import PodResourcesServer, node_source
from tests.support.simhost import nvml_on

pytestmark = pytest.mark.playbook

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)
NODE = "gpu-1"
MIG_2G = "nvidia.com/mig-2g.20gb"
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - gpuops.mig.mig_node_info:
        pod_resources_socket: "{{ socket }}"
      environment:
        GPUOPS_MIG_SIMULATE: "{{ state }}"
      register: info
    - ansible.builtin.copy:
        content: "{{ info | to_json }}"
        dest: "{{ out }}"
"""


def make_devices(state, devices):
    """Give the simulated host's GPUs this layout with the collection's engine (force: pods are not asked)."""
    with nvml_on(state) as nvml:
        entries = host_layout.load_entries(layouts=[{"gpus": "all", "devices": devices}])
        resolution, gpus = host_layout.resolve(nvml, entries)
        host_layout.apply_host(nvml, host_layout.plan_host(nvml, resolution, gpus, force=True))


def mig_uuids(state):
    return {ci["uuid"] for gpu in sim.load_state(state)["gpus"] for gi in gpu["gpu_instances"]
            for ci in gi["compute_instances"]}


def node_info(tmp_path, state, sock):
    playbook = tmp_path / "info.yml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "info.json"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    extra = {"socket": str(sock), "state": str(state), "out": str(out)}
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps(extra), str(playbook)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def assigned(cluster):
    """(namespace, pod) -> devices, once the stand-ins caught up with every stored change."""
    cluster.stand_ins.sync()
    return allocations.assigned(cluster.stand_ins.view, NODE)


@pytest.fixture
def gpu_node(cluster, tmp_path):
    """An H100 host with three 2g.20gb devices, its node (device allocation on), the plugin (mixed) and three
    pods with one device each; yields (state path, socket path) with the PodResources server running."""
    state = str(tmp_path / "host.json")
    sim.create_state(state, "1xH100-SXM5-80GB", seed=NODE, mig="enabled", force=True)
    make_devices(state, {"2g.20gb": 3})
    sock = tmp_path / "kubelet.sock"
    cluster.seed(
        seed.node(NODE, {"nvidia.com/gpu.present": "true"}, nvml_state=state, pod_resources=str(sock)),
        seed.daemonset("nvidia-device-plugin", namespace="nvidia-device-plugin",
                       labels={"app.kubernetes.io/name": "nvidia-device-plugin"}, env={"MIG_STRATEGY": "mixed"}),
        *[seed.pod("train-%d" % i, node=NODE, namespace="ml", limits={MIG_2G: 1}) for i in range(3)],
        seed.pod("web-0", node=NODE),
    )
    cluster.wait_for(lambda: len(assigned(cluster)) == 3, "three pods holding a device")
    with PodResourcesServer(sock, node_source(cluster.stand_ins.view, NODE)):
        yield state, sock


def test_pods_on_three_mig_devices_appear_in_mig_node_info(gpu_node, cluster, tmp_path):
    state, sock = gpu_node
    held = assigned(cluster)
    assert sorted(held) == [("ml", "train-0"), ("ml", "train-1"), ("ml", "train-2")]
    assert cluster.get("Node", NODE)["status"]["allocatable"][MIG_2G] == "3"

    info = node_info(tmp_path, state, sock)
    assert info["allocations_source"] == "podresources" and info["allocations_error"] is None
    assert {a["device_uuid"] for a in info["allocations"]} == mig_uuids(state)
    assert sorted((a["pod"], a["device_uuid"]) for a in info["allocations"]) == sorted(
        (pod, containers["main"][MIG_2G][0]) for (_ns, pod), containers in held.items())
    assert {(a["namespace"], a["container"], a["resource"])
            for a in info["allocations"]} == {("ml", "main", MIG_2G)}
    holders = sorted(tuple(ci["pods"]) for gi in info["facts"]["gpus"][0]["gpu_instances"]
                     for ci in gi["compute_instances"])
    assert holders == [("ml/train-0/main",), ("ml/train-1/main",), ("ml/train-2/main",)]


def plugin_pods(cluster):
    return [p for p in cluster.list("Pod", "nvidia-device-plugin")
            if not p["metadata"].get("deletionTimestamp")]


def test_assignments_survive_a_plugin_restart_and_a_destroyed_device_fails_its_pod(
        gpu_node, cluster):
    state, _sock = gpu_node
    before = assigned(cluster)
    (plugin,) = plugin_pods(cluster)
    # The DaemonSet controller makes a new one once the old one is gone (graceful: kwok ends it).
    cluster.delete("Pod", plugin["metadata"]["name"], "nvidia-device-plugin")
    cluster.wait_for(lambda: [p["metadata"]["uid"] != plugin["metadata"]["uid"]
                              and p["status"].get("phase") == "Running"
                              for p in plugin_pods(cluster)] == [True],
                     "a new device-plugin pod running", timeout=60)
    assert assigned(cluster) == before

    make_devices(state, {"2g.20gb": 2, "1g.10gb": 1})      # one 2g.20gb device goes, under its pod

    def failed():
        cluster.stand_ins.sync()
        return [p for p in cluster.list("Pod", "ml") if p["status"].get("phase") == "Failed"]
    cluster.wait_for(failed, "the pod whose device went to fail")
    (gone,) = failed()
    left = set(mig_uuids(state))
    assert gone["status"]["reason"] == "DeviceDestroyed"
    lost = before[("ml", gone["metadata"]["name"])]["main"][MIG_2G][0]
    assert lost not in left and lost in gone["status"]["message"]
    after = assigned(cluster)
    assert after == dict((k, v) for k, v in before.items() if k[1] != gone["metadata"]["name"])
    assert all(p["status"]["phase"] == "Running" for p in cluster.list("Pod", "ml")
               if p["metadata"]["name"] != gone["metadata"]["name"])
    # The failed pod is no longer listed by the kubelet; the others still hold their devices.
    listed = allocations.pod_resources(cluster.stand_ins.view, NODE)
    assert sorted(p["name"] for p in listed if p["namespace"] == "ml") == sorted(k[1] for k in after)


def test_a_pod_that_finds_no_free_device_fails_at_admission(gpu_node, cluster):
    # Bound by name (as a scheduler that raced the node's allocatable would): the kubelet's device
    # manager refuses it at admission, as pkg/kubelet/cm/devicemanager does.
    cluster.seed(seed.pod("train-3", node=NODE, namespace="ml", limits={MIG_2G: 1}), wait=False)

    def refused():
        cluster.stand_ins.sync()
        return cluster.get("Pod", "train-3", "ml")["status"].get("phase") == "Failed"
    cluster.wait_for(refused, "train-3 refused at admission")
    pod = cluster.get("Pod", "train-3", "ml")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert "Requested: 1, Available: 0" in pod["status"]["message"]
    assert ("ml", "train-3") not in assigned(cluster)
