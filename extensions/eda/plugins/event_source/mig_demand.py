# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""ansible-rulebook event source gpuops.mig.mig_demand: the pending MIG demand of a Kubernetes cluster.

The watch runs in a thread (the Kubernetes client blocks); the event loop only aggregates and
debounces, with the decisions in plugins/plugin_utils/_demand.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

DOCUMENTATION = r"""
---
short_description: Emit the pending MIG demand of a Kubernetes cluster, debounced, one event per change.
description:
  - An ansible-rulebook event source that watches the cluster's Pods and keeps the ones that wait for MIG
    devices (no node yet, not finished, asking for C(nvidia.com/mig-*) resources in a container's limits or
    requests).
  - It emits one event per change of the aggregated demand, not one per pod, once the demand has stayed
    unchanged for O(settle_seconds) (or has kept changing for O(max_wait_seconds)). The event is
    C({"mig_demand": {"profiles": {resource: count}, "pods": n, "oldest_pending_seconds": s,
    "fingerprint": hash}}). A fingerprint already emitted is not emitted again; when the last pending pod
    goes, one event with C(pods) 0 says so.
  - The Kubernetes client's watch runs in a thread, off the event loop. It resumes from the last
    C(resourceVersion) seen, lists again when the API answers 410 Gone, and reconnects with a backoff
    (1 s doubling up to O(reconnect_max_seconds)) when the API goes away; a re-listing that finds the same
    demand emits nothing.
  - Connection settings come from O(kubeconfig) and O(context), else C(K8S_AUTH_KUBECONFIG), C(KUBECONFIG),
    C(~/.kube/config), else the in-cluster service account.
options:
  settle_seconds:
    description: Seconds the demand must stay unchanged before it is emitted.
    type: float
    default: 30
  max_wait_seconds:
    description: Seconds after the first change at which the demand is emitted even if it keeps changing.
    type: float
    default: four times O(settle_seconds)
  namespace:
    description: Watch the Pods of this namespace only; default every namespace.
    type: str
  label_selector:
    description: Watch only the Pods with these labels (C(team=ml,tier!=batch)).
    type: str
  kubeconfig:
    description: Path of a kubeconfig file.
    type: str
  context:
    description: The kubeconfig context to use.
    type: str
  watch_timeout_seconds:
    description: Seconds one watch request lasts before it is renewed from the last C(resourceVersion).
    type: int
    default: 300
  reconnect_max_seconds:
    description: The longest wait between two reconnection attempts.
    type: float
    default: 30
"""

EXAMPLES = r"""
- gpuops.mig.mig_demand:
    settle_seconds: 60
    namespace: ml-jobs
    kubeconfig: /etc/eda/kubeconfig
"""


def _import_demand():
    """plugin_utils._demand from the collection this file belongs to (ansible-rulebook runs sources by path)."""
    try:
        from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand
    except ImportError:
        # <root>/ansible_collections/gpuops/mig/extensions/eda/plugins/event_source/mig_demand.py
        here = os.path.abspath(__file__)
        for _level in range(8):
            here = os.path.dirname(here)
        if here not in sys.path:
            sys.path.append(here)
        from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand
    return _demand


demand = _import_demand()


def _client(args):
    from kubernetes import client, config

    kubeconfig = (args.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG")
                  or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config"))
    if os.path.exists(kubeconfig):
        api_client = config.new_client_from_config(config_file=kubeconfig, context=args.get("context"))
    else:
        config.load_incluster_config()
        api_client = client.ApiClient()
    return client.CoreV1Api(api_client)


def _watch(args, deliver, stop):
    """The blocking side, in a thread: list, then watch from the last resourceVersion, until ``stop``.

    ``deliver(kind, payload)`` hands ("listed", pods) and ("event", (type, pod)) to the event loop, and
    ("error", text) for what the loop should log.
    """
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    backoff = demand.Backoff(most=float(args.get("reconnect_max_seconds", 30)))
    timeout = int(args.get("watch_timeout_seconds", 300))
    namespace, selector = args.get("namespace"), args.get("label_selector") or ""
    api = resource_version = None
    while not stop.is_set():
        try:
            if api is None:
                api = _client(args)
            if namespace:
                lister, list_args = api.list_namespaced_pod, {"namespace": namespace}
            else:
                lister, list_args = api.list_pod_for_all_namespaces, {}
            if resource_version is None:
                listing = lister(label_selector=selector, _preload_content=False, _request_timeout=30, **list_args)
                body = _json(listing)
                resource_version = body["metadata"]["resourceVersion"]
                deliver("listed", body.get("items") or [])
            stream = watch.Watch().stream(lister, label_selector=selector, resource_version=resource_version,
                                          timeout_seconds=timeout, allow_watch_bookmarks=True,
                                          _request_timeout=timeout + 30, **list_args)
            for event in stream:
                obj = event.get("raw_object") or {}  # the dict the API sent
                resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    deliver("event", (event["type"], obj))
                elif event.get("type") == "ERROR" and obj.get("code") == 410:
                    resource_version = None
                    break
                if stop.is_set():
                    return
            backoff.succeeded()
        except ApiException as exc:
            if exc.status == 410:  # the history is gone: list again
                resource_version = None
                continue
            deliver("error", "the Kubernetes API answered %s %s" % (exc.status, exc.reason))
            stop.wait(backoff.failed())
        except Exception as exc:  # connection refused or reset: keep the resourceVersion, reconnect later
            deliver("error", "watching pods failed: %s" % (str(exc).splitlines() or [exc.__class__.__name__])[0])
            stop.wait(backoff.failed())


def _json(response):
    import json
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


async def main(queue, args):
    """Watch pods and put one event on ``queue`` per settled change of the pending MIG demand."""
    args = dict(args or {})
    tracker = demand.DemandTracker()
    debouncer = demand.Debouncer(args.get("settle_seconds", 30), args.get("max_wait_seconds"))
    loop = asyncio.get_running_loop()
    inbox = asyncio.Queue()
    stop = threading.Event()

    def deliver(kind, payload):
        loop.call_soon_threadsafe(inbox.put_nowait, (kind, payload))

    thread = threading.Thread(target=_watch, args=(args, deliver, stop), name="mig-demand-watch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                kind, payload = await asyncio.wait_for(inbox.get(), timeout=debouncer.wait(time.time()))
            except asyncio.TimeoutError:
                kind = None
            if kind == "listed":
                tracker.replace(payload)
            elif kind == "event":
                tracker.apply(*payload)
            elif kind == "error":
                print("gpuops.mig.mig_demand: %s; reconnecting" % payload, file=sys.stderr, flush=True)
            now = time.time()
            if kind in ("listed", "event"):
                debouncer.observe(tracker.snapshot(now), now)
            ready = debouncer.due(now)
            if ready is not None:
                await queue.put({"mig_demand": dict(ready, oldest_pending_seconds=tracker.snapshot(now)[
                    "oldest_pending_seconds"])})
    finally:
        stop.set()


if __name__ == "__main__":
    # Run alone: print the events (python mig_demand.py [settle_seconds]).
    class _PrintQueue(object):
        async def put(self, event):
            print(event, flush=True)

    asyncio.run(main(_PrintQueue(), {"settle_seconds": float(sys.argv[1]) if len(sys.argv) > 1 else 5}))
