# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the impossible layout: nothing changed anywhere."""

from bedview import RESTORE_UNIT, gpu_state


def test_gpus_untouched(name):
    state = gpu_state(name)
    assert state["boot_count"] == 0
    for gpu in state["gpus"]:
        assert gpu["mig"] in (None, {"current": 0, "pending": 0})
        assert not gpu["gpu_instances"]


def test_node_neither_cordoned_nor_labelled(cluster, name):
    node = cluster.node(name)
    assert not node.spec.unschedulable
    assert not [k for k in node.metadata.labels if k.startswith("nvidia.com/mig.config")]
    assert [p.metadata.name for p in cluster.pods(node=name, namespace="ml")]  # nothing was evicted


def test_nothing_installed(host):
    assert not host.file("/etc/systemd/system/" + RESTORE_UNIT).exists
