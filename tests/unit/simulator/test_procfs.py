"""The driver's /proc under a simulated host's root (simulator/gpuops_mig_sim/procfs.py)."""

import os

import gpuops_mig_sim as sim
from gpuops_mig_sim.state import StateStore


def capabilities(root):
    top = root / "proc" / "driver" / "nvidia" / "capabilities"
    return dict((str(p.relative_to(top)), p.read_text()) for p in sorted(top.rglob("*")) if p.is_file())


def test_the_proc_tree_follows_the_gpu_instances_and_a_reboot_empties_dev(tmp_path):
    root = tmp_path / "h1"
    state = str(tmp_path / "h1.json")
    sim.create_state(state, "2xA100-SXM4-40GB", mig="enabled", root=str(root))
    assert "237 nvidia-caps" in (root / "proc" / "devices").read_text()
    assert capabilities(root) == {
        "mig/config": "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
        "mig/monitor": "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"}

    with StateStore(state).transaction() as data:     # GPU instance 2 with compute instance 0 on GPU 1
        data["gpus"][1]["gpu_instances"].append({"id": 2, "profile_id": 9, "placement": {"start": 4, "size": 4},
                                                 "compute_instances": [{"id": 0, "profile_id": 2, "uuid": "MIG-x",
                                                                        "placement": {"start": 0, "size": 3}}]})
    found = capabilities(root)
    # The driver's table: 3 + 135 per GPU + 9 per GPU instance, its compute instances after it.
    assert found["gpu1/mig/gi2/access"].startswith("DeviceFileMinor: %d\n" % (3 + 135 + 18))
    assert found["gpu1/mig/gi2/ci0/access"].startswith("DeviceFileMinor: %d\n" % (3 + 135 + 18 + 1))

    (root / "dev" / "nvidia-caps").mkdir(parents=True)
    (root / "dev" / "nvidia-caps" / "nvidia-cap156").write_text("")
    sim.reboot(state)
    assert sorted(capabilities(root)) == ["mig/config", "mig/monitor"]       # instances do not survive it
    assert not os.path.exists(root / "dev" / "nvidia-caps")


def test_a_host_without_a_root_writes_no_proc(tmp_path):
    sim.create_state(str(tmp_path / "h2.json"), "1xA100-SXM4-40GB", mig="enabled")
    assert sorted(os.listdir(tmp_path)) == ["h2.json", "h2.json.lock"]
