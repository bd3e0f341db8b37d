# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the mig_node role says when a node's change fails, on the controller (the role's fail and assert
tasks print these; plugins/filter/node_messages.py wraps them, and _node_records.node_outcome
reconfigure_failed)."""

from __future__ import annotations

import re
from typing import Any, Mapping


def _clean(text):
    """One line, without a final full stop."""
    return re.sub(r"\s+", " ", str(text)).strip().rstrip(". ")


def _gpus(mode, describe):
    return "; ".join(describe(gpu) for gpu in (mode or {}).get("gpus") or [] if gpu.get("action_required", "none") != "none")


def mode_still_pending(host: str, mode: Mapping[str, Any], rebooted: bool = False,
                       reboot_allowed: bool = True, after_reboot: bool = False) -> str:
    """The MIG mode of some GPUs is pending and the role will not (or may no longer) reboot; with
    after_reboot, the reboot did not bring it (each GPU's current and pending mode), and the role
    does not reboot again."""
    if after_reboot:
        gpus = _gpus(mode, lambda g: "GPU %s (%s: current %s, pending %s; %s)" % (
            g.get("index"), g.get("name"), (g.get("mig_mode") or {}).get("current"),
            (g.get("mig_mode") or {}).get("pending"), g.get("hint")))
        return "%s: the MIG mode is still wrong after the reboot on %s. Not rebooting again." % (
            host, gpus or "no GPU")
    gpus = _gpus(mode, lambda g: "GPU %s (%s, %s needed: %s)" % (
        g.get("index"), g.get("name"), g.get("action_required"), g.get("hint")))
    if rebooted:
        then = "It was rebooted once in this run already."
    elif not reboot_allowed:
        then = ("A reboot would apply it, but mig_node_reboot is false: reboot the node (or set mig_node_reboot=true) "
                "and run again.")
    else:
        then = "A reboot would apply it."
    return "%s: the MIG mode is still pending on %s. %s" % (host, gpus or "no GPU", then)


def reconfigure_failed(host: str, step: str | None, result: Any, reboot_in_progress: bool,
                       kubernetes: bool, state_label: str, reboot_timeout: int | str) -> str:
    """The node's change failed at `step`: why, what was put back, and what to do."""
    result = result if isinstance(result, dict) else {"msg": result}
    reason = _clean(result.get("msg") or ("no new boot id" if reboot_in_progress else result) or "?")
    labelled = "the node stays cordoned and is labelled %s=failed" % state_label
    if reboot_in_progress:
        unpaused = "; the GPU Operator operands were unpaused, " + labelled if kubernetes else ""
        then = ("The host did not come back from its reboot within %s s: bring it up (its stopped services start at "
                "boot)%s; then run again." % (reboot_timeout, unpaused))
    else:
        then = "GPU clients were restored%s; fix the cause and run again." % (", " + labelled if kubernetes else "")
    return "MIG reconfiguration of %s failed at '%s': %s. %s" % (host, step or "?", reason, then)
