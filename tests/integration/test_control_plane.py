"""The test cluster's launcher refuses clearly and never leaves a process behind."""

import os
import socket
import stat

import pytest

from tests.support.controlplane import launcher
from tests.support.controlplane.launcher import BINARIES, ControlPlane, ControlPlaneError


@pytest.fixture(scope="module")
def real_bin():
    return launcher.binaries_dir()


def fake_bin(tmp_path, real_bin, **scripts):
    """A binaries directory of links to the real ones, with some replaced by shell scripts."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in BINARIES + ("kwok-stages.yaml",):
        if name in scripts:
            path = d / name
            path.write_text("#!/bin/sh\n" + scripts[name] + "\n")
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        elif name.replace("-", "_") not in scripts:
            os.symlink(os.path.join(real_bin, name), d / name)
    return str(d)


def test_a_missing_binary_is_named(tmp_path, real_bin):
    plane = ControlPlane(
        str(tmp_path / "w"), bin_dir=fake_bin(tmp_path, real_bin, kube_scheduler="")
    )
    with pytest.raises(
        ControlPlaneError, match="kube-scheduler is missing from .*scripts/control-plane.sh"
    ):
        plane.start()


def test_a_binary_of_another_version_is_refused(tmp_path, real_bin):
    bin_dir = fake_bin(tmp_path, real_bin, **{"kube-apiserver": "echo Kubernetes v1.30.0"})
    with pytest.raises(
        ControlPlaneError,
        match=r"kube-apiserver in .* is not v1\.37\.2 \(it says: " r"'Kubernetes v1\.30\.0'\)",
    ):
        ControlPlane(str(tmp_path / "w"), bin_dir=bin_dir).start()


def test_a_taken_port_is_refused(tmp_path, real_bin):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        plane = ControlPlane(str(tmp_path / "w"), bin_dir=real_bin, ports={"apiserver": port})
        with pytest.raises(
            ControlPlaneError, match=f"apiserver: port {port} on 127.0.0.1 is taken"
        ):
            plane.start()


def test_an_unusable_etcd_data_directory_is_refused(tmp_path, real_bin):
    work = tmp_path / "w"
    work.mkdir()
    (work / "etcd").write_text("not a directory")
    with pytest.raises(
        ControlPlaneError,
        match="etcd's data directory under .* is unusable: .*etcd "
        "exists and is not a directory",
    ):
        ControlPlane(str(work), bin_dir=real_bin).start()


def test_a_part_that_dies_while_starting_is_reported_and_the_others_stopped(tmp_path, real_bin):
    version = "echo Kubernetes v1.37.2"
    bin_dir = fake_bin(
        tmp_path,
        real_bin,
        **{
            "kube-apiserver": f'case "$1" in --version) {version};; '
            '*) echo "bad flag --nope" >&2; exit 3;; esac'
        },
    )
    plane = ControlPlane(str(tmp_path / "w"), bin_dir=bin_dir)
    started = []
    spawn = plane._spawn

    def recording_spawn(name, args):  # keep a handle on every process the launcher starts
        proc = spawn(name, args)
        started.append(proc)
        return proc

    plane._spawn = recording_spawn
    with pytest.raises(
        ControlPlaneError,
        match=r"kube-apiserver exited with 3 while starting; its log "
        r"\(.*kube-apiserver.log\) ends:\s+bad flag --nope",
    ):
        plane.start()
    assert len(started) == 2 and all(p.poll() is not None for p in started)  # etcd was stopped too


def test_a_cluster_starts_reports_its_version_and_stops(tmp_path, real_bin):
    with ControlPlane(str(tmp_path / "w"), bin_dir=real_bin) as plane:
        procs = [entry[1] for entry in plane.procs]
        assert len(procs) == 5 and all(p.poll() is None for p in procs)
        assert set(plane.timings) >= {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "total",
        }
        assert plane._https(plane.ports["apiserver"], "/version") == 200
    assert all(p.poll() is not None for p in procs)
