# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the sharing scenario, from outside: h100-0's GPUs have the second layout, the node's device plugin
config entry time-slices its 1g.10gb devices 2 x renamed, the ConfigMap kept its other entries, and the node
advertises devices x replicas under the .shared name and nothing under the old one."""

import yaml

from bedview import gpu_state, mig_devices

testinfra_hosts = ["ansible://h100-0"]

NAMESPACE, CONFIGMAP = "nvidia-device-plugin", "plugin-configs"
CONFIG_LABEL = "nvidia.com/device-plugin.config"


def test_the_gpus_have_the_second_layout(name):
    for gpu in gpu_state(name)["gpus"]:
        assert mig_devices(gpu) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"], gpu["index"]


def test_the_node_config_entry_follows_the_layout(name, cluster):
    entry = cluster.labels(name)[CONFIG_LABEL]
    data = cluster.core.read_namespaced_config_map(CONFIGMAP, NAMESPACE).data
    assert data["default"] == "version: v1\n"
    sharing = yaml.safe_load(data[entry])["sharing"]["timeSlicing"]
    assert sharing["renameByDefault"] is True
    assert sharing["resources"] == [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]
    # The first layout's entry is still there (nodes may share it), but no longer this node's.
    assert len([key for key in data if key.startswith("gpuops-mig-")]) == 2


def test_the_node_advertises_devices_times_replicas(name, cluster):
    node = cluster.node(name)
    advertised = {k: int(v) for k, v in node.status.allocatable.items() if k.startswith("nvidia.com/mig-") and v != "0"}
    assert advertised == {"nvidia.com/mig-1g.10gb.shared": 16, "nvidia.com/mig-2g.20gb": 4,
                          "nvidia.com/mig-3g.40gb": 4}
    assert not node.spec.unschedulable
