"""What a rollout writes about itself: its identity, a failed node's reason, what it owes the node
(plugins/plugin_utils/_node_records.py)."""

import datetime
import json

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_messages as m
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_records as records

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
RUN = dict(run_id="20260101T120000Z-1a2b3c4d", controller="ctl-1", job_id="4711", started="2026-01-01T12:00:00Z")


def test_identity_from_the_start_time_and_awx():
    run = records.rollout_identity({}, {"JOB_ID": "99"}, "ctl-1", NOW, "1a2b3c4d")
    assert run == dict(run_id="20260101T120000Z-1a2b3c4d", controller="ctl-1", job_id="99",
                       workflow_id="", started="2026-01-01T12:00:00Z")
    sliced = records.rollout_identity({"job_id": "8", "workflow_id": "7"}, {}, "ctl-1", NOW)
    assert sliced["workflow_id"] == "7"     # awx_workflow_job_id: a sliced job's slices share it
    given = records.rollout_identity({"run_id": "mine", "job_id": 7}, {"JOB_ID": "99"}, "ctl-1", NOW)
    assert given["run_id"] == "mine" and given["job_id"] == "7"     # the extra vars win over the environment
    assert records.rollout_identity({}, {"AWX_JOB_ID": "5"}, "c", NOW)["job_id"] == "5"
    assert records.rollout_identity({}, {}, "c", NOW)["job_id"] == ""


@pytest.mark.parametrize(
    "given",
    [{"run_id": "a\nb"}, {"run_id": "x" * 10000}, {"job_id": "1 2"}, {"run_id": "-leading"},
     {"workflow_id": "7\n"}],
)
def test_run_and_job_ids_must_be_one_short_token(given):
    with pytest.raises(records.IdentityError, match="is not one token of at most 63"):
        records.rollout_identity(given, {}, "ctl-1", NOW)


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
    assert out["annotations"] == {"gpuops.mig/last-error": None, "gpuops.mig/owed": None}
    assert (out["event"]["reason"], out["event"]["type"]) == ("MigReconfigured", "Normal")
    assert out["event"]["message"] == "MIG layout 'all-3g' applied (gpuops.mig run 20260101T120000Z-1a2b3c4d)"


def test_outcome_is_the_success_or_the_failure_record():
    assert records.node_outcome("gpu-1", "applied", RUN, "all-3g", now=NOW) == records.node_success(
        "gpu-1", RUN, "all-3g", NOW)
    failed = records.node_outcome("gpu-1", "failed", RUN, "l", "x", {"msg": "y"}, now=NOW)
    assert failed == records.node_failure("gpu-1", RUN, "x", {"msg": "y"}, "l", NOW)
    assert "summary" not in failed          # the mig-manager path fails with its own message
    # uncordon.yml: only the annotations a success removes, without a run.
    assert records.node_outcome("gpu-1", "applied")["annotations"] == {
        "gpuops.mig/last-error": None, "gpuops.mig/owed": None}


def test_a_failure_given_the_host_says_what_the_role_fails_with():
    out = records.node_outcome("gpu-1", "failed", RUN, "l", "Wait for the new boot", {}, host="n2",
                               reboot_in_progress=True, kubernetes=True, state_label="s",
                               reboot_timeout=5, now=NOW)
    assert out["summary"] == m.reconfigure_failed("n2", "Wait for the new boot", {}, True, True, "s", 5)
    assert out["summary"].startswith("MIG reconfiguration of n2 failed at 'Wait for the new boot'")


@pytest.mark.parametrize("outcome", ["success", "", None, "Failed"])
def test_an_unknown_outcome_is_refused(outcome):
    with pytest.raises(records.OutcomeError, match="is none of applied, failed"):
        records.node_outcome("gpu-1", outcome, RUN)


# -- what a run owes the node -------------------------------------------------------

PREFIX = "nvidia.com/gpu.deploy."
UNITS = ["nvidia-dcgm.service loaded active running NVIDIA DCGM", "ssh.service loaded active running OpenSSH", ""]


def test_clients_to_pause_takes_deployed_operands_and_running_clients():
    labels = {PREFIX + "device-plugin": "true", PREFIX + "dcgm-exporter": "false", PREFIX + "gpu-feature-discovery": "pre"}
    out = records.clients_to_pause(labels, ["device-plugin", "dcgm-exporter", "gpu-feature-discovery", "dcgm"], PREFIX,
                                   "paused-for-mig-change", UNITS, ["nvidia-dcgm", "nvsm.service", "nvidia-dcgm.service"])
    assert out == {"operands": {PREFIX + "device-plugin": "true", PREFIX + "gpu-feature-discovery": "pre"},
                   "services": ["nvidia-dcgm.service"]}
    # No unit list: no service is stopped.
    assert records.clients_to_pause(labels, [], PREFIX, "paused-for-mig-change", None, ["nvidia-dcgm"])["services"] == []


def test_a_label_an_interrupted_run_paused_gets_its_recorded_value_back():
    labels = {PREFIX + "device-plugin": "paused-for-mig-change", PREFIX + "dcgm": "paused-for-mig-change"}
    owed = {"operands": {PREFIX + "device-plugin": "pre-installed"}}
    out = records.clients_to_pause(labels, ["device-plugin", "dcgm"], PREFIX, "paused-for-mig-change", owed=owed)
    assert out["operands"] == {PREFIX + "device-plugin": "pre-installed", PREFIX + "dcgm": "true"}


def test_owed_record_round_trip_and_settling():
    record = records.owed_record(RUN, ["nvidia-dcgm.service"], {PREFIX + "dcgm": "true"}, True, NOW)
    assert record == {"services": ["nvidia-dcgm.service"], "operands": {PREFIX + "dcgm": "true"}, "device_plugin": True,
                      "run": RUN["run_id"], "job": "4711", "time": "2026-01-01T12:00:00Z"}
    patch = records.owed_annotations(record)
    node = {"metadata": {"annotations": patch}}
    assert records.read_owed(node) == record
    assert records.settled(record, "services", "operands") == dict(record, services=[], operands={})
    assert records.settled(record, "services", "operands", "device_plugin") == {}
    assert records.owed_annotations({}) == {"gpuops.mig/owed": None}
    assert records.owed_record(RUN) == {}
    assert records.read_owed({"metadata": {}}) is None and records.read_owed(None) is None
    with pytest.raises(ValueError, match="unknown parts"):
        records.settled(record, "cordon")
    assert "run 20260101T120000Z-1a2b3c4d, interrupted, left host services stopped (nvidia-dcgm.service); GPU Operator " \
           "operands paused (nvidia.com/gpu.deploy.dcgm); the device plugin not restarted" in records.describe_owed(record)


@pytest.mark.parametrize("text", ["not json", "[]", '{"services": "nvidia-dcgm"}', '{"services": ["--all"]}',
                                  '{"operands": {"a": 1}}', '{"device_plugin": "yes"}'])
def test_a_record_gpuops_did_not_write_is_refused(text):
    with pytest.raises(records.OwedRecordError, match="is not a record gpuops.mig wrote"):
        records.read_owed({"metadata": {"annotations": {"gpuops.mig/owed": text}}})


def test_a_hosts_lock_and_owed_files_follow_its_root():
    assert records.host_files("") == {"lock": "/run/gpuops-mig/lock",
                                      "owed": "/var/lib/gpuops-mig/owed.json"}
    assert records.host_files("/sim/gpu-01") == {
        "lock": "/sim/gpu-01/run/gpuops-mig/lock",
        "owed": "/sim/gpu-01/var/lib/gpuops-mig/owed.json"}
