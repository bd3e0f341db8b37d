# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""How many polls a role's wait makes: its timeout over its delay, rounded up, at least one; and
whether a Kubernetes call that failed is worth another try."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._input import count, number, pattern
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import describe


def _seconds(value, what: str) -> float:
    # Role variables arrive as ints or as strings of them (inventory, -e), in ASCII digits;
    # anything else (" 30", "30\n", "\u0663\u0660", "nan") is a mistake to name.
    seconds = number(value)
    if seconds is None:
        raise RefusedError("%s must be a number of seconds, got %s" % (what, describe(value)))
    if not math.isfinite(seconds) or seconds < 0:
        raise RefusedError("%s must be a number of seconds, 0 or more, got %s" % (what, describe(value)))
    return seconds


def retries(timeout: Any, delay: Any) -> int:
    """Polls of an `until` loop that waits `timeout` seconds, `delay` apart: ceil(timeout / delay), at least 1
    (a timeout of 0 still looks once)."""
    timeout_s = _seconds(timeout, "the wait's timeout")
    delay_s = _seconds(delay, "the wait's delay")
    if delay_s == 0:
        raise RefusedError("the wait's delay must be more than 0 seconds, got %s" % describe(delay))
    return max(int(math.ceil(timeout_s / delay_s)), 1)


# A Kubernetes call's failure that another try may not meet: the API server's 5xx or 429 (as
# kubernetes.core's result's status, or "(503)" in a message), a timeout, or a connection that
# failed or broke.
_TRANSIENT = pattern(r"\((429|5\d\d)\)|\b(429|5\d\d) (Internal Server Error|"
                     r"Service Unavailable|Bad Gateway|Gateway Timeout|Too Many Requests)|"
                     r"Max retries exceeded|timed out|[Tt]imeout|"
                     r"Connection (refused|reset|aborted)|RemoteDisconnected|ProtocolError|"
                     r"NewConnectionError|ServiceUnavailable|InternalError")


def api_settled(result: Mapping[str, Any] | None) -> bool:
    """Whether a Kubernetes task's result is final (an `until` stops): it succeeded, or it failed
    for a reason a retry does not fix (404, 403, 409, 422, a bad definition). A 5xx or 429 answer,
    a timeout or a broken connection is not final: the role tries again, a few times with a delay,
    before it gives up."""
    result = result or {}
    if not result.get("failed"):
        return True
    status = result.get("status")
    code = count(status, 3)
    if code is not None:
        return not (code == 429 or code >= 500)
    return not _TRANSIENT.search("%s %s" % (result.get("msg") or "", result.get("reason") or ""))
