# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import dataclasses
import json

from ansible_collections.gpuops.mig.plugins.module_utils._evictions import (
    DEVICE_DESTROYED,
    MODE_CHANGE,
    REBOOT,
    host_evictions,
    node_evictions,
)
from ansible_collections.gpuops.mig.plugins.module_utils._host_layout import GpuWork
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import plan_gpu

from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.layout_helpers import A100_40GB, make_gi

A100 = A100_40GB


def allocated(gi_id, name, start, *pods):
    gi = make_gi(A100, gi_id, name, start)
    return dataclasses.replace(gi, compute_instances=(dataclasses.replace(gi.compute_instances[0], pods=pods),))


def two_3g():
    """GPU with a 3g at 0 held by pod ml/a (two containers) and a 3g at 4 held by ml/b and ml/c (time-sliced)."""
    return [allocated(1, "3g.20gb", 0, "ml/a/main", "ml/a/side"), allocated(2, "3g.20gb", 4, "ml/b/main", "ml/c/main")]


def reasons(result):
    return {p.pod: [(r.reason, r.gpu) for r in p.reasons] for p in result.pods}


def test_a_change_that_destroys_only_idle_devices_evicts_nothing():
    existing = [make_gi(A100, 1, "3g.20gb", 0), allocated(2, "3g.20gb", 4, "ml/b/main")]
    plan = plan_gpu(A100, existing, {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, evict_pods=True)
    assert [g.gi_id for g in plan.destroy] == [1]
    result = node_evictions({0: plan}, geometries={0: A100})
    assert result.evicts_nothing and not result.drain_node and result.pods == ()
    assert result.as_dict() == {"evicts_nothing": True, "drain_node": False, "pods": []}


def test_destroyed_devices_evict_their_pods_and_only_them():
    plan = plan_gpu(A100, two_3g(), {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}, evict_pods=True)
    result = node_evictions({0: plan, 1: plan_gpu(A100, two_3g(), {"3g.20gb": 2})}, geometries={0: A100})
    # One 3g goes; the planner picks the one with fewer pods (ml/a, one pod on two containers).
    assert reasons(result) == {"ml/a": [(DEVICE_DESTROYED, 0)]}
    assert not result.evicts_nothing and not result.drain_node
    (reason,) = result.pods[0].reasons
    assert (reason.device, reason.uuid) == ("3g.20gb", "MIG-1-0")
    assert reason.detail == "GPU 0: 3g.20gb MIG-1-0 (GI 1, CI 0) is destroyed"
    data = result.as_dict()
    json.dumps(data)
    assert data["pods"] == [{"pod": "ml/a", "reasons": [{"reason": "device destroyed", "gpu": 0, "device": "3g.20gb",
                                                         "uuid": "MIG-1-0", "detail": reason.detail}]}]


def test_a_pod_on_two_gpus_is_listed_once_with_both_reasons():
    first = [allocated(1, "7g.40gb", 0, "ml/wide/w0")]
    second = [allocated(1, "7g.40gb", 0, "ml/wide/w1")]
    plans = {0: plan_gpu(A100, first, {"3g.20gb": 2}, evict_pods=True),
             1: plan_gpu(A100, second, {"3g.20gb": 2}, evict_pods=True)}
    result = node_evictions(plans)
    assert reasons(result) == {"ml/wide": [(DEVICE_DESTROYED, 0), (DEVICE_DESTROYED, 1)]}
    assert result.pods[0].reasons[0].device is None   # no geometry given: no profile name
    assert result.pods[0].reasons[0].detail == "GPU 0: MIG-1-0 (GI 1, CI 0) is destroyed"


def test_mode_change_or_reset_evicts_every_pod_on_that_gpu():
    kept = plan_gpu(A100, two_3g(), {"3g.20gb": 2})
    # GPU 1 has MIG off and a pod on the whole GPU; GPU 2 must be reset; GPU 3's whole-GPU pod stays.
    result = node_evictions({0: kept, 1: None},
                            gpu_pods={1: ["ml/whole/main"], 2: ["ml/r/main"], 3: ["ml/other/main"]},
                            mode_changes=[1], resets=[2])
    assert reasons(result) == {"ml/whole": [(MODE_CHANGE, 1)], "ml/r": [(MODE_CHANGE, 2)]}
    assert [r.detail for p in result.pods for r in p.reasons] == ["GPU 2: it is reset", "GPU 1: its MIG mode changes"]
    # GPU 0's mode changes too: its pods go whatever its plan keeps.
    result = node_evictions({0: kept}, mode_changes=[0])
    assert reasons(result) == {"ml/a": [(MODE_CHANGE, 0)], "ml/b": [(MODE_CHANGE, 0)], "ml/c": [(MODE_CHANGE, 0)]}


def test_a_reboot_drains_the_node():
    kept = plan_gpu(A100, two_3g(), {"3g.20gb": 2})
    result = node_evictions({0: kept}, gpu_pods={1: ["ml/whole/main"]}, mode_changes=[1], reboot=True)
    assert result.drain_node and not result.evicts_nothing
    assert reasons(result) == {"ml/a": [(REBOOT, None)], "ml/b": [(REBOOT, None)], "ml/c": [(REBOOT, None)],
                               "ml/whole": [(REBOOT, None)]}
    # A reboot evicts every pod on the node, also where no GPU pod is known.
    empty = node_evictions({}, reboot=True)
    assert empty.drain_node and empty.pods == () and not empty.evicts_nothing
    assert empty.as_dict() == {"evicts_nothing": False, "drain_node": True, "pods": []}


def test_host_evictions_reads_the_node_plan():
    """What mig_node_info has in check mode: plan_host's items and host_mode's report."""
    def item(index, plan):
        work = GpuWork(target=None, gpu={"index": index, "label": "GPU %d" % index}, mode=(1, 1))
        work.geometry, work.plan = A100, plan
        return work
    work = [item(0, plan_gpu(A100, two_3g(), {"3g.20gb": 1, "1g.5gb": 3}, evict_pods=True)),
            item(1, plan_gpu(A100, two_3g(), {"3g.20gb": 2}, evict_pods=True))]
    mode = {"gpus": [{"index": 0, "skipped": None, "changed": False, "action_required": "none"},
                     {"index": 1, "skipped": None, "changed": False, "action_required": "none"},
                     {"index": 2, "skipped": None, "changed": True, "action_required": "reset"},
                     {"index": 3, "skipped": "not MIG-capable", "changed": False, "action_required": "none"}],
            "reboot_required": False}
    result = host_evictions(work, mode, gpu_pods={2: ["ml/whole/main"], 3: ["ml/plain/main"]})
    assert reasons(result) == {"ml/a": [(DEVICE_DESTROYED, 0)], "ml/whole": [(MODE_CHANGE, 2)]}
    assert result.pods[0].reasons[0].device == "3g.20gb"
    result = host_evictions(work, dict(mode, reboot_required=True), gpu_pods={3: ["ml/plain/main"]})
    assert result.drain_node and len(result.pods) == 4


def _bench():
    """bench/bench_evictions.py, loaded by path (bench/ is not a package)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "bench", "bench_evictions.py")
    spec = importlib.util.spec_from_file_location("bench_evictions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_devices_mode_evicts_the_exhaustive_minimum_on_the_benchmark_sample():
    """10 seeded transitions of the eviction benchmark (config-default.yaml's named configs, 8-GPU hosts, half
    the devices held by pods): the planner's pods equal the brute force's minimum. The sample holds transitions
    where the plan that ignores pods evicts more, so a planner blind to pods fails here."""
    bench = _bench()
    rows = [bench.measure(model, existing, targets)
            for per_gpu in (False, True) for model, existing, targets in bench.transitions(5, 4, per_gpu=per_gpu)]
    assert [r["devices"] for r in rows] == [r["minimum"] for r in rows]
    assert any(r["blind"] > r["minimum"] for r in rows)
    assert all(r["devices"] <= r["node"] for r in rows)
