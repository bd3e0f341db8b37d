# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which pods a node's MIG change evicts, and why.

Pure Python, like _gpu_layout: the per-GPU plans (planned with evict_pods=True, so
a plan may destroy allocated devices and names their pods) plus what the MIG mode
step does to the node make one answer. A pod goes when:

* the plan destroys a MIG device allocated to it (``device destroyed``);
* it holds anything on a GPU whose MIG mode changes or that is reset: nothing
  survives there (``GPU mode change``);
* the node reboots: the whole node drains, GPU pods or not (``reboot``).

Every other pod keeps its devices and runs on. docs/planner.md, "Allocated
devices and evictions", says how the planner picks the plan that evicts the
fewest pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import (
    DEVICE_DESTROYED, GpuGeometry, GpuPlan, pod_name)

__all__ = [
    "DEVICE_DESTROYED",
    "MODE_CHANGE",
    "REBOOT",
    "EvictionReason",
    "PodEviction",
    "NodeEvictions",
    "node_evictions",
    "host_evictions",
]

MODE_CHANGE = "GPU mode change"
REBOOT = "reboot"


@dataclass(frozen=True)
class EvictionReason:
    """Why one pod goes: reason is DEVICE_DESTROYED, MODE_CHANGE or REBOOT."""

    reason: str
    gpu: object = None      # GPU index; None for a reboot
    device: object = None   # DEVICE_DESTROYED: the MIG device name ("3g.20gb")
    uuid: object = None     # DEVICE_DESTROYED: its MIG device UUID, when known
    detail: str = ""        # readable, e.g. "GPU 0: 3g.20gb MIG-... (GI 1, CI 0) is destroyed"

    def as_dict(self) -> dict[str, Any]:
        data = {"reason": self.reason, "gpu": self.gpu, "detail": self.detail}
        if self.reason == DEVICE_DESTROYED:
            data.update(device=self.device, uuid=self.uuid)
        return data


@dataclass(frozen=True)
class PodEviction:
    """A pod that must go ("namespace/pod"), with every reason."""

    pod: str
    reasons: tuple          # EvictionReason, ...

    def as_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "reasons": [r.as_dict() for r in self.reasons]}


@dataclass(frozen=True)
class NodeEvictions:
    """What a node's change evicts."""

    pods: tuple             # PodEviction, in pod name order
    drain_node: bool        # a reboot: every pod on the node goes, including those no GPU shows

    @property
    def evicts_nothing(self) -> bool:
        """The change runs under the pods: cordon for the window, evict nobody."""
        return not self.drain_node and not self.pods

    def as_dict(self) -> dict[str, Any]:
        return {"evicts_nothing": self.evicts_nothing, "drain_node": self.drain_node,
                "pods": [p.as_dict() for p in self.pods]}


def node_evictions(plans: Mapping[int, GpuPlan | None], gpu_pods: Mapping[int, Iterable[str]] | None = None,
                   mode_changes: Iterable[int] = (), resets: Iterable[int] = (), reboot: bool = False,
                   geometries: Mapping[int, GpuGeometry] | None = None) -> NodeEvictions:
    """The pods a node's MIG change evicts, each with its reasons.

    plans: {GPU index: GpuPlan or None}, as planned with evict_pods=True.
    gpu_pods: {GPU index: pod holders ("namespace/pod/container" or "namespace/pod")} on the GPU that its
        plan does not show: a whole GPU allocated while MIG is off, or a GPU without a plan. The pods of
        the devices in a GPU's plan are taken from the plan.
    mode_changes, resets: GPU indexes whose MIG mode changes, or that must be reset: every pod on them goes.
    reboot: the change needs a reboot: the node drains (NodeEvictions.drain_node), and every known pod is
        listed with that one reason.
    geometries: {GPU index: GpuGeometry}, to name destroyed devices by their MIG profile.
    """
    gpu_pods = gpu_pods or {}
    geometries = geometries or {}
    on_gpu = {}   # GPU index -> pods on it now
    for index, holders in gpu_pods.items():
        on_gpu.setdefault(index, set()).update(pod_name(h) for h in holders)
    for index, plan in plans.items():
        if plan is not None:
            on_gpu.setdefault(index, set()).update(_pods_in_plan(plan))
    reasons = {}
    if reboot:
        for index in sorted(on_gpu):
            for pod in on_gpu[index]:
                reasons[pod] = [EvictionReason(REBOOT, detail="the node reboots: it drains")]
        return _result(reasons, drain_node=True)
    for index in sorted(set(mode_changes) | set(resets)):
        what = "its MIG mode changes" if index in mode_changes else "it is reset"
        for pod in sorted(on_gpu.get(index, ())):
            reasons.setdefault(pod, []).append(EvictionReason(MODE_CHANGE, gpu=index,
                                                              detail="GPU %s: %s" % (index, what)))
    for index in sorted(plans):
        plan = plans[index]
        if plan is None:
            continue
        geometry = geometries.get(index)
        for pod, devices in plan.evicted_pods:
            for gi, ci in devices:
                device = geometry.device_name(gi.profile_id, ci.profile_id) if geometry is not None else None
                reasons.setdefault(pod, []).append(EvictionReason(
                    DEVICE_DESTROYED, gpu=index, device=device, uuid=ci.uuid,
                    detail="GPU %s: %s is destroyed" % (index, _device_text(device, gi, ci))))
    return _result(reasons, drain_node=False)


def _pods_in_plan(plan):
    """Every pod holding a device the GPU has before the plan."""
    before = list(plan.keep) + [c.gi for c in plan.change] + list(plan.destroy)
    return {pod for gi in before for ci in gi.compute_instances for pod in ci.pod_names}


def _device_text(device, gi, ci):
    parts = [p for p in (device, ci.uuid) if p]
    return "%s (GI %s, CI %s)" % (" ".join(parts) or "MIG device", gi.gi_id, ci.ci_id)


def _result(reasons, drain_node):
    return NodeEvictions(pods=tuple(PodEviction(pod, tuple(reasons[pod])) for pod in sorted(reasons)),
                         drain_node=drain_node)


def host_evictions(work: Sequence[Any], mode: Mapping[str, Any],
                   gpu_pods: Mapping[int, Iterable[str]] | None = None) -> NodeEvictions:
    """node_evictions for one host from what mig_node_info plans in check mode.

    work: _host_layout.plan_host's items (planned with evict_pods=True).
    mode: _host_mode.report's result: a GPU whose mode is set (changed) or still needs a reset
        (action_required "reset") loses every pod; reboot_required drains the node.
    gpu_pods: as for node_evictions (pods on a GPU that no plan shows, e.g. one with MIG off).
    """
    gpus = [g for g in mode["gpus"] if not g.get("skipped")]
    return node_evictions({item.index: item.plan for item in work}, gpu_pods=gpu_pods,
                          mode_changes=[g["index"] for g in gpus if g.get("changed")],
                          resets=[g["index"] for g in gpus if g.get("action_required") == "reset"],
                          reboot=bool(mode.get("reboot_required")),
                          geometries={item.index: item.geometry for item in work if item.geometry is not None})
