# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _waits as waits
from ansible_collections.gpuops.mig.plugins.plugin_utils._waits import retries


@pytest.mark.parametrize("timeout, delay, expected", [
    (900, 10, 90),          # exact
    (901, 10, 91),          # rounded up: the last poll is not cut short
    ("300", "5", 60),       # inventory strings
    (0, 5, 1),              # a timeout of 0 still looks once
    (3, 10, 1),
    (2.5, 1, 3),
    ("2.5", "0.5", 5),      # a decimal point in ASCII text
])
def test_retries_is_the_timeout_over_the_delay_rounded_up_and_at_least_one(timeout, delay, expected):
    assert retries(timeout, delay) == expected


@pytest.mark.parametrize("timeout, delay, words", [
    ("soon", 5, "the wait's timeout must be a number of seconds, got 'soon'"),
    (900, None, "the wait's delay must be a number of seconds, got None"),
    (True, 5, "the wait's timeout must be a number of seconds"),
    (-1, 5, "0 or more"),
    (900, 0, "the wait's delay must be more than 0 seconds, got 0"),
    (float("inf"), 5, "0 or more"),
    (float("nan"), 5, "0 or more"),
    ("-5", 5, "0 or more"),
    # Issue 36: ASCII digits only (float() takes all of these).
    (" 300", 5, "the wait's timeout must be a number of seconds, got ' 300'"),
    ("300\n", 5, "the wait's timeout must be a number of seconds, got '300\\n'"),
    ("\u0663\u0660\u0660", 5, "the wait's timeout must be a number of seconds"),
    (300, "\uff15", "the wait's delay must be a number of seconds"),
    ("1_000", 5, "the wait's timeout must be a number of seconds"),
    ("1e3", 5, "the wait's timeout must be a number of seconds"),
    ("nan", 5, "the wait's timeout must be a number of seconds, got 'nan'"),
    ("inf", 5, "the wait's timeout must be a number of seconds, got 'inf'"),
])
def test_a_timeout_or_delay_that_is_not_seconds_is_refused_naming_it(timeout, delay, words):
    with pytest.raises(RefusedError) as err:
        retries(timeout, delay)
    assert words in str(err.value)


@pytest.mark.parametrize(
    "result, settled",
    [
        ({"changed": True}, True),
        ({"failed": True, "status": 404, "msg": "Failed to patch object: not found"}, True),
        ({"failed": True, "status": 409, "msg": "Conflict"}, True),
        ({"failed": True, "status": 500, "msg": "Failed to patch object"}, False),
        ({"failed": True, "status": "503"}, False),
        ({"failed": True, "status": 429, "msg": "Too Many Requests"}, False),
        (
            {
                "failed": True,
                "msg": "the node's lease (default/gpuops-mig-n) could not be released: "
                "(500)\nReason: x",
            },
            False,
        ),
        (
            {
                "failed": True,
                "msg": "HTTPSConnectionPool(host='k', port=6443): "
                "Max retries exceeded with url: /api",
            },
            False,
        ),
        (
            {
                "failed": True,
                "msg": "The ansible.builtin.k8s action failed to execute in the expected time "
                "frame (60) and was terminated",
            },
            True,
        ),
        ({"failed": True, "msg": "Read timed out. (read timeout=30)"}, False),
        ({"failed": True, "msg": "node-1: another MIG rollout holds this node"}, True),
    ],
)
def test_a_kubernetes_call_is_tried_again_only_for_what_a_retry_may_fix(result, settled):
    assert waits.api_settled(result) is settled
