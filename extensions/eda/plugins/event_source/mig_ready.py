# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""ansible-rulebook event source gpuops.mig.mig_ready: the Nodes the MIG-ready gate holds.

One watch of Nodes in a thread (the Kubernetes client blocks); the event loop keeps which Nodes are
held and which changed, with the decisions in plugins/plugin_utils/_mig_ready.py (GateTracker).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

DOCUMENTATION = r"""
---
short_description: Emit the Nodes held by the MIG-ready startup taint when they change, and when
  overdue.
description:
  - >-
    An ansible-rulebook event source that watches Nodes. A Node is held when it carries the startup
    taint O(taint), or the GPU Operator's C(nvidia.com/mig.config) label without
    C(nvidia.com/mig.config.state=success). Once what decides its readiness changes (labels,
    annotations, the C(nvidia.com/) resources it advertises, its taints) and stays unchanged for
    O(settle_seconds), it emits
    C({"mig_ready": {"nodes": [names], "overdue": [names], "held_seconds": {name: s}}}), one
    event for every held Node that changed. A Node held O(converge_seconds) after it registered is
    named once in C(overdue), so that the rulebook can run the node workflow on it.
  - >-
    The watch resumes from the last C(resourceVersion), lists again on 410 Gone, and reconnects
    with a backoff (1 s doubling up to O(reconnect_max_seconds)). Connection settings as for
    C(gpuops.mig.mig_demand).
options:
  taint:
    description: The startup taint, C(key[=value]:effect) (checked as Kubernetes checks it).
    type: str
    default: gpuops.mig/not-ready:NoSchedule
  settle_seconds:
    description: Seconds a held Node must stay unchanged before it is emitted (0 to 86400).
    type: float
    default: 2
  converge_seconds:
    description: Seconds after a held Node registered at which it is emitted as overdue (0 to
      86400).
    type: float
    default: 600
  kubeconfig:
    description: Path of a kubeconfig file.
    type: str
  context:
    description: The kubeconfig context to use.
    type: str
  watch_timeout_seconds:
    description: Seconds one watch request lasts before it is renewed from the last
      C(resourceVersion); a whole number from 1 to 86400.
    type: int
    default: 300
  reconnect_max_seconds:
    description: The longest wait between two reconnection attempts, more than 0 and at most
      86400 seconds.
    type: float
    default: 30
"""

EXAMPLES = r"""
- gpuops.mig.mig_ready:
    taint: startup-taint.cluster-autoscaler.kubernetes.io/gpuops-mig:NoSchedule
    converge_seconds: 900
"""


def _import_utils():
    """plugin_utils._mig_ready and _demand of the collection this file belongs to."""
    try:
        from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand, _mig_ready
    except ImportError:
        here = os.path.abspath(__file__)
        for _level in range(8):
            here = os.path.dirname(here)
        if here not in sys.path:
            sys.path.append(here)
        from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand, _mig_ready
    return _demand, _mig_ready


demand, gate = _import_utils()


_client = demand.api_client


def _watch(args, deliver, stop):
    """List, then watch Nodes from the last resourceVersion, until ``stop``; hands ("listed",
    nodes), ("event", (type, node)) and ("error", text) to the event loop."""
    import json

    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    watch_settings = demand.watch_settings(args)     # checked by main() already
    backoff = demand.Backoff(most=watch_settings["reconnect_max_seconds"])
    timeout = watch_settings["watch_timeout_seconds"]
    core = resource_version = None
    while not stop.is_set():
        try:
            if core is None:
                core = client.CoreV1Api(_client(args))
            if resource_version is None:
                response = core.list_node(_preload_content=False, _request_timeout=30)
                try:
                    body = json.loads(response.data)
                finally:
                    response.release_conn()
                resource_version = body["metadata"]["resourceVersion"]
                deliver("listed", body.get("items") or [])
            stream = watch.Watch().stream(
                core.list_node,
                resource_version=resource_version,
                timeout_seconds=timeout,
                allow_watch_bookmarks=True,
                _request_timeout=timeout + 30,
            )
            for event in stream:
                obj = event.get("raw_object") or {}
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion"
                ) or resource_version
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    deliver("event", (event["type"], obj))
                elif event.get("type") == "ERROR" and obj.get("code") == 410:
                    resource_version = None
                    break
                if stop.is_set():
                    return
            backoff.succeeded()
        except ApiException as exc:
            if exc.status == 410:
                resource_version = None
                continue
            deliver(
                "error", "the Kubernetes API answered %s %s for Nodes" % (exc.status, exc.reason)
            )
            stop.wait(backoff.failed())
        except (
            Exception
        ) as exc:  # connection refused or reset: keep the resourceVersion, reconnect
            deliver(
                "error",
                "watching Nodes failed: %s"
                % (str(exc).splitlines() or [exc.__class__.__name__])[0],
            )
            stop.wait(backoff.failed())


async def main(queue, args):
    """Watch Nodes and put one event on ``queue`` per settled change of the Nodes the gate holds,
    and one per Node that stays held past converge_seconds."""
    args = dict(args or {})
    taint = gate.parse_taint(args.get("taint") or "gpuops.mig/not-ready:NoSchedule", "taint")
    # Options are checked before the watch starts: negative, NaN or infinite seconds are refused.
    settle = demand.check_seconds(args.get("settle_seconds", 2), "settle_seconds")
    converge = demand.check_seconds(args.get("converge_seconds", 600), "converge_seconds")
    demand.watch_settings(args)
    tracker = gate.GateTracker(taint, converge)
    loop = asyncio.get_running_loop()
    inbox = asyncio.Queue()
    stop = threading.Event()

    deliver = demand.Handoff(loop, inbox, stop)   # nothing once the source is stopped

    threading.Thread(
        target=_watch, args=(args, deliver, stop), name="mig-ready-watch", daemon=True
    ).start()
    try:
        while True:
            try:
                what, payload = await asyncio.wait_for(
                    inbox.get(), timeout=tracker.wait(time.time(), settle)
                )
            except asyncio.TimeoutError:
                what = None
            now = time.time()
            if what == "listed":
                tracker.replace(payload, now)
            elif what == "event":
                tracker.apply(payload[0], payload[1], now)
            elif what == "error":
                print(
                    "gpuops.mig.mig_ready: %s; reconnecting" % payload, file=sys.stderr, flush=True
                )
            ready = tracker.due(now, settle)
            if ready is not None:
                await queue.put({"mig_ready": ready})
    finally:
        stop.set()


if __name__ == "__main__":
    # Run alone: print the events (python mig_ready.py [taint]).
    class _PrintQueue(object):
        async def put(self, event):
            print(event, flush=True)

    asyncio.run(main(_PrintQueue(), {"taint": sys.argv[1]} if len(sys.argv) > 1 else {}))
