"""The mig_node role's failure messages (plugins/plugin_utils/_node_messages.py)."""

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_messages as m

MODE = {"gpus": [
    {"index": 0, "name": "NVIDIA A30", "action_required": "reboot", "hint": "a reset is refused in a VM",
     "mig_mode": {"current": "disabled", "pending": "enabled"}},
    {"index": 1, "name": "NVIDIA A30", "action_required": "none"},
    {"index": 2, "name": "NVIDIA A30", "action_required": "reset", "hint": "idle", "mig_mode": {"current": 0, "pending": 1}},
]}


def test_mode_still_pending_names_each_gpu_and_what_to_do():
    assert m.mode_still_pending("box", MODE, False, False) == (
        "box: the MIG mode is still pending on GPU 0 (NVIDIA A30, reboot needed: a reset is refused in a VM); "
        "GPU 2 (NVIDIA A30, reset needed: idle). A reboot would apply it, but mig_node_reboot is false: reboot the "
        "node (or set mig_node_reboot=true) and run again.")
    assert m.mode_still_pending("box", MODE, True, True).endswith("It was rebooted once in this run already.")
    assert m.mode_still_pending("box", {}, False, True) == "box: the MIG mode is still pending on no GPU. A reboot would apply it."


def test_mode_still_pending_after_the_reboot_says_each_gpus_mode():
    assert m.mode_still_pending("box", MODE, after_reboot=True) == (
        "box: the MIG mode is still wrong after the reboot on GPU 0 (NVIDIA A30: current disabled, pending enabled; "
        "a reset is refused in a VM); GPU 2 (NVIDIA A30: current 0, pending 1; idle). Not rebooting again.")
    assert m.mode_still_pending("box", {}, True, False, True) == (
        "box: the MIG mode is still wrong after the reboot on no GPU. Not rebooting again.")


def test_reconfigure_failed_says_what_was_put_back():
    out = m.reconfigure_failed("n1", "Apply the MIG geometry", {"msg": "GPU 0: busy.\n"}, False, True,
                               "nvidia.com/mig.config.state", 900)
    assert out == ("MIG reconfiguration of n1 failed at 'Apply the MIG geometry': GPU 0: busy. GPU clients were restored, "
                   "the node stays cordoned and is labelled nvidia.com/mig.config.state=failed; fix the cause and run again.")
    assert m.reconfigure_failed("h", "x", {}, False, False, "s", 1) == (
        "MIG reconfiguration of h failed at 'x': ?. GPU clients were restored; fix the cause and run again.")
    rebooting = m.reconfigure_failed("n2", "Wait for the new boot", {}, True, True, "s", 5)
    assert rebooting == ("MIG reconfiguration of n2 failed at 'Wait for the new boot': no new boot id. The host did not "
                         "come back from its reboot within 5 s: bring it up (its stopped services start at boot); the GPU "
                         "Operator operands were unpaused, the node stays cordoned and is labelled s=failed; then run again.")
    assert m.reconfigure_failed("n", None, "text", False, False, "s", 1).startswith("MIG reconfiguration of n failed at '?': text.")
