# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the ansible-runner launch: the job's hosts converged, the others were left alone."""

import os

import yaml

from bedview import BED, expected_devices, gpu_state, mig_devices

JOB_HOSTS = ("h100-0", "a30-0")


def test_survey_answers_were_strings():
    with open(os.path.join(BED, "awx-job", "env", "extravars"), encoding="utf-8") as handle:
        extravars = yaml.safe_load(handle)
    assert extravars["gpuops_mig_serial"] == "2" and extravars["gpuops_mig_canary"] == "true"
    with open(os.path.join(BED, "awx-job", "artifacts", "job", "status"), encoding="utf-8") as handle:
        assert handle.read().strip() == "successful"


def test_job_hosts_converged_and_others_untouched(cluster, name):
    state = gpu_state(name)
    labels = cluster.labels(name)
    if name in JOB_HOSTS:
        for gpu in state["gpus"]:
            assert mig_devices(gpu) == expected_devices("fleet-a", gpu["model"])
        assert labels["nvidia.com/mig.config.state"] == "success"
    else:
        assert all(not gpu["gpu_instances"] for gpu in state["gpus"])
        assert "nvidia.com/mig.config.state" not in labels
    assert not cluster.node(name).spec.unschedulable
