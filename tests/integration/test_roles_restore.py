"""The boot-time restore without Ansible: the engine copy, launcher and unit laid out exactly as
gpuops.mig.mig_boot_restore installs them (_boot_restore.bundle), and the simulated host's systemctl
(simulator/bin/systemctl) that runs it at a simulated boot."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESTORE = os.path.join(REPO, "tools", "gpuops-mig-restore")
SIM_BIN = os.path.join(REPO, "simulator", "bin")


@pytest.fixture
def host(tmp_path):
    """A simulated host with the engine copy installed as mig_boot_restore installs it."""
    paths = dict(config_dir=str(tmp_path / "etc"), lib_dir=str(tmp_path / "lib"), script=str(tmp_path / "restore"),
                 unit_dir=str(tmp_path / "units"))
    files, _stamp = _boot_restore.bundle(paths, {"layouts": []}, sys.executable)
    for path, (content, mode) in files.items():
        if path.startswith(paths["lib_dir"]):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(content)
            os.chmod(path, mode)
    state = str(tmp_path / "host.json")
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=state, PATH=SIM_BIN + os.pathsep + os.environ["PATH"],
               SYSTEMD_UNIT_PATH=str(tmp_path / "units"))
    # Nothing of the checkout may leak in: the engine must come from the copy (the simulator
    # comes from the venv's path, as on a test host).
    # A simulator directory on PYTHONPATH (a checkout's simulator/ under test) is kept.
    simulators = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and
                  os.path.isdir(os.path.join(p, "gpuops_mig_sim")) and not os.path.isdir(os.path.join(p, "plugins"))]
    env.pop("PYTHONPATH", None)
    if simulators:
        env["PYTHONPATH"] = os.pathsep.join(simulators)

    class Host(object):
        path = state
        dir = tmp_path

        def desired(self, **content):
            path = tmp_path / "desired.json"
            path.write_text(json.dumps(dict({"format": 1}, **content)))
            return str(path)

        def restore(self, desired, *args):
            return subprocess.run([sys.executable, RESTORE, "--desired", desired, "--engine-dir",
                                   str(tmp_path / "lib")] + list(args),
                                  capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path),
                                  check=False)

        def systemctl(self, *args):
            return subprocess.run([sys.executable, os.path.join(SIM_BIN, "systemctl")] + list(args),
                                  capture_output=True, text=True, timeout=120, env=env, check=False)

        def digest(self):
            with open(state, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
    return Host()


def layout_of(path):
    return [(g["mig"], sorted(gi["profile_id"] for gi in g["gpu_instances"])) for g in sim.load_state(path)["gpus"]]


def test_restore_sets_mode_resets_idle_gpus_and_creates_the_layout(host):
    sim.create_state(host.path, "1xA100-SXM4-40GB,1xH100-SXM5-80GB,1xA10")
    desired = host.desired(config={"version": "v1", "mig-configs": {"inference": [
        {"devices": "all", "device-filter": "0x20B010DE", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
        {"devices": "all", "device-filter": "0x233010DE", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]}},
        config_name="inference")
    dry = host.restore(desired, "--dry-run")
    assert dry.returncode == 0 and "(would change)" in dry.stdout, dry.stdout + dry.stderr
    assert all(mig == {"current": 0, "pending": 0} for mig, _instances in layout_of(host.path)[:2])

    first = host.restore(desired)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0): GPU reset done" in first.stdout
    assert layout_of(host.path) == [({"current": 1, "pending": 1}, [9, 9]),
                                    ({"current": 1, "pending": 1}, [19] * 7), (None, [])]
    again = host.restore(desired)
    assert again.returncode == 0 and again.stdout.count("(already in place)") == 2, again.stdout


def test_restore_never_reboots_a_pending_mode(host):
    sim.create_state(host.path, "1xA30-24GB")
    sim.set_host(host.path, passthrough=True)
    proc = host.restore(host.desired(layouts=[{"gpus": "all", "devices": {"4g.24gb": 1}}]))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "MIG mode still pending on GPU 0 (NVIDIA A30, 00000000:07:00.0)" in proc.stdout
    assert "not rebooting" in proc.stdout
    assert sim.load_state(host.path)["boot_count"] == 0


@pytest.mark.parametrize("content, message", [
    ({"layouts": [{"gpus": "all", "devices": {"9g.99gb": 1}}]}, "the desired state cannot be applied"),
    ({"layouts": [], "config": {}}, "exactly one of"),
])
def test_restore_refuses_bad_input_and_changes_nothing(host, content, message):
    sim.create_state(host.path, "1xA100-SXM4-40GB")
    before = host.digest()
    proc = host.restore(host.desired(**content))
    assert proc.returncode == 1 and message in proc.stdout, proc.stdout + proc.stderr
    assert host.digest() == before


def test_simulated_systemctl_holds_gpu_clients_and_boots_enabled_units(host):
    sim.create_state(host.path, "1xA100-SXM4-40GB")
    sim.set_host(host.path, add_clients=["nvidia-dcgm"])
    show = host.systemctl("show", "nvidia-dcgm.service")
    assert "ActiveState=active" in show.stdout and "LoadState=loaded" in show.stdout
    assert "LoadState=not-found" in host.systemctl("show", "nvsm.service").stdout
    assert host.systemctl("stop", "nvidia-dcgm").returncode == 0
    assert sim.load_state(host.path)["host"]["clients"] == []          # a reset would now succeed
    assert host.systemctl("list-units", "--type=service", "--state=active", "--plain", "--no-legend").stdout == ""
    assert host.systemctl("start", "nvsm.service").returncode == 5      # unknown unit

    # A unit file with ExecStart: enabled units run at the simulated boot, before the GPU clients start.
    units = host.dir / "units"
    units.mkdir()
    desired = host.desired(layouts=[{"gpus": "all", "devices": {"7g.40gb": 1}}])
    (units / "gpuops-mig-restore.service").write_text(
        "[Service]\nType=oneshot\nExecStart=%s %s --desired %s --engine-dir %s\n"
        % (sys.executable, RESTORE, desired, host.dir / "lib"))
    assert host.systemctl("enable", "gpuops-mig-restore.service").returncode == 0
    assert host.systemctl("is-enabled", "gpuops-mig-restore.service", "-l").stdout == "enabled\n"
    sim.set_host(host.path, add_clients=["nvidia-dcgm"])
    assert host.systemctl("reboot").returncode == 0
    state = sim.load_state(host.path)
    assert state["boot_count"] == 1
    assert state["host"]["clients"] == ["nvidia-dcgm"]                  # enabled client started again
    assert [len(g["gpu_instances"]) for g in state["gpus"]] == [1]      # the restore ran at boot
    assert "gpuops-mig-restore.service: exit 0" in (host.dir / "host.json.boot.log").read_text()


def cdi_devices(path):
    """{device name: its device nodes} of a CDI spec."""
    import yaml
    return dict((d["name"], sorted(n["path"] for n in d["containerEdits"]["deviceNodes"]))
                for d in yaml.safe_load(path.read_text())["devices"])


def caps_nodes(root):
    """{name: (major, minor)} of <root>/dev/nvidia-caps."""
    directory = root / "dev" / "nvidia-caps"
    return dict((p.name, (os.major(p.lstat().st_rdev), os.minor(p.lstat().st_rdev)))
                for p in sorted(directory.iterdir())) if directory.exists() else {}


@pytest.mark.skipif(os.geteuid() != 0, reason="creating character devices needs root")
def test_after_a_reboot_the_restore_makes_device_nodes_and_the_cdi_spec_current(host):
    root = host.dir / "root"
    sim.create_state(host.path, "1xA100-SXM4-40GB", mig="enabled", root=str(root))
    spec = root / "etc" / "cdi" / "nvidia.yaml"
    spec.parent.mkdir(parents=True)
    generate = [os.path.join(SIM_BIN, "nvidia-ctk"), "cdi", "generate", "--output=%s" % spec]
    subprocess.run(generate, env=dict(os.environ, GPUOPS_MIG_SIMULATE=host.path), check=True)
    desired = host.desired(layouts=[{"gpus": "all", "devices": {"3g.20gb": 2}}], device_nodes_root=str(root),
                           cdi_spec_paths=[str(root / "var" / "run" / "cdi" / "nvidia.yaml"), str(spec)])

    def current():
        """The spec lists exactly the MIG devices there are, and /dev/nvidia-caps holds exactly their nodes."""
        state = sim.load_state(host.path)
        gis = sorted(state["gpus"][0]["gpu_instances"], key=lambda gi: gi["id"])
        mig = dict((name, nodes) for name, nodes in cdi_devices(spec).items() if ":" in name or name.startswith("MIG-"))
        assert sorted(n for n in mig if ":" in n) == ["0:%d" % i for i in range(len(gis))]
        assert sorted(n for n in mig if n.startswith("MIG-")) == sorted(gi["compute_instances"][0]["uuid"]
                                                                        for gi in gis)
        wanted = {"nvidia-cap1": (237, 1), "nvidia-cap2": (237, 2)}
        for gi in gis:
            wanted["nvidia-cap%d" % (3 + 9 * gi["id"])] = (237, 3 + 9 * gi["id"])
            wanted["nvidia-cap%d" % (4 + 9 * gi["id"])] = (237, 4 + 9 * gi["id"])
        assert caps_nodes(root) == wanted
        for nodes in mig.values():      # every node a MIG device's spec entry names exists
            assert all(os.path.exists(str(root) + n) for n in nodes if "nvidia-caps" in n)
        return len(gis)

    first = host.restore(desired)
    assert first.returncode == 0, first.stdout + first.stderr
    assert current() == 2
    assert "CDI spec %s: regenerated" % spec in first.stdout and "created (gpu0/mig/gi" in first.stdout

    # A reboot: no GPU instance, an empty /dev/nvidia-caps, and a spec that still lists the old MIG devices.
    sim.reboot(host.path)
    assert caps_nodes(root) == {} and len([n for n in cdi_devices(spec) if ":" in n]) == 2
    (root / "dev" / "nvidia-caps").mkdir(parents=True)
    os.mknod(str(root / "dev" / "nvidia-caps" / "nvidia-cap120"), 0o600 | 0o020000, os.makedev(237, 120))  # stale
    at_boot = host.restore(desired)
    assert at_boot.returncode == 0, at_boot.stdout + at_boot.stderr
    assert current() == 2 and "nvidia-cap120 removed (no such capability)" in at_boot.stdout
    assert "CDI spec %s: regenerated" % spec in at_boot.stdout

    again = host.restore(desired)
    assert again.returncode == 0 and "/dev/nvidia-caps: already current" in again.stdout, again.stdout
    assert "CDI spec %s: already lists the current devices" % spec in again.stdout
