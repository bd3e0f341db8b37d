"""The MIG-ready decision from the API alone (plugin_utils/_mig_ready.py) and the gate's patches
(module_utils/_node_status.py): declared layout vs what the device plugin and GFD advertise."""

import json

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.module_utils import _node_status as status
from ansible_collections.gpuops.mig.plugins.plugin_utils import _mig_ready as ready

TAINT = "gpuops.mig/not-ready:NoSchedule"
MIG_1G = "nvidia.com/mig-1g.10gb"
CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-balanced": [
            {
                "device-filter": ["0x233010DE"],
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
            }
        ],
    },
}
POOLS = {
    "h100-small": {
        "node_labels": {"pool": "h100-small"},
        "config": CONFIG,
        "config_name": "all-1g.10gb",
        "gpus": 2,
    }
}


def node(name="gpu-1", labels=None, allocatable=None, taint=True, annotations=None):
    labels = dict({"pool": "h100-small"}, **(labels or {}))
    obj = {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": dict(annotations or {}),
            "resourceVersion": "7",
        },
        "spec": {
            "taints": [{"key": "gpuops.mig/not-ready", "effect": "NoSchedule"}] if taint else []
        },
        "status": {"allocatable": dict({"cpu": "16"}, **(allocatable or {}))},
    }
    return obj


def gfd(count=14, product="NVIDIA-H100-80GB-HBM3", **extra):
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig.strategy": "mixed",
        MIG_1G + ".count": str(count),
    }
    labels.update(extra)
    return labels


def one(nodes, pools=None, hostvars=None, taint=TAINT):
    pools = POOLS if pools is None else pools
    out = ready.verdicts(nodes, taint, pools, hostvars)
    assert len(out) == 1
    return out[0]


def test_ready_when_every_declared_device_is_advertised_and_no_whole_gpu_is_left():
    verdict = one([node(labels=gfd(), allocatable={MIG_1G: "14", "nvidia.com/gpu": "0"})])
    assert verdict["ready"] is True and verdict["reason"] == "MIGLayoutReady"
    assert "nvidia.com/mig-1g.10gb: 14" in verdict["message"]
    assert verdict["tainted"] is True and verdict["resource_version"] == "7"


def test_a_node_still_advertising_whole_gpus_is_not_ready_with_the_exact_message():
    verdict = one(
        [
            node(
                labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                allocatable={"nvidia.com/gpu": "8"},
            )
        ]
    )
    assert verdict["ready"] is False and verdict["reason"] == "MIGLayoutNotAdvertised"
    assert verdict["message"].startswith(
        "device plugin advertises nvidia.com/mig-1g.10gb: 0, declared 14"
    )


def test_whole_gpus_left_beside_the_mig_devices_are_named():
    verdict = one([node(labels=gfd(), allocatable={MIG_1G: "14", "nvidia.com/gpu": "1"})])
    assert not verdict["ready"]
    assert verdict["message"].startswith(
        "device plugin advertises nvidia.com/gpu: 1, declared 0 whole GPUs"
    )


def test_too_few_devices_and_an_undeclared_profile_are_not_ready():
    short = one([node(labels=gfd(count=12), allocatable={MIG_1G: "12"})])
    assert "advertises nvidia.com/mig-1g.10gb: 12, declared 14" in short["message"]
    extra = one([node(labels=gfd(), allocatable={MIG_1G: "14", "nvidia.com/mig-2g.20gb": "1"})])
    assert "nvidia.com/mig-2g.20gb: 1, declared 0" in extra["message"]
    # a profile at 0 (a kubelet keeping an old resource) is no device
    stale = one([node(labels=gfd(), allocatable={MIG_1G: "14", "nvidia.com/mig-2g.20gb": "0"})])
    assert stale["ready"]


def test_gfd_labels_out_of_step_or_missing_keep_the_node_tainted():
    behind = one([node(labels=gfd(count=7), allocatable={MIG_1G: "14"})])
    assert behind["message"].startswith(
        "GPU Feature Discovery labels nvidia.com/mig-1g.10gb.count=7"
    )
    unlabelled = one([node(allocatable={MIG_1G: "14"})])
    assert unlabelled["message"].startswith("GPU Feature Discovery has not labelled the node yet")


