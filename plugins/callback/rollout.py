# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: rollout
type: stdout
short_description: a rollout an operator can follow
version_added: 0.2.0
description:
  - Screen output for the collection's playbooks (C(site.yml), C(facts.yml), C(plan.yml), C(disable.yml)).
  - It prints the messages the playbooks mean for a person (the preview, each batch, what happens on each
    node, the summary), one time-stamped line for each step of the node workflow as a node starts it, and
    every failure in one line with its message. Task banners, C(ok), C(skipping) and C(changed) lines are
    left out, so a converged re-run prints a few lines whatever the fleet's size.
  - With C(-v) or more it prints what the default callback prints.
  - "Set it with C(ANSIBLE_STDOUT_CALLBACK=gpuops.mig.rollout) or C(stdout_callback = gpuops.mig.rollout)
    in C(ansible.cfg). In AWX, job output stays as it is: AWX uses its own callback."
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
requirements:
  - set as stdout callback in configuration
"""

import datetime

from ansible.executor.task_result import CallbackTaskResult
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

from ansible_collections.gpuops.mig.plugins.plugin_utils._progress import (
    failure_line,
    message_lines,
    node_step,
    tally,
)


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpuops.mig.rollout"

    def __init__(self):
        super().__init__()
        self._pending_play = None
        self._last_failure = {}

    # With -v the default output, whole.
    def _terse(self):
        return self._display.verbosity < 1

    def _say(self, text, color=None, stderr=False):
        if self._pending_play is not None:   # the play's header, once it has something to show
            self._display.display("== %s" % self._pending_play)
            self._pending_play = None
        self._display.display(text, color=color, stderr=stderr)

    def v2_playbook_on_play_start(self, play):
        if not self._terse():
            return super().v2_playbook_on_play_start(play)
        self._play = play
        self._pending_play = play.get_name().strip() or "(unnamed play)"

    def v2_playbook_on_task_start(self, task, is_conditional):
        if not self._terse():
            return super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task):
        if not self._terse():
            return super().v2_playbook_on_handler_task_start(task)

    def v2_playbook_on_include(self, included_file):
        if not self._terse():
            return super().v2_playbook_on_include(included_file)
        step = node_step(included_file._filename)
        if step:
            now = datetime.datetime.now().strftime("%H:%M:%S")
            for host in included_file._hosts:
                self._say("%s %s  %s" % (now, host.name, step))

    def v2_runner_on_ok(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_on_ok(result)
        self._handle_warnings(result.result)
        if result.task.action in ("debug", "ansible.builtin.debug", "ansible.legacy.debug") and "msg" in result.result:
            for line in message_lines(result.result["msg"]):
                self._say("   " + line)

    def v2_runner_on_skipped(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_on_skipped(result)

    def v2_runner_on_failed(self, result: CallbackTaskResult, ignore_errors: bool = False) -> None:
        if not self._terse():
            return super().v2_runner_on_failed(result, ignore_errors)
        self._handle_warnings(result.result)   # the failure's own line below says what the exception would
        if ignore_errors:
            return
        host = self.host_label(result)
        line = failure_line(host, result.task_name or result.task.get_name(), result.result)
        reason = line.split(": ", 2)[-1]
        # A rescued failure that the playbook fails again with the same message is said once.
        if self._last_failure.get(host) != reason:
            self._last_failure[host] = reason
            self._say(line, color="red")

    def v2_runner_on_unreachable(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_on_unreachable(result)
        if not result.task.ignore_unreachable:
            self._say("UNREACHABLE %s: %s" % (self.host_label(result), result.result.get("msg", "")), color="red")

    def v2_runner_item_on_ok(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_item_on_ok(result)

    def v2_runner_item_on_skipped(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_item_on_skipped(result)

    def v2_runner_item_on_failed(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_item_on_failed(result)
        # The task's own failure follows and says it; one line per task is enough.

    def v2_runner_retry(self, result: CallbackTaskResult) -> None:
        if not self._terse():
            return super().v2_runner_retry(result)
        left = result.result.get("retries", 0) - result.result.get("attempts", 0)
        self._say("   %s: still waiting: %s (%d tries left)" % (self.host_label(result), result.task_name, left))

    def v2_playbook_on_no_hosts_matched(self):
        if not self._terse():
            return super().v2_playbook_on_no_hosts_matched()

    def v2_playbook_on_no_hosts_remaining(self):
        if not self._terse():
            return super().v2_playbook_on_no_hosts_remaining()
        self._say("no hosts left: every host of the play failed", color="red")

    def v2_playbook_on_stats(self, stats):
        if not self._terse():
            return super().v2_playbook_on_stats(stats)
        self._pending_play = None
        for line in tally(dict((host, stats.summarize(host)) for host in stats.processed)):
            self._display.display(line if line.startswith(" ") else "-- " + line)
