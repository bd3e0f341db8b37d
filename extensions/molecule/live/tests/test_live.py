# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the live scenario, from outside: a30-0's GPU has the new layout, the kubelet's socket is where the
role looks by default, the two kept pods run on the node and nothing else of the scenario's is left there."""

from bedview import gpu_state, mig_devices

testinfra_hosts = ["ansible://a30-0"]

KEPT = ["live-1g-a", "live-1g-b"]


def test_the_gpu_has_the_new_layout(name):
    (gpu,) = gpu_state(name)["gpus"]
    assert mig_devices(gpu) == ["1g.6gb"] * 4


def test_the_kubelet_socket_is_at_its_default_path(host):
    assert host.file("/var/lib/kubelet/pod-resources/kubelet.sock").is_socket


def test_the_kept_pods_run_on_the_node(name, cluster):
    pods = cluster.pods(node=name, namespace="ml")
    live = sorted(p.metadata.name for p in pods if (p.metadata.labels or {}).get("app") == "live")
    assert live == KEPT
    assert all(p.status.phase == "Running" for p in pods)


def test_the_node_is_schedulable_and_labelled(name, cluster):
    node = cluster.node(name)
    assert not node.spec.unschedulable
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "success"