def test_nothing_advertised_yet():
    verdict = one([node()])
    assert verdict["message"].startswith("no device plugin advertises a GPU resource yet")


def test_a_recorded_failure_wins_over_what_is_advertised():
    record = json.dumps({"step": "geometry", "message": "GPU 3: Insufficient Resources"})
    verdict = one(
        [
            node(
                labels=gfd(),
                allocatable={MIG_1G: "14"},
                annotations={"gpuops.mig/last-error": record},
            )
        ]
    )
    assert verdict["reason"] == "MIGReconfigureFailed"
    assert "GPU 3: Insufficient Resources at step geometry" in verdict["message"]
    failed = one(
        [node(labels=gfd(**{"nvidia.com/mig.config.state": "failed"}), allocatable={MIG_1G: "14"})]
    )
    assert failed["reason"] == "MIGReconfigureFailed" and "mig-manager" in failed["message"]


def test_without_a_gpu_count_it_is_derived_only_from_whole_gpus_of_the_layout():
    pools = {"p": dict(POOLS["h100-small"], gpus=None)}
    assert one([node(labels=gfd(count=21), allocatable={MIG_1G: "21"})], pools)["ready"]
    odd = one([node(labels=gfd(count=9), allocatable={MIG_1G: "9"})], pools)
    assert "not a whole number of GPUs of 7 x 1g.10gb" in odd["message"]


def test_the_operator_label_names_the_config_and_nodes_without_taint_or_label_are_left_alone():
    pools = {"p": {"node_labels": {"pool": "h100-small"}, "config": CONFIG, "gpus": 1}}
    labels = gfd(count=7, **{"nvidia.com/mig.config": "all-1g.10gb"})
    verdict = one(
        [
            node(labels=labels, allocatable={MIG_1G: "7"}, taint=False),
            node("cpu-1", labels={"pool": "cpu"}, taint=False),
        ],
        pools,
    )
    assert verdict["node"] == "gpu-1" and verdict["ready"] and verdict["tainted"] is False
    done = dict(labels, **{"nvidia.com/mig.config.state": "success"})
    assert ready.verdicts([node(labels=done, taint=False)], TAINT, pools) == []


