"""The rollout's record filters (plugins/filter/node_records.py): mig_node_outcome as the role calls it,
and an outcome it does not know refused as AnsibleFilterError."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.mig.plugins.filter.node_records import FilterModule

FILTERS = FilterModule().filters()
RUN = {"run_id": "r-1", "controller": "ctl", "job_id": "", "started": "2026-01-01T12:00:00Z"}


def test_outcome_as_the_role_calls_it():
    done = FILTERS["mig_node_outcome"]("gpu-1", "applied", RUN, "all-3g")
    assert (done["event"]["reason"], sorted(done)) == ("MigReconfigured", ["annotations", "event", "message"])
    failed = FILTERS["mig_node_outcome"]("gpu-1", "failed", RUN, "all-3g", "Apply the MIG geometry",
                                         {"msg": "busy"}, host="node-1", reboot_in_progress=False,
                                         kubernetes=False, state_label="s", reboot_timeout=900)
    assert failed["event"]["reason"] == "MigReconfigureFailed"
    assert failed["summary"] == ("MIG reconfiguration of node-1 failed at 'Apply the MIG geometry': busy. "
                                 "GPU clients were restored; fix the cause and run again.")


def test_an_unknown_outcome_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="the outcome \"done\" is none of applied, failed"):
        FILTERS["mig_node_outcome"]("gpu-1", "done", RUN)
