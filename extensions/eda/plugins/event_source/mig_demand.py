# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""ansible-rulebook event source gpuops.mig.mig_demand: the pending MIG demand of a Kubernetes cluster.

Each watched kind (Pods, ResourceClaims, Kueue Workloads) has its watch in a thread (the Kubernetes client
blocks); the event loop only aggregates them into one demand and debounces, with the decisions in
plugins/plugin_utils/_demand.py.
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
  - >-
    An ansible-rulebook event source that watches what waits for MIG devices, as C(playbooks/plan.yml) reads
    it. Pods with no node yet, not finished, asking for C(nvidia.com/mig-*) resources in a container's limits
    or requests. ResourceClaims (C(resource.k8s.io/v1)) of NVIDIA's DRA DeviceClass C(mig.nvidia.com) not
    allocated yet, whose CEL selector names one profile. Kueue Workloads waiting for admission (their pods do
    not exist yet; each pod set asks for C(count) times its template's devices).
  - >-
    It emits one event per change of the aggregated demand of all of them, not one per object, once the
    demand has stayed unchanged for O(settle_seconds) (or has kept changing for O(max_wait_seconds)). The
    event is C({"mig_demand": {"profiles": {resource: count}, "pods": n, "claims": n, "workloads": n,
    "waiting": n, "oldest_pending_seconds": s, "fingerprint": hash}}), a claim's profile named as the device
    plugin names it (C(1g.10gb) is C(nvidia.com/mig-1g.10gb)). A fingerprint already emitted is not emitted
    again, so demand for a profile no GPU offers is reported once; when the last waiting object goes, one
    event with C(waiting) 0 says so. A claim that gets allocated, or a Workload that gets admitted, leaves
    the demand.
  - >-
    Each kind's watch runs in its own thread, off the event loop. It resumes from the last
    C(resourceVersion) seen, lists again when the API answers 410 Gone, and reconnects with a backoff
    (1 s doubling up to O(reconnect_max_seconds)) when the API goes away; a re-listing that finds the same
    demand emits nothing. A cluster that does not serve ResourceClaims (before Kubernetes 1.34) or Kueue's
    Workloads (no CRD) has them not watched, said once, and looked for again every
    O(watch_timeout_seconds).
  - >-
    No event comes before every watched kind has been listed once, so the first event has the
    demand of all of them. A kind whose API keeps failing holds the others back for
    O(max_wait_seconds) (at least 30 s), said once; the demand is then emitted without it until it
    is listed.
  - >-
    Connection settings come from O(kubeconfig) and O(context), else C(K8S_AUTH_KUBECONFIG), C(KUBECONFIG),
    C(~/.kube/config), else the in-cluster service account.
options:
  settle_seconds:
    description: Seconds the demand must stay unchanged before it is emitted.
    type: float
    default: 10
  max_wait_seconds:
    description:
      - Seconds after the first change at which the demand is emitted even if it keeps changing.
      - By default three times O(settle_seconds) (30 s with the default window), so a pod waits at most that
        long for its event however many pods keep arriving; a longer value waits for a long burst to end, at
        the cost of every pod in it.
    type: float
  namespace:
    description: Watch the Pods, ResourceClaims and Workloads of this namespace only; default every namespace.
    type: str
  label_selector:
    description: Watch only the Pods with these labels (C(team=ml,tier!=batch)); claims and Workloads are not
      filtered by it (Kueue does not copy a job's labels to its Workload).
    type: str
  claims:
    description: Watch ResourceClaims of NVIDIA's DRA driver (C(resource.k8s.io/v1)).
    type: bool
    default: true
  workloads:
    description: Watch Kueue Workloads waiting for admission.
    type: bool
    default: true
  kueue_api_version:
    description: Kueue's Workload API; C(kueue.x-k8s.io/v1beta1) before Kueue 0.15.
    type: str
    default: kueue.x-k8s.io/v1beta2
    choices: [kueue.x-k8s.io/v1beta2, kueue.x-k8s.io/v1beta1]
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
- gpuops.mig.mig_demand:
    settle_seconds: 60
    namespace: ml-jobs
    kubeconfig: /etc/eda/kubeconfig

# Pods and DRA claims only; Kueue is installed but its Workloads are left to another loop.
- gpuops.mig.mig_demand:
    claims: true
    workloads: false

# An older Kueue (before 0.15) serves Workloads as v1beta1.
- gpuops.mig.mig_demand:
    kueue_api_version: kueue.x-k8s.io/v1beta1
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


_client = demand.api_client

# What the messages call each kind.
_WHAT = {demand.PODS: "pods", demand.CLAIMS: "ResourceClaims", demand.WORKLOADS: "Kueue Workloads"}


def _lister(api_client, kind, api, args):
    """(list function, its positional arguments, its keyword arguments) of one kind, namespaced or not."""
    from kubernetes import client

    namespace = args.get("namespace")
    if kind == demand.PODS:
        core = client.CoreV1Api(api_client)
        selector = {"label_selector": args.get("label_selector") or ""}
        if namespace:
            return core.list_namespaced_pod, (), dict(selector, namespace=namespace)
        return core.list_pod_for_all_namespaces, (), selector
    group, version, plural = api
    custom = client.CustomObjectsApi(api_client)   # any client version, whatever models it ships
    if namespace:
        return custom.list_namespaced_custom_object, (group, version, namespace, plural), {}
    return custom.list_cluster_custom_object, (group, version, plural), {}


def _watch(kind, api, args, deliver, stop):
    """The blocking side of one kind, in a thread: list, then watch from the last resourceVersion, until ``stop``.

    ``deliver(kind, what, payload)`` hands ("listed", objects) and ("event", (type, object)) to the event loop,
    and ("error", text) and ("note", text) for what the loop should log. Pods are always served; a kind the
    cluster does not serve (404: no Kueue CRD, no resource.k8s.io/v1) is said once, counts as none, and is
    looked for again every watch_timeout_seconds.
    """
    from kubernetes import watch
    from kubernetes.client.rest import ApiException

    watch_settings = demand.watch_settings(args)     # checked by main() already
    backoff = demand.Backoff(most=watch_settings["reconnect_max_seconds"])
    timeout = watch_settings["watch_timeout_seconds"]
    what = "%s (%s)" % (_WHAT[kind], "/".join(part for part in api[:2] if part))
    api_client = resource_version = None
    absent = False
    while not stop.is_set():
        try:
            if api_client is None:
                api_client = _client(args)
            lister, positional, named = _lister(api_client, kind, api, args)
            if resource_version is None:
                body = _json(lister(*positional, _preload_content=False, _request_timeout=30, **named))
                resource_version = body["metadata"]["resourceVersion"]
                deliver(kind, "listed", body.get("items") or [])
                if absent:
                    deliver(kind, "note", "%s are served now: watching them" % what)
                    absent = False
            stream = watch.Watch().stream(lister, *positional, resource_version=resource_version,
                                          timeout_seconds=timeout, allow_watch_bookmarks=True,
                                          _request_timeout=timeout + 30, **named)
            for event in stream:
                obj = event.get("raw_object") or {}  # the dict the API sent
                resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    deliver(kind, "event", (event["type"], obj))
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
            if exc.status == 404 and kind != demand.PODS:
                resource_version = None
                if not absent:
                    deliver(kind, "listed", [])   # a CRD removed mid-watch takes its objects' demand with it
                    deliver(kind, "note", "%s are not served by this cluster: not watched" % what)
                    absent = True
                stop.wait(timeout)
                continue
            deliver(kind, "error", "the Kubernetes API answered %s %s for %s" % (exc.status, exc.reason, what))
            stop.wait(backoff.failed())
        except Exception as exc:  # connection refused or reset: keep the resourceVersion, reconnect later
            deliver(kind, "error", "watching %s failed: %s"
                    % (what, (str(exc).splitlines() or [exc.__class__.__name__])[0]))
            stop.wait(backoff.failed())


def _json(response):
    import json
    try:
        return json.loads(response.data)
    finally:
        response.release_conn()


async def main(queue, args):
    """Watch pods, ResourceClaims and Kueue Workloads and put one event on ``queue`` per settled change of the
    pending MIG demand they make together."""
    args = dict(args or {})
    kinds = demand.watched_kinds(args)
    demand.watch_settings(args)      # a bad option is refused before the watches start
    debouncer = demand.Debouncer(args.get("settle_seconds", 10), args.get("max_wait_seconds"))
    # No event before every kind has been listed once (a kind whose API keeps failing holds the
    # others back for max_wait_seconds, at least 30 s).
    tracker = demand.DemandTracker(kinds, patience=max(debouncer.max_wait, 30.0), now=time.time())
    observed = False
    loop = asyncio.get_running_loop()
    inbox = asyncio.Queue()
    stop = threading.Event()

    deliver = demand.Handoff(loop, inbox, stop)   # nothing once the source is stopped

    for kind, api in kinds.items():
        threading.Thread(target=_watch, args=(kind, api, args, deliver, stop), name="mig-demand-watch-" + kind,
                         daemon=True).start()
    try:
        while True:
            try:
                wait = debouncer.wait(time.time()) if observed else 0.5
                kind, what, payload = await asyncio.wait_for(inbox.get(), timeout=wait)
            except asyncio.TimeoutError:
                what = None
            if what == "listed":
                tracker.replace(payload, kind)
            elif what == "event":
                tracker.apply(*payload, kind=kind)
            elif what == "error":
                print("gpuops.mig.mig_demand: %s; reconnecting" % payload, file=sys.stderr, flush=True)
            elif what == "note":
                print("gpuops.mig.mig_demand: %s" % payload, file=sys.stderr, flush=True)
            now = time.time()
            complete = tracker.complete(now)
            for warning in tracker.take_warnings():
                print("gpuops.mig.mig_demand: %s" % warning, file=sys.stderr, flush=True)
            if complete and (what in ("listed", "event") or not observed):
                debouncer.observe(tracker.snapshot(now), now)
                observed = True
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