def test_the_inventory_wins_over_the_pool(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    hostvars = {
        "gpu-1": {"mig_node_config_file": str(path), "mig_node_config_name": "all-disabled"}
    }
    verdict = one(
        [node(labels={"nvidia.com/gpu.product": "X"}, allocatable={"nvidia.com/gpu": "2"})],
        hostvars=hostvars,
    )
    assert verdict["ready"], verdict
    assert "inventory" in verdict["message"]


@pytest.mark.parametrize(
    "pools, hostvars, expected",
    [
        (
            {
                "p": {
                    "node_labels": {"pool": "h100-small"},
                    "config": CONFIG,
                    "config_name": "all-7g",
                }
            },
            None,
            "Node gpu-1, gpuops_mig_ready_pools[p]: config: no config named 'all-7g'; "
            "available: all-1g.10gb",
        ),
        (
            {"p": {"node_labels": {"pool": "h100-small"}, "gpus": 8}},
            None,
            "Node gpu-1, gpuops_mig_ready_pools[p]: names no layout",
        ),
        (
            {
                "p": {
                    "node_labels": {"pool": "h100-small"},
                    "layouts": [{"gpus": "all", "devices": {"3g.40gb": 3}}],
                }
            },
            None,
            "asks for 3 x 3g.40gb per GPU: 9 compute slices and 120 GB, more than a GPU",
        ),
        (
            {
                "p": {
                    "node_labels": {"pool": "h100-small"},
                    "config": CONFIG,
                    "config_name": "all-balanced",
                }
            },
            None,
            "selects GPUs by device-filter",
        ),
        ({}, None, "Node gpu-1: no layout is declared for it"),
        (
            {"p": {"node_labels": {"pool": "h100-small"}, "config": CONFIG, "gpus": 0}},
            None,
            "gpus must be the number of GPUs of its nodes",
        ),
        (
            {
                "a": {"node_labels": {"pool": "h100-small"}, "config": CONFIG},
                "b": {"node_labels": {"pool": "h100-small"}, "config": CONFIG},
            },
            None,
            "matches pools a, b",
        ),
    ],
)
def test_a_wrong_declaration_keeps_the_node_tainted_and_names_node_source_and_entry(
    pools, hostvars, expected
):
    verdict = one([node(labels=gfd(), allocatable={MIG_1G: "14"})], pools, hostvars)
    assert verdict["ready"] is False and verdict["reason"] == "MIGLayoutInvalid"
    assert expected in verdict["message"], verdict["message"]


@pytest.mark.parametrize(
    "taint, expected",
    [
        ("not a taint", "is not a taint; write key[=value]:effect"),
        ("gpuops.mig/not-ready:NoRun", "a taint's effect is one of NoSchedule"),
        ("Bad_Prefix/x:NoSchedule", "its prefix 'Bad_Prefix' must be a lowercase DNS subdomain"),
        ("x/" + "n" * 64 + ":NoSchedule", "at most 63"),
        ("-x:NoSchedule", "starting and ending with a letter or digit"),
    ],
)
def test_a_taint_that_kubernetes_would_refuse_is_refused_before_anything(taint, expected):
    with pytest.raises(ready.MigReadyError, match="gpuops_mig_ready_taint") as caught:
        ready.verdicts([node()], taint, POOLS)
    assert expected in str(caught.value)


def test_the_reserved_prefixes_of_autoscalers_are_valid_taints():
    for text in (
        "startup-taint.cluster-autoscaler.kubernetes.io/gpuops-mig:NoSchedule",
        "readiness.k8s.io/gpuops-mig-ready=pending:NoSchedule",
        TAINT,
    ):
        assert status.parse_taint(text)["effect"] == "NoSchedule"


def test_the_taint_patch_is_guarded_and_removes_only_ours():
    other = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    obj = node()
    obj["spec"]["taints"].append(other)
    ops = status.taint_patch(obj, status.parse_taint(TAINT), present=False)
    assert ops[0]["op"] == "test" and ops[1] == {
        "op": "replace",
        "path": "/spec/taints",
        "value": [other],
    }
    assert status.taint_patch(node(taint=False), status.parse_taint(TAINT), present=False) == []
    assert status.taint_patch(node(taint=False), status.parse_taint(TAINT), present=True) == [
        {
            "op": "add",
            "path": "/spec/taints",
            "value": [{"key": "gpuops.mig/not-ready", "effect": "NoSchedule"}],
        }
    ]


def test_the_condition_patch_keeps_the_transition_time_while_the_status_stays():
    obj = node()
    first = status.condition_patch(
        obj, False, "MIGLayoutNotAdvertised", "m1", "2026-11-27T10:00:00Z"
    )
    assert first == [
        {
            "op": "add",
            "path": "/status/conditions",
            "value": [
                {
                    "type": "gpuops.mig/MIGReady",
                    "status": "False",
                    "reason": "MIGLayoutNotAdvertised",
                    "message": "m1",
                    "lastHeartbeatTime": "2026-11-27T10:00:00Z",
                    "lastTransitionTime": "2026-11-27T10:00:00Z",
                }
            ],
        }
    ]
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}] + first[0]["value"]
    assert status.condition_patch(obj, False, "MIGLayoutNotAdvertised", "m1", "later") == []
    again = status.condition_patch(
        obj, False, "MIGLayoutNotAdvertised", "m2", "2026-11-27T10:01:00Z"
    )
    assert again[1]["path"] == "/status/conditions/1"
    assert again[1]["value"]["lastTransitionTime"] == "2026-11-27T10:00:00Z"
    lifted = status.condition_patch(obj, True, "MIGLayoutReady", "ok", "2026-11-27T10:02:00Z")
    assert lifted[1]["value"]["lastTransitionTime"] == "2026-11-27T10:02:00Z"


def test_the_fleet_report_cell():
    assert ready.ready_cell(node()) == "-"
    obj = node()
    obj["status"]["conditions"] = [
        {"type": "gpuops.mig/MIGReady", "status": "False", "reason": "MIGLayoutNotAdvertised"}
    ]
    assert ready.ready_cell(obj) == "no (MIGLayoutNotAdvertised)"
