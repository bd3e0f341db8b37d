# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the GPU Operator default-install scenario, from outside: each node's GPUs hold its generated config,
which is in its own <node>-mig-config (owned by its mig-manager pod); default-mig-parted-config is still the
operator's asset; one device plugin, the operator's; no boot-time restore (mig-manager owns the nodes)."""

import yaml

from bedview import RESTORE_UNIT, gpu_state, mig_devices

testinfra_hosts = ["ansible://h100-0", "ansible://h200-0"]

NAMESPACE = "gpu-operator"
GENERATED = {"h100-0": ("all-3g.40gb", ["3g.40gb", "3g.40gb"]), "h200-0": ("all-3g.71gb", ["3g.71gb", "3g.71gb"])}


def test_the_gpus_hold_the_generated_config(name):
    for gpu in gpu_state(name)["gpus"]:
        assert mig_devices(gpu) == GENERATED[name][1], gpu["index"]


def test_the_config_is_the_nodes_own_generated_one(name, cluster):
    labels = cluster.labels(name)
    assert labels["nvidia.com/mig.config"] == GENERATED[name][0]
    assert labels["nvidia.com/mig.config.state"] == "success"
    own = cluster.core.read_namespaced_config_map(name + "-mig-config", NAMESPACE)
    assert GENERATED[name][0] in yaml.safe_load(own.data["config.yaml"])["mig-configs"]
    (owner,) = own.metadata.owner_references
    pods = [p for p in cluster.pods(node=name, namespace=NAMESPACE) if p.metadata.labels.get("app") == "nvidia-mig-manager"]
    assert owner.kind == "Pod" and [p.metadata.uid for p in pods] == [owner.uid]


def test_the_default_config_map_holds_none_of_the_layouts(cluster):
    """The operator's asset: neither config the rollout drove, and no entry for the H200 at all."""
    data = cluster.core.read_namespaced_config_map("default-mig-parted-config", NAMESPACE).data
    configs = yaml.safe_load(data["config.yaml"])["mig-configs"]
    assert not set(configs) & set(config for config, _devices in GENERATED.values())
    assert "0x233510DE" not in data["config.yaml"].upper().replace("0X", "0x")


def test_no_boot_time_restore(host):
    assert not host.file("/etc/systemd/system/" + RESTORE_UNIT).exists
