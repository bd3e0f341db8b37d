"""The preflight checks (plugins/plugin_utils/_preflight.py), every branch."""

import os

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.plugin_utils import _preflight as p

MINIMUMS = [{"pattern": "H200", "version": "550.90.07"}, {"pattern": "H100|H800", "version": "525.85.12"},
            {"pattern": "A100", "version": "450.80.02"}]


def facts(gpus=(("NVIDIA H100 80GB HBM3", True),), version="570.124.06", present=True, error=None):
    listed = [{"index": i, "name": name, "mig_capable": capable} for i, (name, capable) in enumerate(gpus)]
    return {"driver": {"present": present, "version": version if present else None, "error": error},
            "gpus": listed, "gpu_count": len(listed), "mig_capable_count": sum(1 for g in listed if g["mig_capable"])}


def toolkit(version="1.17.8", error=None):
    return {"command": "nvidia-ctk --version", "rc": 0 if error is None else 1, "version": version, "error": error}


OPTIONS = {"require_mig_capable": True, "min_driver_versions": MINIMUMS, "container_toolkit_min_version": "1.17.8"}


def test_a_good_host_has_no_problem_and_says_it_is_ready():
    assert p.problems("gpu-1", facts(), toolkit(), OPTIONS) == []
    assert p.ready("gpu-1", facts(), toolkit()) == \
        "gpu-1: driver 570.124.06, 1 MIG-capable GPU(s) of 1 (NVIDIA H100 80GB HBM3), NVIDIA Container Toolkit 1.17.8."
    assert p.ready("gpu-1", facts(gpus=[("A100", True), ("A100", True)]), None) == \
        "gpu-1: driver 570.124.06, 2 MIG-capable GPU(s) of 2 (A100)."


def test_missing_nvml_hides_everything_else_and_names_the_python():
    missing = facts(present=False, error="nvidia-ml-py (import pynvml) is not installed")
    assert p.nvml_missing(missing) and not p.nvml_missing(facts()) and not p.nvml_missing(None)
    out = p.problems("gpu-1", missing, toolkit(error="boom"), OPTIONS, python="/usr/bin/python3")
    assert out == ["gpu-1: nvidia-ml-py (import pynvml) is not importable by /usr/bin/python3, the Python Ansible "
                   "runs there. Install it (/usr/bin/python3 -m pip install nvidia-ml-py), or set "
                   "mig_preflight_install_nvml=true."]


def test_no_driver():
    out = p.problems("gpu-1", facts(present=False, error="libnvidia-ml.so.1 not found under /run/nvidia/driver"),
                     None, OPTIONS)
    assert len(out) == 1 and "gpu-1: no usable NVIDIA driver (libnvidia-ml.so.1 not found under /run/nvidia/driver)" \
        in out[0] and "gpuops_mig_driver_root" in out[0]


def test_no_mig_capable_gpu_unless_allowed():
    host = facts(gpus=[("NVIDIA A10", False)])
    assert p.problems("gpu-1", host, None, OPTIONS) == [
        "gpu-1: no MIG-capable GPU found (GPUs: NVIDIA A10). MIG needs an A100, A30, H100, H200, B200 or newer "
        "data-center GPU; leave this host out of the MIG rollout, or set mig_preflight_require_mig_capable=false."]
    assert p.problems("gpu-1", host, None, dict(OPTIONS, require_mig_capable=False)) == []
    assert "(GPUs: none)" in p.problems("gpu-1", facts(gpus=[]), None, OPTIONS)[0]


@pytest.mark.parametrize("gpus, version, old", [
    ([("NVIDIA H200", True)], "535.183.01", ["GPU 0 (NVIDIA H200), which needs 550.90.07 or newer"]),
    ([("NVIDIA H200", True)], "550.90.07", []),
    ([("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", True)], "535.1", ["GPU 1 (NVIDIA H200), which needs 550.90.07 or newer"]),
    ([("NVIDIA A10", False)], "400.1", []),            # not MIG-capable: no minimum
    ([("NVIDIA B200", True)], "400.1", []),            # no pattern matches: no minimum
    ([("nvidia a100-sxm4-40gb", True)], "450.80.01", ["GPU 0 (nvidia a100-sxm4-40gb), which needs 450.80.02 or newer"]),
])
def test_driver_too_old_first_matching_pattern(gpus, version, old):
    assert p.too_old(facts(gpus=gpus)["gpus"], version, MINIMUMS) == old
    out = p.problems("gpu-1", facts(gpus=gpus, version=version), None, dict(OPTIONS, require_mig_capable=False))
    assert bool(out) == bool(old)
    if old:
        assert out[0].startswith("gpu-1: driver %s is too old for MIG on %s." % (version, "; ".join(old)))


def test_container_toolkit_missing_old_or_fine():
    missing = p.problems("gpu-1", facts(), toolkit(version=None, error="[Errno 2] No such file"), OPTIONS)
    assert missing == ["gpu-1: the NVIDIA Container Toolkit is not installed (nvidia-ctk --version: [Errno 2] No such "
                       "file). Install or upgrade nvidia-container-toolkit (NVIDIA's apt/yum repository), or set "
                       "mig_preflight_container_toolkit_command to '' for hosts that run no containers."]
    silent = p.problems("gpu-1", facts(), toolkit(version=None), OPTIONS)
    assert "not installed (nvidia-ctk --version: no version printed)" in silent[0]
    old = p.problems("gpu-1", facts(), toolkit(version="1.14.0"), OPTIONS)
    assert old[0].startswith("gpu-1: NVIDIA Container Toolkit 1.14.0 is older than 1.17.8.")
    assert p.problems("gpu-1", facts(), toolkit(version="1.18.0"), OPTIONS) == []
    assert p.problems("gpu-1", facts(), None, OPTIONS) == []     # not checked


def test_every_problem_is_reported_at_once():
    out = p.problems("gpu-1", facts(gpus=[("NVIDIA H200", False)], version="500.1"), toolkit(version="1.0.0"), OPTIONS)
    assert len(out) == 2     # no MIG-capable GPU, and an old toolkit (no minimum for a GPU that is not MIG-capable)


def test_version_tuple():
    assert p.version_tuple("550.90.07") == (550, 90, 7) < p.version_tuple("575.0")
    assert p.version_tuple("v1.17.8-rc1") == (1, 17, 8, 1)


ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "mig_preflight")


def _role_table():
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)["mig_preflight_min_driver_versions"]
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["mig_preflight_min_driver_versions"]
    assert spec["default"] == defaults      # the documented default is the one the role uses
    return defaults


@pytest.mark.parametrize("name, minimum", [
    # NVIDIA MIG User Guide, Deployment Considerations (R620 page).
    ("NVIDIA GB300", "595.58.03"),
    ("NVIDIA B300 SXM6 AC", "580.82.07"),
    ("NVIDIA RTX PRO 5000 Blackwell", "575.57.08"),
    ("NVIDIA RTX PRO 4500 Blackwell", "575.64"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "575.51.03"),
    ("NVIDIA H20", "535.161.07"),
    ("NVIDIA GB200", "570.133.20"),
])
def test_the_role_table_follows_the_mig_user_guide(name, minimum):
    table = _role_table()
    below = ".".join(str(n) for n in p.version_tuple(minimum)[:-1] + (p.version_tuple(minimum)[-1] - 1,))
    gpus = [{"index": 0, "name": name, "mig_capable": True}]
    assert p.too_old(gpus, minimum, table) == []
    assert p.too_old(gpus, below, table) == ["GPU 0 (%s), which needs %s or newer" % (name, minimum)]
