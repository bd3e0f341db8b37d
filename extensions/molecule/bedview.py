# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the testinfra tests of every scenario read from outside the hosts.

The simulated GPUs are read from each host's state file on the controller, as a
BMC would see them; the cluster through the Kubernetes API with the bed's kubeconfig.
"""

import json
import os

import yaml

BED = "/tmp/gpuops-testbed"
MOLECULE_DIR = os.path.dirname(os.path.abspath(__file__))
RESTORE_UNIT = "gpuops-mig-restore.service"


def gpu_state(name):
    """The simulated GPUs of host `name` (the simulator's state file)."""
    with open(os.path.join(BED, "hosts", name, "state.json"), encoding="utf-8") as handle:
        return json.load(handle)


def inventory_hosts():
    with open(os.path.join(MOLECULE_DIR, "inventory", "hosts.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)["all"]["children"]["gpu_nodes"]["hosts"]


def mig_devices(gpu):
    """A GPU's MIG devices as a sorted list of GPU-instance profile names, e.g. ['1g.10gb', '3g.40gb']."""
    from gpuops_mig_sim import models
    model = models.get_model(gpu["model"])
    return sorted(models.gi_profile_by_id(model, gi["profile_id"]).name for gi in gpu["gpu_instances"])


class Cluster:
    """Reads of the test cluster's Kubernetes API with the kubernetes client."""

    def __init__(self, kubeconfig):
        from kubernetes import client, config
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))

    def node(self, name):
        return self.core.read_node(name)

    def labels(self, name):
        return self.node(name).metadata.labels or {}

    def pods(self, node=None, namespace=None):
        selector = "spec.nodeName=%s" % node if node else None
        if namespace:
            return self.core.list_namespaced_pod(namespace, field_selector=selector).items
        return self.core.list_pod_for_all_namespaces(field_selector=selector).items


def expected_devices(config_name, model_key):
    """The MIG devices config `config_name` of shared/fleet-layouts.yml gives a GPU of this model
    (sorted profile names), or None when no entry selects the model."""
    from gpuops_mig_sim import models
    with open(os.path.join(MOLECULE_DIR, "shared", "fleet-layouts.yml"), encoding="utf-8") as handle:
        entries = yaml.safe_load(handle)["mig-configs"][config_name]
    pci_id = "0x%08X" % models.get_model(model_key).pci_device_id
    for entry in entries:
        if pci_id in [f.upper().replace("0X", "0x") for f in entry.get("device-filter", [])]:
            return sorted(p for p, n in entry.get("mig-devices", {}).items() for dummy in range(n))
    return None


def advertised(state):
    """What the device plugin (mixed strategy) should advertise for this host: {resource: count}."""
    counts = {}
    for gpu in state["gpus"]:
        if gpu["mig"] and gpu["mig"]["current"]:
            for profile in mig_devices(gpu):
                key = "nvidia.com/mig-" + profile.replace("+", ".")
                counts[key] = counts.get(key, 0) + 1
        else:
            counts["nvidia.com/gpu"] = counts.get("nvidia.com/gpu", 0) + 1
    return counts


def listed_devices(node):
    """{resource: count} of the nvidia.com/ resources the Node's allocatable lists, less nvidia.com/gpu at 0: the
    kubelet keeps a resource the device plugin stopped advertising at 0 until it restarts, and the role removes
    only the stale MIG ones (mig_node_stale_resources), so a MIG resource left at 0 still shows here."""
    return {k: int(v) for k, v in node.status.allocatable.items()
            if k.startswith("nvidia.com/") and not (k == "nvidia.com/gpu" and v == "0")}


def busy_devices(name):
    """The workloads the rollout scenario started on host `name` (rollout/relayout.yml)."""
    path = os.path.join(BED, "busy-%s.json" % name)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
