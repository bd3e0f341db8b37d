"""What lands in job output (AWX keeps the JSON callback's output): the role reads and writes Pods,
DaemonSets and ConfigMaps, whose specs may carry credentials in env values. None of them may appear
in a JSON-callback run of a change that drains the node, pauses the operands and restarts the
device plugin."""

import pytest

from tests.support.kubeapi import seed

from test_roles import DCGM_EXPORTER, Fleet

pytestmark = pytest.mark.playbook

SECRET = "s3cr3t-Token-4f1c9e"
LAYOUT = [{"gpus": "all", "devices": {"2g.12gb": 2}}]
FAST = {"mig_node_validate_delay": "1"}


def with_env(obj, env):
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
    spec["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return obj


def test_no_pod_or_daemonset_spec_reaches_the_json_callback(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("node-a", "1xA30-24GB", node_labels={DCGM_EXPORTER: "true"}, mig_node_layouts=LAYOUT)
    cluster.seed(
        seed.daemonset(
            "dcgm-exporter",
            namespace="gpu-operator",
            node_selector={DCGM_EXPORTER: "true"},
            env={"EXPORTER_TOKEN": SECRET},
        ),
        with_env(
            seed.pod("web-1", node="node-a", owner=("ReplicaSet", "web")), {"DB_PASSWORD": SECRET}
        ),
    )
    fleet.env.update(
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CALLBACK_RESULT_FORMAT="json"
    )

    proc = fleet.run("playbooks/site.yml", FAST)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert '"node-a"' in proc.stdout and "Mark the pods to evict" in proc.stdout  # the change ran
    assert SECRET not in proc.stdout + proc.stderr
