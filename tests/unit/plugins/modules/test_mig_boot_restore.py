"""gpuops.mig.mig_boot_restore: installs, keeps in step and removes the boot-time restore."""

import json
import os
import pwd
import subprocess
import sys

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
from ansible_collections.gpuops.mig.plugins.modules import mig_boot_restore, mig_node_info

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


# -- only root can change what runs at boot ---------------------------------------------------

def engine_file(root, name="_host_mode.py"):
    return root / "usr/local/lib/gpuops-mig/ansible_collections/gpuops/mig/plugins/module_utils" / name


def in_step(run_module, root):
    info = run_module(mig_node_info, {"layouts": LAYOUT, "restore": {"root": str(root), "python": "/usr/bin/python3"}})
    return info["restore"]["in_step"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_owned_by_another_user_is_rewritten_and_given_back_to_root(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    run_module(mig_boot_restore, args(node))
    nobody = pwd.getpwnam("nobody")
    engine = engine_file(node)
    os.chown(str(engine), nobody.pw_uid, nobody.pw_gid)
    os.chown(str(engine.parent), nobody.pw_uid, nobody.pw_gid)
    assert in_step(run_module, node) is False

    again = run_module(mig_boot_restore, args(node))
    assert again["changed"] is True and str(engine) in again["written"] and str(engine.parent) in again["written"]
    for path in (engine, engine.parent):
        assert (path.stat().st_uid, path.stat().st_gid) == (os.geteuid(), os.getegid())
    assert in_step(run_module, node) is True


def test_code_appended_to_the_engine_is_found_and_overwritten(sim_host, run_module, node):
    """The stamp in desired.json is unchanged: only the digest of each file shows the change."""
    sim_host("1xH100-SXM5-80GB")
    first = run_module(mig_boot_restore, args(node))
    engine = engine_file(node)
    original = engine.read_text()
    with open(str(engine), "a") as handle:
        handle.write("\nimport os; os.system('id > /tmp/owned')\n")
    assert boot_restore.installed_stamp(str(node / "etc/gpuops-mig")) == first["stamp"]
    assert in_step(run_module, node) is False

    again = run_module(mig_boot_restore, args(node))
    assert again["changed"] is True and again["written"] == [str(engine)]
    assert engine.read_text() == original
    assert in_step(run_module, node) is True


def test_modes_are_set_on_every_write_and_drift_is_repaired(sim_host, run_module, node):
    sim_host("1xH100-SXM5-80GB")
    old_umask = os.umask(0o077)      # a umask that would leave the files root's only
    try:
        run_module(mig_boot_restore, args(node))
    finally:
        os.umask(old_umask)
    unit = node / "etc/systemd/system/gpuops-mig-restore.service"
    script = node / "usr/local/sbin/gpuops-mig-restore"
    assert oct(unit.stat().st_mode & 0o7777) == oct(0o644) and oct(script.stat().st_mode & 0o7777) == oct(0o755)
    assert oct(engine_file(node).parent.stat().st_mode & 0o7777) == oct(0o755)
    unit.chmod(0o666)
    assert in_step(run_module, node) is False
    again = run_module(mig_boot_restore, args(node))
    assert again["changed"] is True and again["written"] == [str(unit)]
    assert oct(unit.stat().st_mode & 0o7777) == oct(0o644)


def test_links_at_the_scratch_and_target_paths_are_never_followed(sim_host, run_module, node, tmp_path):
    """A link where the old code wrote its scratch file (<path>.gpuops-tmp, a fixed name), at other guessable
    names, and at the installed path itself: the file it points to keeps its content and its mode."""
    sim_host("1xH100-SXM5-80GB")
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    victim.chmod(0o600)
    desired = node / "etc/gpuops-mig/desired.json"
    script = node / "usr/local/sbin/gpuops-mig-restore"
    for path in (desired, script):
        path.parent.mkdir(parents=True, exist_ok=True)
        for name in (path.name + ".gpuops-tmp", path.name + ".tmp", "." + path.name + ".tmp", path.name):
            os.symlink(str(victim), str(path.parent / name))

    result = run_module(mig_boot_restore, args(node))
    assert result["changed"] is True
    assert victim.read_text() == "root:secret\n" and oct(victim.stat().st_mode & 0o7777) == oct(0o600)
    for path in (desired, script):       # the links there were replaced by the restore's own files
        assert not path.is_symlink() and path.is_file()
    assert json.loads(desired.read_text())["installed"] == result["stamp"]


def test_a_directory_others_can_write_to_is_refused_and_nothing_is_written(sim_host, run_module, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = run_module(mig_boot_restore, args(shared / "node"))
    assert result["failed"] is True
    assert "is writable by its group and others (mode 0777)" in result["msg"] and str(shared) in result["msg"], result["msg"]
    assert "Nothing was changed" in result["msg"]
    assert list(shared.iterdir()) == []
    shared.chmod(0o775)
    result = run_module(mig_boot_restore, args(shared / "node"))
    assert result["failed"] is True and "is writable by its group (mode 0775)" in result["msg"], result["msg"]
    assert in_step(run_module, shared / "node") is False


def test_an_interpreter_others_can_change_is_refused(sim_host, run_module, node, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, str(bin_dir / "python"))
    bin_dir.chmod(0o777)
    result = run_module(mig_boot_restore, args(node, python=str(bin_dir / "python")))
    assert result["failed"] is True and not node.exists()
    assert "would run %s at boot as root" % (bin_dir / "python") in result["msg"], result["msg"]
    assert "%s is writable by its group and others" % bin_dir in result["msg"], result["msg"]
    result = run_module(mig_boot_restore, args(node, python="python3"))
    assert result["failed"] is True and "is not an absolute path" in result["msg"], result["msg"]


def test_a_module_planted_in_the_engine_dir_is_removed(sim_host, run_module, node):
    """The launcher puts the engine dir first on the path: a json.py there would run as root at boot."""
    sim_host("1xH100-SXM5-80GB")
    run_module(mig_boot_restore, args(node))
    planted = node / "usr/local/lib/gpuops-mig/json.py"
    planted.write_text("import os\n")
    (node / "usr/local/lib/gpuops-mig/extra").mkdir()
    assert in_step(run_module, node) is False
    again = run_module(mig_boot_restore, args(node))
    assert again["changed"] is True and again["written"] == []
    assert again["removed"] == [str(node / "usr/local/lib/gpuops-mig/extra"), str(planted)]
    assert not planted.exists() and in_step(run_module, node) is True


def test_an_import_path_others_can_change_is_refused(sim_host, run_module, node, tmp_path):
    """A .pth file that another user could write into site-packages runs as root at boot: the
    interpreter's site-packages, its .pth files and what they add are checked like the interpreter
    itself."""
    sim_host("1xH100-SXM5-80GB")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert boot_restore.unsafe_import_path(python, 0) is None
    site.chmod(0o777)
    result = run_module(mig_boot_restore, args(node, python=python))
    assert result["failed"] is True and not node.exists()
    assert "%s is writable by its group and others" % site in result["msg"], result["msg"]
    site.chmod(0o755)
    pth = site / "nobody.pth"
    pth.write_text("import os\n")
    pth.chmod(0o666)
    result = run_module(mig_boot_restore, args(node, python=python))
    assert (
        result["failed"] is True
        and "%s is writable by its group and others" % pth in result["msg"]
    )
    assert "a .pth file Python runs at start-up" in result["msg"]
    pth.chmod(0o644)
    added = tmp_path / "added"
    added.mkdir(mode=0o777)
    added.chmod(0o777)
    pth.write_text("%s\n" % added)
    result = run_module(mig_boot_restore, args(node, python=python))
    assert (
        result["failed"] is True
        and "%s is writable by its group and others" % added in result["msg"]
    )
    added.chmod(0o755)
    assert run_module(mig_boot_restore, args(node, python=python))["changed"] is True
    assert (
        "ExecStart=%s -I " % python
        in (node / "etc/systemd/system/gpuops-mig-restore.service").read_text()
    )
