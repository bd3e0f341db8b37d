"""The last edges of hostile input through the real modules (issue 36): a config_file that is not
a file, a NUL byte in its path, GPU selectors in other scripts' digits, numeric options that are
not finite, and an nvidia-smi -r that never returns."""

import math
import os
import socket
import time

import pytest
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.gpuops.mig.plugins.modules import (
    mig_config,
    mig_facts,
    mig_mode,
    mig_node_info,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.test__input import no_hang
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.test__nvml import process_gone
from ansible_collections.gpuops.mig.tests.unit.plugins.modules.test_mig_mode import (
    make_layout,
    modes,
)

A100_0 = "GPU 0 (NVIDIA A100-SXM4-40GB, 00000000:07:00.0)"
A100_1 = "GPU 1 (NVIDIA A100-SXM4-40GB, 00000000:0F:00.0)"


@pytest.fixture(autouse=True)
def _no_warnings_left():
    """Warnings are process-wide in ansible-core: a module run here must not hand one to the
    next test's."""
    yield
    ansible_warnings._global_warnings.clear()


def refused_unchanged(result, state, digest, file_digest, *fragments):
    assert result["failed"] is True, result
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])
    assert "Traceback" not in result["msg"]
    assert file_digest(state) == digest


@pytest.mark.parametrize("module", [mig_config, mig_mode, mig_node_info],
                         ids=["mig_config", "mig_mode", "mig_node_info"])
def test_a_config_file_that_is_not_a_regular_file_is_refused_before_it_is_opened(
        module, sim_host, run_module, file_digest, tmp_path):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    digest = file_digest(state)
    fifo = tmp_path / "config.yaml"
    os.mkfifo(str(fifo))               # open(path, "rb") would wait for a writer for ever
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "config.sock"))
    try:
        for path, kind in ((fifo, "a FIFO (named pipe)"), (tmp_path / "config.sock", "a socket"),
                           ("/dev/zero", "a character device"), (tmp_path, "a directory")):
            with no_hang(10):
                result = run_module(module, {"config_file": str(path)})
            refused_unchanged(result, state, digest, file_digest,
                              "config_file %s is %s, not a regular file; nothing was read from it"
                              % (path, kind))
    finally:
        server.close()


