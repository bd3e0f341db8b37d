"""playbooks/bootstrap.yml on simulated hosts (connection local, as ansible-pull runs it at first
boot): the node pool's layout and the boot-time restore, ordered before kubelet, with no Kubernetes
at all.
"""

import os
import subprocess

import pytest

import gpuops_mig_sim as sim
from test_roles import Fleet, output

pytestmark = pytest.mark.playbook

POOLS = {
    "h100-1g": {
        "node_labels": {"pool": "h100-1g"},
        "gpus": 1,
        "layouts": [{"gpus": "all", "devices": {"1g.10gb": 7}}],
    },
    "a30-2g": {
        "node_labels": {"pool": "a30-2g"},
        "layouts": [{"gpus": "all", "devices": {"2g.12gb": 2}}],
    },
}


def unit(fleet, name):
    path = fleet.dir / name / "etc" / "systemd" / "system" / "gpuops-mig-restore.service"
    return path.read_text()


def systemctl(fleet, name, *args):
    """The host's init (simulator/bin/systemctl) on host `name`."""
    env = dict(
        fleet.env,
        GPUOPS_MIG_SIMULATE=fleet.state_path(name),
        SYSTEMD_UNIT_PATH=str(fleet.dir / name / "etc" / "systemd" / "system"),
    )
    tool = os.path.join(fleet.env["GPUOPS_SIM_REPO"], "simulator", "bin", "systemctl")
    subprocess.run([tool] + list(args), env=env, check=True, timeout=120)


def install_kubelet(fleet, name):
    """A kubelet stand-in in the image, enabled before the bootstrap runs (as the image has it):
    at start it writes down the GPUs and MIG devices it finds (`nvidia-smi -L`). Returns that
    file's path."""
    units = fleet.dir / name / "etc" / "systemd" / "system"
    units.mkdir(parents=True, exist_ok=True)
    seen = fleet.dir / name / "kubelet-saw"
    smi = os.path.join(fleet.env["GPUOPS_SIM_REPO"], "simulator", "bin", "nvidia-smi")
    (units / "kubelet.service").write_text(
        "[Unit]\nDescription=kubelet (test stand-in)\nAfter=network-online.target\n\n"
        "[Service]\nExecStart=/bin/sh -c '%s -L > %s'\n\n[Install]\n"
        "WantedBy=multi-user.target\n" % (smi, seen)
    )
    systemctl(fleet, name, "enable", "kubelet.service")
    return seen


def test_the_pool_layout_is_in_place_and_restored_before_kubelet_with_one_reboot_at_most(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.add("new-1", "1xH100-SXM5-80GB", kubernetes=False)
    pool_file = fleet.dir / "new-1" / "etc" / "gpuops-mig" / "pool"
    pool_file.parent.mkdir(parents=True, exist_ok=True)
    pool_file.write_text("h100-1g\n")  # what the cloud's bootstrap writes
    kubelet_saw = install_kubelet(fleet, "new-1")
    vm = fleet.add("vm-1", "1xA30-24GB", kubernetes=False, gpuops_mig_pool="a30-2g")
    sim.set_host(vm, passthrough=True)  # its reset is refused: the mode needs the one reboot
    boots = sim.boot_id(vm)
    proc = fleet.run("playbooks/bootstrap.yml", {"gpuops_mig_ready_pools": POOLS})
    assert proc.returncode == 0, output(proc)
    assert fleet.devices("new-1") == {0: {"1g.10gb": 7}}
    assert fleet.devices("vm-1") == {0: {"2g.12gb": 2}}
    assert sim.boot_id(vm) != boots
    for name in ("new-1", "vm-1"):
        before = next(
            line for line in unit(fleet, name).splitlines() if line.startswith("Before=")
        )
        assert "kubelet.service" in before.split("=", 1)[1].split()
    # A boot brings the layout back before kubelet, by the restore alone: the init starts the
    # units in the order their Before=/After= give (kubelet, enabled first, would otherwise start
    # first), and kubelet finds the seven MIG devices.
    new = fleet.state_path("new-1")
    sim.reboot(new)
    assert fleet.devices("new-1") == {0: {}}
    systemctl(fleet, "new-1", "reboot")
    assert fleet.devices("new-1") == {0: {"1g.10gb": 7}}
    boot_log = open(new + ".boot.log", encoding="utf-8").read()
    started = [line.split(":")[0] for line in boot_log.splitlines() if ": exit " in line]
    assert started == ["gpuops-mig-restore.service", "kubelet.service"], boot_log
    assert kubelet_saw.read_text().count("MIG 1g.10gb") == 7, kubelet_saw.read_text()


@pytest.mark.parametrize(
    "pool, pools, expected",
    [
        ("", POOLS, "bake host bad-1: no node pool: set gpuops_mig_pool"),
        (
            "h200",
            POOLS,
            "bake host bad-1: gpuops_mig_pool 'h200' names no pool of gpuops_mig_ready_pools",
        ),
        (
            "p",
            {"p": {"node_labels": {"a": "b"}}},
            "bake host bad-1, gpuops_mig_ready_pools[p]: names no layout",
        ),
        (
            "p",
            {
                "p": {
                    "node_labels": {"a": "b"},
                    "config": {
                        "version": "v1",
                        "mig-configs": {
                            "all-1g": [
                                {
                                    "devices": "all",
                                    "mig-enabled": True,
                                    "mig-devices": {"1g.10gb": 7},
                                }
                            ]
                        },
                    },
                    "config_name": "all-7g",
                }
            },
            "no config named 'all-7g'",
        ),
    ],
)
def test_a_bad_pool_is_refused_naming_the_bake_host_before_anything_changes(
    tmp_path, pool, pools, expected
):
    fleet = Fleet(tmp_path)
    fleet.add("bad-1", "1xH100-SXM5-80GB", kubernetes=False, gpuops_mig_pool=pool)
    before = fleet.digest("bad-1")
    proc = fleet.run("playbooks/bootstrap.yml", {"gpuops_mig_ready_pools": pools})
    assert proc.returncode != 0
    assert expected in proc.stdout, output(proc)
    assert fleet.digest("bad-1") == before
    assert not (fleet.dir / "bad-1" / "etc" / "systemd").exists()
