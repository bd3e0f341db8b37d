"""gpuops.mig.mig_node_info: one read-only pass gives everything the rollout decides on."""

import pytest

from ansible_collections.gpuops.mig.plugins.modules import mig_boot_restore, mig_node_info

LAYOUT = [{"gpus": "all", "devices": {"3g.40gb": 2}}]


def test_a_node_that_needs_mode_and_geometry(sim_host, run_module, file_digest):
    state = sim_host("2xH100-SXM5-80GB")
    before = file_digest(state)
    info = run_module(mig_node_info, {"layouts": LAYOUT})
    assert info["changed"] is False
    assert info["change"] == {"mode": True, "geometry": True, "any": True}
    assert info["wants_mig"] is True
    assert info["facts"]["gpu_count"] == 2 and info["facts"]["driver"]["present"] is True
    assert [g["devices"] for g in info["planned"]] == [{"3g.40gb": 2}] * 2
    assert info["restore"] is None
    assert file_digest(state) == before


def test_a_converged_node_says_so(sim_host, run_module, tmp_path):
    from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_mode
    sim_host("1xH100-SXM5-80GB")
    run_module(mig_mode, {"layouts": LAYOUT})
    run_module(mig_config, {"layouts": LAYOUT})
    restore = {"root": str(tmp_path / "node"), "python": "/usr/bin/python3"}
    info = run_module(mig_node_info, {"layouts": LAYOUT, "restore": restore})
    assert info["change"]["any"] is False
    assert info["restore"]["state"] == "present" and info["restore"]["in_step"] is False
    installed = run_module(mig_boot_restore, dict(restore, layouts=LAYOUT, enable=False))
    info = run_module(mig_node_info, {"layouts": LAYOUT, "restore": restore})
    assert info["restore"]["installed"] == installed["stamp"] == info["restore"]["wanted"]
    assert info["restore"]["in_step"] is True
    other = run_module(mig_node_info, {"layouts": [{"gpus": "all", "devices": {"1g.10gb": 7}}], "restore": restore})
    assert other["restore"]["in_step"] is False and other["change"]["geometry"] is True


def test_mig_off_wants_no_restore(sim_host, run_module, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    info = run_module(mig_node_info, {"layouts": [{"gpus": "all", "mig_enabled": False, "devices": {}}],
                                      "restore": {"root": str(tmp_path)}})
    assert info["change"]["any"] is False and info["wants_mig"] is False
    assert info["restore"] == {"state": "absent", "installed": None, "wanted": None, "in_step": True, "driver_root": "auto"}


@pytest.mark.parametrize("args, message", [
    ({"layouts": [{"gpus": "all", "devices": {"3g.20gb": 3}}]}, "Nothing was changed"),
    ({"config": "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false}]}\n", "config_name": "b",
      "config_origin": "ConfigMap gpu-operator/default-mig-parted-config"},
     "ConfigMap gpu-operator/default-mig-parted-config: no config named 'b'"),
])
def test_a_layout_that_cannot_be_applied_fails_here(sim_host, run_module, file_digest, args, message):
    state = sim_host("1xA100-SXM4-40GB")
    before = file_digest(state)
    result = run_module(mig_node_info, args)
    assert result["failed"] is True and message in result["msg"], result["msg"]
    assert file_digest(state) == before


def test_a_container_toolkit_command_with_shell_syntax_is_refused(sim_host, run_module, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    marker = tmp_path / "ran"
    result = run_module(mig_node_info, {"container_toolkit_command": "nvidia-ctk --version; touch %s" % marker})
    assert result["failed"] is True
    assert result["msg"] == ("container_toolkit_command: 'nvidia-ctk --version; touch %s' has shell syntax (';'); it "
                             "takes a program and its arguments, run without a shell" % marker)
    assert not marker.exists()


def test_without_a_layout_it_reads_the_host_only(sim_host, run_module):
    sim_host("2xH100-SXM5-80GB")
    info = run_module(mig_node_info, {})
    assert info["facts"]["gpu_count"] == 2 and info["facts"]["mig_capable_count"] == 2
    assert info["mode"] is info["geometry"] is info["change"] is info["planned"] is info["restore"] is None
    assert info["container_toolkit"] is None


def test_a_missing_driver_is_a_fact_when_asked(sim_host, run_module, monkeypatch, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    failed = run_module(mig_node_info, {"layouts": LAYOUT, "driver_root": str(tmp_path / "nowhere")})
    assert failed["failed"] is True and str(tmp_path / "nowhere") in failed["msg"]
    info = run_module(mig_node_info, {"layouts": LAYOUT, "driver_root": str(tmp_path / "nowhere"),
                                      "fail_on_missing_driver": False})
    assert info.get("failed") is not True
    assert info["facts"]["driver"]["present"] is False and str(tmp_path / "nowhere") in info["facts"]["driver"]["error"]
    assert info["change"] is None and info["facts"]["gpus"] == []


def test_container_toolkit_version_or_why_not(sim_host, run_module, tmp_path):
    sim_host("1xH100-SXM5-80GB")
    ctk = tmp_path / "ctk"
    ctk.write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\necho 'commit: abc'\n")
    ctk.chmod(0o755)
    info = run_module(mig_node_info, {"container_toolkit_command": "%s --version" % ctk})
    assert info["container_toolkit"] == {"command": "%s --version" % ctk, "rc": 0, "version": "1.17.8", "error": None}
    missing = run_module(mig_node_info, {"container_toolkit_command": str(tmp_path / "no-ctk") + " --version"})
    assert missing["container_toolkit"]["version"] is None and missing["container_toolkit"]["rc"] is None
    assert "No such file" in missing["container_toolkit"]["error"]
    ctk.write_text("#!/bin/sh\necho 'broken' >&2\nexit 3\n")
    broken = run_module(mig_node_info, {"container_toolkit_command": str(ctk)})
    assert broken["container_toolkit"] == {"command": str(ctk), "rc": 3, "version": None, "error": "broken"}
