"""A host whose Python lacks nvidia-ml-py (import pynvml): site.yml's preview refuses it, naming the host and
the Python, before any node changes; with gpuops_mig_preview_failure=skip it is left out and listed."""

import pytest

from test_roles import Fleet, output

pytestmark = pytest.mark.playbook

LAYOUT = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
NO_CLUSTER = {"gpuops_mig_kubernetes": False}
# The system Python has no pynvml (the venv's has): the host's GPUs cannot be read there.
WITHOUT_NVML = "/usr/bin/python3"


def test_site_refuses_a_host_without_nvidia_ml_py_and_names_it(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.add("gpu-ok", "1xH100-SXM5-80GB", kubernetes=False, mig_node_layouts=LAYOUT)
    fleet.add("gpu-nonvml", "1xH100-SXM5-80GB", kubernetes=False, mig_node_layouts=LAYOUT,
              ansible_python_interpreter=WITHOUT_NVML)
    before = {name: fleet.digest(name) for name in fleet.hosts}

    stopped = fleet.run("playbooks/site.yml", NO_CLUSTER)
    assert stopped.returncode != 0, output(stopped)
    assert "gpu-nonvml: nvidia-ml-py (import pynvml) is not importable by %s" % WITHOUT_NVML in stopped.stdout, \
        output(stopped)
    assert {name: fleet.digest(name) for name in fleet.hosts} == before      # nothing changed, on either host
    # The line that stops the rollout names the node, its failed step and the other choice.
    assert "gpu-nonvml: its preview failed at '" in stopped.stdout, output(stopped)
    assert "No node was changed: the rollout stops here. To roll out the other nodes" in stopped.stdout
    assert "set gpuops_mig_preview_failure: skip." in stopped.stdout

    skipped = fleet.run("playbooks/site.yml", dict(NO_CLUSTER, gpuops_mig_preview_failure="skip"))
    assert skipped.returncode == 0, output(skipped)
    assert fleet.digest("gpu-nonvml") == before["gpu-nonvml"]
    assert fleet.devices("gpu-ok") == {0: {"3g.40gb": 2}}
    summary = skipped.stdout.split("TASK [Show the summary]")[1]
    assert "gpu-nonvml skipped: gpu-nonvml: nvidia-ml-py (import pynvml) is not importable" in summary, summary