@pytest.mark.parametrize("module", [mig_config, mig_mode], ids=["mig_config", "mig_mode"])
def test_a_nul_byte_in_config_file_is_a_message_naming_the_option_and_the_path(
        module, sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    digest = file_digest(state)
    result = run_module(module, {"config_file": "/etc/nvidia-mig-manager/config.yaml\x00.bak"})
    refused_unchanged(result, state, digest, file_digest, "config_file "
                      "'/etc/nvidia-mig-manager/config.yaml\\x00.bak' cannot be read: ")
    assert "ValueError" not in result.get("exception", "")


@pytest.mark.parametrize("selector", ["\u0661", "\uff11", "1\n", "\t1", "\u00a01"])
def test_a_gpu_index_in_other_digits_or_with_white_space_selects_nothing(
        selector, sim_host, run_module, file_digest):
    """gpus: ["\u0661"] (Arabic-Indic one) or ["\uff11"] (fullwidth one) used to select GPU 1;
    inline layouts refuse the same strings."""
    state = sim_host("2xA100-SXM4-40GB", mig="disabled")
    digest = file_digest(state)
    for module, args in ((mig_mode, {"mode": "enabled"}), (mig_facts, {})):
        result = run_module(module, dict(args, gpus=[selector]))
        refused_unchanged(result, state, digest, file_digest, "is not a GPU selector")


def test_spaces_around_a_selector_still_name_the_gpu(sim_host, run_module):
    """Ansible splits gpus: "0, 1" into "0" and " 1"; spaces around an item are dropped."""
    sim_host("2xA100-SXM4-40GB", mig="disabled")
    facts = run_module(mig_facts, {"gpus": ["0", " 1"]})["ansible_facts"]["gpuops_mig"]
    assert [g["index"] for g in facts["gpus"]] == [0, 1]


LAYOUT = {"layouts": [{"gpus": "all", "devices": {"3g.20gb": 2}}]}


@pytest.mark.parametrize("module, args", [
    (mig_mode, {"mode": "enabled", "force_timeout": -5}),
    (mig_mode, {"mode": "enabled", "force_timeout": math.nan}),
    (mig_mode, {"mode": "enabled", "force_timeout": "inf"}),
    (mig_mode, {"mode": "enabled", "reset": True, "reset_timeout": -5}),
    (mig_mode, {"mode": "enabled", "reset": True, "reset_timeout": "nan"}),
    (mig_mode, {"mode": "enabled", "reset": True, "reset_timeout": 0}),
    (mig_config, dict(LAYOUT, force_timeout=-5)),
    (mig_config, dict(LAYOUT, force_timeout="NaN")),
    (mig_config, dict(LAYOUT, force_timeout=math.inf)),
])
def test_numeric_options_refuse_negative_nan_and_infinite_values(
        module, args, sim_host, run_module, file_digest):
    state = sim_host("1xA100-SXM4-40GB", mig="disabled" if module is mig_mode else "enabled")
    digest = file_digest(state)
    option = "reset_timeout" if "reset_timeout" in args else "force_timeout"
    refused_unchanged(run_module(module, args), state, digest, file_digest,
                      "%s must be a finite number of seconds" % option)


def warning_texts(result):
    """The module's warnings as text (ansible-core 2.19 returns each as a summary of its
    event)."""
    return [w if isinstance(w, str) else (w.get("event") or w).get("msg", str(w))
            for w in result.get("warnings") or []]


@pytest.fixture
def hanging_smi(tmp_path):
    """An nvidia-smi that never returns (a stuck GPU), and the file its child writes its PID
    to."""
    smi = tmp_path / "nvidia-smi"
    pids = tmp_path / "pids"
    smi.write_text("#!/bin/sh\nsleep 600 &\necho $! >> %s\nwait\n" % pids)
    smi.chmod(0o755)
    return str(smi), pids


def test_a_reset_that_never_returns_times_out_and_says_what_was_changed(
        sim_host, run_module, hanging_smi):
    """Disabling MIG on two A100s destroys a device and sets both modes pending; then
    nvidia-smi -r hangs."""
    smi, pids = hanging_smi
    state = sim_host("2xA100-SXM4-40GB", mig="enabled")
    make_layout(0, [(9, 0, 4, 2)])
    started = time.monotonic()
    with no_hang(60):
        result = run_module(mig_mode, {"mode": "disabled", "reset": True, "nvidia_smi": smi,
                                       "reset_timeout": 1})
    assert time.monotonic() - started < 30
    assert not result.get("failed"), result
    assert result["changed"] is True and result["reboot_required"] is True
    first, second = result["gpus"]
    assert first["reset"]["attempted"] is True and first["reset"]["ok"] is False
    assert first["reset"]["reason"] == "timed_out"
    # "and was stopped (SIGKILL)"; on a machine too loaded to end it within 5 s, "and did not end
    # when killed (PID n is left)".
    message = first["reset"]["message"]
    assert message.startswith("%s -r -i 00000000:07:00.0 did not finish within 1 s and " % smi)
    assert first["action_required"] == "reboot" and "reset_timeout" in first["hint"]
    assert second["reset"]["attempted"] is False and second["reset"]["reason"] == "not_tried"
    assert second["reset"]["message"] == "not tried: the reset of 00000000:07:00.0 timed out first"
    assert [len(g["destroyed"]) for g in result["gpus"]] == [1, 0]
    warning = result["msg"]
    # Also a warning (in a module process; in-process after an action plugin ran, Ansible shows
    # it on the controller's display instead).
    assert warning_texts(result) in ([], [warning])
    assert "The GPU reset timed out: %s: " % A100_0 in warning
    assert ("Changed before it: %s: 1 MIG device(s) destroyed, MIG mode set to disabled; %s: MIG "
            "mode set to disabled." % (A100_0, A100_1)) in warning
    assert "Still pending: %s (wants disabled, current enabled); %s" % (A100_0, A100_1) in warning
    assert ("the next run changes no mode again and, with reset=true, tries the reset again"
            in warning)
    assert modes(state) == [{"current": 1, "pending": 0}] * 2
    # The hung nvidia-smi and its child were killed with their process group.
    assert all(process_gone(pid) for pid in pids.read_text().split())
    # The next run changes no mode; with a working nvidia-smi it resets both.
    ansible_warnings._global_warnings.clear()
    again = run_module(mig_mode, {"mode": "disabled", "reset": True})
    assert all(g["reset"]["ok"] for g in again["gpus"])
    assert modes(state) == [{"current": 0, "pending": 0}] * 2
    assert again["reboot_required"] is False and again["reset_required"] is False
    assert "msg" not in again and not warning_texts(again)
