"""What a rollout writes about itself: its identity, a failed node's reason (plugins/plugin_utils/_node_records.py)."""

import datetime
import json

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_records as records

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
RUN = dict(run_id="20260101T120000Z-1a2b3c4d", controller="ctl-1", job_id="4711", started="2026-01-01T12:00:00Z")


def test_identity_from_the_start_time_and_awx():
    run = records.rollout_identity({}, {"JOB_ID": "99"}, "ctl-1", NOW, "1a2b3c4d")
    assert run == dict(run_id="20260101T120000Z-1a2b3c4d", controller="ctl-1", job_id="99",
                       started="2026-01-01T12:00:00Z")
    given = records.rollout_identity({"run_id": "mine", "job_id": 7}, {"JOB_ID": "99"}, "ctl-1", NOW)
    assert given["run_id"] == "mine" and given["job_id"] == "7"     # the extra vars win over the environment
    assert records.rollout_identity({}, {"AWX_JOB_ID": "5"}, "c", NOW)["job_id"] == "5"
    assert records.rollout_identity({}, {}, "c", NOW)["job_id"] == ""


def test_failure_annotation_and_warning_event():
    result = {"failed": True, "msg": "GPU 0: insufficient resources.\n  retry later."}
    out = records.node_failure("gpu-1", RUN, "Apply the MIG geometry", result, "all-balanced", NOW)
    note = json.loads(out["annotations"]["gpuops.mig/last-error"])
    assert note == {"step": "Apply the MIG geometry", "message": "GPU 0: insufficient resources. retry later",
                    "layout": "all-balanced", "run": RUN["run_id"], "job": "4711", "time": "2026-01-01T12:00:00Z"}
    event = out["event"]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "gpu-1"}
    assert (event["reason"], event["type"], event["metadata"]["namespace"]) == ("MigReconfigureFailed", "Warning", "default")
    assert event["message"] == ("MIG reconfiguration to layout 'all-balanced' failed at 'Apply the MIG geometry': "
                                "GPU 0: insufficient resources. retry later (gpuops.mig run 20260101T120000Z-1a2b3c4d)")
    assert event["metadata"]["name"] == "gpu-1.gpuops-mig-20260101t120000z-1a2b3c4d-migreconfigurefailed"


def test_failure_without_a_message_keeps_the_result_and_long_messages_are_cut():
    out = records.node_failure("gpu-1", RUN, None, {"rc": 3, "stderr": "boom"}, "", NOW)
    assert "failed at '?': {\"rc\": 3, \"stderr\": \"boom\"}" in out["message"]
    long = records.node_failure("gpu-1", RUN, "x", {"msg": "y" * 5000}, "l", NOW)
    assert len(long["event"]["message"]) == records.MESSAGE_LIMIT


def test_success_clears_the_annotation_and_supersedes_with_a_normal_event():
    out = records.node_success("gpu-1", RUN, "all-3g", NOW)
    assert out["annotations"] == {"gpuops.mig/last-error": None}
    assert (out["event"]["reason"], out["event"]["type"]) == ("MigReconfigured", "Normal")
    assert out["event"]["message"] == "MIG layout 'all-3g' applied (gpuops.mig run 20260101T120000Z-1a2b3c4d)"
