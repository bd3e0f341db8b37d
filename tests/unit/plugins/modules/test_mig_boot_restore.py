"""gpuops.mig.mig_boot_restore: installs, keeps in step and removes the boot-time restore."""

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
from ansible_collections.gpuops.mig.plugins.modules import mig_boot_restore

import gpuops_mig_sim as sim

LAYOUT = [{"gpus": "all", "devices": {"3g.40gb": 2}}]


def args(root, **extra):
    base = {"layouts": LAYOUT, "root": str(root), "python": "/usr/bin/python3"}
    base.update(extra)
    return base


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The test host's root; systemctl finds the units installed under it."""
    root = tmp_path / "node"
    monkeypatch.setenv("SYSTEMD_UNIT_PATH", str(root / "etc/systemd/system"))
    return root


def tree(root):
    found = {}
    for top, _dirs, files in os.walk(str(root)):
        for name in files:
            path = os.path.join(top, name)
            with open(path) as handle:
                found[os.path.relpath(path, str(root))] = handle.read()
    return found


def test_installs_once_then_stays_in_step(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    root = node
    first = run_module(mig_boot_restore, args(root))
    assert first["changed"] is True and first["unit"]["enabled"] is True and first["unit"]["reloaded"] is True
    installed = tree(root)
    assert "etc/systemd/system/gpuops-mig-restore.service" in installed
    assert "usr/local/sbin/gpuops-mig-restore" in installed
    engine = [p for p in installed if p.startswith("usr/local/lib/gpuops-mig/") and p.endswith("_host_mode.py")]
    assert engine, sorted(installed)
    # The desired state is written last and carries the stamp the module returned.
    assert first["written"][-1].endswith("etc/gpuops-mig/desired.json")
    assert boot_restore.installed_stamp(str(root / "etc/gpuops-mig")) == first["stamp"]
    desired = json.loads(installed["etc/gpuops-mig/desired.json"])
    assert desired["layouts"] == LAYOUT and desired["wait_for_driver"] == 0

    again = run_module(mig_boot_restore, args(root))
    assert again["changed"] is False and again["written"] == [] and again["stamp"] == first["stamp"]


def test_a_changed_layout_rewrites_only_the_desired_state(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    root = node
    first = run_module(mig_boot_restore, args(root))
    other = run_module(mig_boot_restore, args(root, layouts=[{"gpus": "all", "devices": {"1g.10gb": 7}}]))
    assert other["changed"] is True and other["stamp"] != first["stamp"]
    assert [os.path.relpath(p, str(root)) for p in other["written"]] == ["etc/gpuops-mig/desired.json"]
    assert other["unit"]["reloaded"] is False


def test_check_mode_reports_and_writes_nothing(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    root = node
    result = run_module(mig_boot_restore, args(root), check_mode=True)
    assert result["changed"] is True and result["written"]
    assert not root.exists()


def test_a_driver_container_orders_the_unit_after_kubelet_and_waits(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    root = node
    run_module(mig_boot_restore, args(root, driver_root="/run/nvidia/driver"))
    installed = tree(root)
    unit = installed["etc/systemd/system/gpuops-mig-restore.service"]
    before = [line for line in unit.splitlines() if line.startswith("Before=")]
    after = [line for line in unit.splitlines() if line.startswith("After=")]
    assert not any("kubelet" in line for line in before)
    assert any("kubelet.service" in line for line in after)
    desired = json.loads(installed["etc/gpuops-mig/desired.json"])
    assert desired["driver_root"] == "/run/nvidia/driver" and desired["wait_for_driver"] == 900


def test_absent_disables_and_removes_everything(sim_host, run_module, node):
    state = sim_host("1xH100-SXM5-80GB")
    root = node
    run_module(mig_boot_restore, args(root))
    units = json.load(open(state + ".systemd.json"))["units"]
    assert units["gpuops-mig-restore.service"]["enabled"] is True
    removed = run_module(mig_boot_restore, {"state": "absent", "root": str(root)})
    assert removed["changed"] is True and removed["unit"]["disabled"] is True
    assert tree(root) == {}
    assert run_module(mig_boot_restore, {"state": "absent", "root": str(root)})["changed"] is False


def test_the_installed_restore_applies_the_layout_at_boot(sim_host, run_module, tmp_path):
    """The engine copy runs on its own (no collection on the path) and brings the layout back."""
    state = sim_host("1xH100-SXM5-80GB")
    root = tmp_path / "node"
    run_module(mig_boot_restore, args(root, python=sys.executable))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if "simulator" in p))
    proc = subprocess.run([str(root / "usr/local/sbin/gpuops-mig-restore"), "--desired", str(root / "etc/gpuops-mig/desired.json")],
                          env=env, capture_output=True, text=True, cwd=str(tmp_path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gpu = sim.load_state(state)["gpus"][0]
    assert gpu["mig"]["current"] == 1 and len(gpu["gpu_instances"]) == 2


@pytest.mark.parametrize("extra, message", [
    ({"nvidia_smi": "nvidia-smi; reboot"}, "nvidia_smi: 'nvidia-smi; reboot' has shell syntax (';')"),
    ({"nvidia_smi": "nvidia-smi -r"}, "nvidia_smi: 'nvidia-smi -r' has spaces or arguments"),
    ({"python": "python3"}, "python: 'python3' is not an absolute path; python takes the absolute path of a program"),
    ({"python": "/nonexistent/python3"}, "python: /nonexistent/python3 is not an executable file"),
    ({"python": "/usr/bin/python3 -I"}, "python: '/usr/bin/python3 -I' has spaces or arguments"),
    ({"driver_root": ""}, "driver_root is empty; use auto, / or the driver's root directory"),
])
def test_programs_it_would_run_at_boot_are_checked_before_anything_is_written(node, run_module, extra, message):
    result = run_module(mig_boot_restore, args(node, **extra))
    assert result["failed"] is True
    assert result["msg"].startswith(message), result["msg"]
    assert not os.path.exists(str(node))
