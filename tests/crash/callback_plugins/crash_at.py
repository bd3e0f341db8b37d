# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only callback for the crash sweep (tests/crash/sweep.py): counts the task boundaries of the
mig_node role's node workflow and, at the one named, kills the controller and every worker and
module process it started, as a crashed controller or a killed AWX job would leave them.

GPUOPS_CRASH_AT   the 1-based boundary to die at (unset or 0: never)
GPUOPS_CRASH_LOG  a file that receives one JSON line per boundary seen: {"n", "task", "file"}

A boundary is the start of a task whose file is in roles/mig_node/tasks/ but not the preview
(which only reads): the moment between two steps of the node's change.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: crash_at
type: aggregate
short_description: kill the run at the Nth task boundary of the mig_node workflow (tests only)
description: Used by tests/crash/sweep.py; see its docstring.
"""

import json
import os
import signal

from ansible.plugins.callback import CallbackBase

WORKFLOW = os.sep + os.path.join("roles", "mig_node", "tasks") + os.sep
READ_ONLY = ("preview.yml", "settings.yml", "decide.yml")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "crash_at"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._seen = 0
        self._at = int(os.environ.get("GPUOPS_CRASH_AT") or 0)
        self._log = os.environ.get("GPUOPS_CRASH_LOG")

    def v2_playbook_on_task_start(self, task, is_conditional):
        path = (task.get_path() or "").rsplit(":", 1)[0]
        if WORKFLOW not in path or os.path.basename(path) in READ_ONLY:
            return
        self._seen += 1
        if self._log:
            with open(self._log, "a") as f:
                f.write(json.dumps({"n": self._seen, "task": task.get_name(), "file": os.path.basename(path)}) + "\n")
        if self._seen == self._at:
            # The whole process group: the controller, its forked workers and their module runs.
            os.killpg(os.getpgrp(), signal.SIGKILL)
