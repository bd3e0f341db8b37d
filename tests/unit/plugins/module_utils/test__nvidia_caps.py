"""/dev/nvidia-caps made current from the driver's capabilities in /proc (module_utils/_nvidia_caps.py), under a
host root laid out as the driver and the simulator (simulator/gpuops_mig_sim/procfs.py) lay it out."""

import os
import shutil
import stat

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_caps as caps

MAJOR = 237
needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="creating character devices needs root")


def driver(root, files, major=MAJOR):
    """<root>/proc as the driver shows it: {name under capabilities: (minor, mode)}."""
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc" / "devices").write_text("Character devices:\n195 nvidia\n%d nvidia-caps\n\nBlock devices:\n"
                                           "  8 sd\n" % major if major else "Character devices:\n195 nvidia\n")
    top = root / "proc" / "driver" / "nvidia" / "capabilities"
    shutil.rmtree(top, ignore_errors=True)
    for name, (minor, mode) in files.items():
        path = top / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n" % (minor, mode))


BASE = {"mig/config": (1, 0o400), "mig/monitor": (2, 0o444)}
ONE_GI = dict(BASE, **{"gpu0/mig/gi1/access": (12, 0o444), "gpu0/mig/gi1/ci0/access": (13, 0o444)})


def nodes(root):
    """{name: (kind, major, minor, mode)} of <root>/dev/nvidia-caps."""
    out = {}
    directory = root / "dev" / "nvidia-caps"
    for name in sorted(os.listdir(directory)) if directory.exists() else []:
        st = os.lstat(directory / name)
        kind = "chr" if stat.S_ISCHR(st.st_mode) else "file"
        out[name] = (kind, os.major(st.st_rdev) if kind == "chr" else None,
                     os.minor(st.st_rdev) if kind == "chr" else None, stat.S_IMODE(st.st_mode))
    return out


@needs_mknod
def test_missing_nodes_are_created_with_the_drivers_numbers_and_modes(tmp_path):
    driver(tmp_path, ONE_GI)
    lines = caps.refresh(str(tmp_path))
    assert nodes(tmp_path) == {"nvidia-cap1": ("chr", MAJOR, 1, 0o400), "nvidia-cap2": ("chr", MAJOR, 2, 0o444),
                               "nvidia-cap12": ("chr", MAJOR, 12, 0o444), "nvidia-cap13": ("chr", MAJOR, 13, 0o444)}
    assert "nvidia-cap12 created (gpu0/mig/gi1/access)" in lines and len(lines) == 4
    assert caps.refresh(str(tmp_path)) == []                              # current: nothing to do


@needs_mknod
def test_stale_nodes_are_removed_wrong_ones_replaced_and_others_left_alone(tmp_path):
    driver(tmp_path, ONE_GI)
    caps.refresh(str(tmp_path))
    directory = tmp_path / "dev" / "nvidia-caps"
    os.chmod(directory / "nvidia-cap2", 0o666)                            # a mode the driver does not give
    os.unlink(directory / "nvidia-cap1")
    os.mknod(directory / "nvidia-cap1", stat.S_IFCHR | 0o400, os.makedev(MAJOR + 1, 1))   # an old major
    (directory / "README").write_text("not a capability node\n")
    # The GPU instance is gone, another one came.
    driver(tmp_path, dict(BASE, **{"gpu0/mig/gi2/access": (21, 0o444), "gpu0/mig/gi2/ci0/access": (22, 0o444)}))
    actions = caps.plan(str(tmp_path))
    assert [(a, os.path.basename(p)) for a, p, _c in actions] == [
        ("replace", "nvidia-cap1"), ("chmod", "nvidia-cap2"), ("create", "nvidia-cap21"), ("create", "nvidia-cap22"),
        ("remove", "nvidia-cap12"), ("remove", "nvidia-cap13")]
    caps.apply(str(tmp_path), actions)
    assert nodes(tmp_path) == {"README": ("file", None, None, 0o644), "nvidia-cap1": ("chr", MAJOR, 1, 0o400),
                               "nvidia-cap2": ("chr", MAJOR, 2, 0o444), "nvidia-cap21": ("chr", MAJOR, 21, 0o444),
                               "nvidia-cap22": ("chr", MAJOR, 22, 0o444)}


def test_check_mode_and_a_host_without_mig_capabilities_change_nothing(tmp_path):
    assert caps.refresh(str(tmp_path)) == []                              # no driver /proc at all
    driver(tmp_path, ONE_GI)
    assert len(caps.refresh(str(tmp_path), check_mode=True)) == 4
    assert not (tmp_path / "dev").exists()


@pytest.mark.parametrize("setup, message", [
    (lambda root: driver(root, ONE_GI, major=None), "has no nvidia-caps character major"),
    (lambda root: driver(root, dict(BASE, **{"gpu0/mig/gi1/access": (1, 0o444)})), "both claim minor 1"),
    (lambda root: (driver(root, BASE), (root / "proc/driver/nvidia/capabilities/mig/config").write_text("junk\n")),
     "mig/config is not a capability file of the NVIDIA driver"),
])
def test_what_cannot_be_read_is_refused_and_nothing_changes(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(caps.CapsError, match=message):
        caps.refresh(str(tmp_path))
    assert not (tmp_path / "dev").exists()
