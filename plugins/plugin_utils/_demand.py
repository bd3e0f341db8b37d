# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the event source gpuops.mig.mig_demand decides: pending MIG demand from pods, and when to say so.

Pure Python (no Ansible, no Kubernetes client), so the source stays a thin watch loop and the
decisions are unit-tested (docs/dynamic.md):

- ``pod_request``: the MIG devices one pod waits for (a pod not yet bound to a node, not finished,
  not being deleted), read as the planner reads them: per container its limits, else its requests.
- ``DemandTracker``: the pending pods by namespace/name, fed with a full listing (``replace``) or one
  watch event at a time (``apply``); ``snapshot`` aggregates them into the event's payload.
- ``Debouncer``: the settle window. Demand must stay unchanged for ``settle_seconds`` (or keep changing
  for ``max_wait_seconds``) before it is emitted, and a fingerprint already emitted is never emitted
  again, so one burst of pods makes one event and a re-listing after a reconnect makes none.
"""

from __future__ import annotations

import datetime
import hashlib
import json

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_FINISHED = ("Succeeded", "Failed")


class DemandError(ValueError):
    """A source option that cannot be used; the message names it."""


def pod_request(pod):
    """{resource: count} of nvidia.com/mig-* devices a pending pod waits for; {} when it waits for none.

    A pod counts while it has no node, has not finished and is not being deleted. Per container the
    limits are read, else the requests (the device plugin's resources must be equal in both); init
    containers are not read, as in the planner (plugins/plugin_utils/_plan_demand.py).
    """
    if not isinstance(pod, dict):
        return {}
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") in _FINISHED:
        return {}
    asked = {}
    for container in spec.get("containers") or []:
        resources = (container or {}).get("resources") or {}
        wanted = resources.get("limits") or resources.get("requests") or {}
        for resource, quantity in wanted.items():
            if not str(resource).startswith(MIG_RESOURCE_PREFIX):
                continue
            count = _quantity(quantity)
            if count > 0:
                asked[resource] = asked.get(resource, 0) + count
    return asked


def _quantity(value):
    """A device count; anything that is not a whole number is no request (the API server refuses those)."""
    try:
        count = int(str(value))
    except ValueError:
        return 0
    return max(count, 0)


def _created(pod):
    stamp = ((pod.get("metadata") or {}).get("creationTimestamp")) or ""
    try:
        return datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def pod_key(pod):
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace") or "default", meta.get("name") or "")


def fingerprint(profiles, pods):
    """The demand's identity: the devices asked for per resource and the number of pods asking."""
    text = json.dumps({"profiles": profiles, "pods": pods}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


EMPTY_FINGERPRINT = fingerprint({}, 0)


class DemandTracker(object):
    """The pending pods that wait for MIG devices, kept current from a listing and watch events."""

    def __init__(self):
        self.pending = {}   # namespace/name -> (request, created epoch seconds or None)

    def replace(self, pods):
        """A full listing (at start and after 410 Gone): the pending pods are exactly these."""
        self.pending = {}
        for pod in pods:
            self.apply("ADDED", pod)

    def apply(self, event_type, pod):
        """One watch event (ADDED, MODIFIED, DELETED). Returns True when the pending set changed."""
        if not isinstance(pod, dict):
            return False
        key = pod_key(pod)
        before = self.pending.get(key)
        request = {} if event_type == "DELETED" else pod_request(pod)
        if request:
            self.pending[key] = (request, _created(pod))
        else:
            self.pending.pop(key, None)
        return self.pending.get(key) != before

    def snapshot(self, now):
        """The aggregated demand: {profiles, pods, oldest_pending_seconds, fingerprint}."""
        profiles = {}
        oldest = None
        for request, created in self.pending.values():
            for resource, count in request.items():
                profiles[resource] = profiles.get(resource, 0) + count
            if created is not None and (oldest is None or created < oldest):
                oldest = created
        profiles = dict(sorted(profiles.items()))
        return {
            "profiles": profiles,
            "pods": len(self.pending),
            "oldest_pending_seconds": max(0, int(now - oldest)) if oldest is not None else 0,
            "fingerprint": fingerprint(profiles, len(self.pending)),
        }


class Debouncer(object):
    """When to emit: a demand unchanged for the settle window, once per fingerprint.

    ``observe(snapshot, now)`` after each change; ``due(now)`` returns the snapshot to emit (or None);
    ``wait(now)`` how long the caller may sleep before ``due`` can change its answer.
    Nothing is emitted at start while no pod waits (the empty demand counts as already said).
    """

    def __init__(self, settle_seconds, max_wait_seconds=None):
        self.settle = check_seconds(settle_seconds, "settle_seconds")
        self.max_wait = check_seconds(self.settle * 4 if max_wait_seconds is None else max_wait_seconds,
                                      "max_wait_seconds")
        if self.max_wait < self.settle:
            raise DemandError("max_wait_seconds (%s) must be at least settle_seconds (%s)"
                              % (self.max_wait, self.settle))
        self.last_emitted = EMPTY_FINGERPRINT
        self._candidate = None      # the latest snapshot seen
        self._changed_at = None     # when the demand last changed
        self._first_change = None   # when it first differed from what was last emitted

    def observe(self, snapshot, now):
        if self._candidate is not None and snapshot["fingerprint"] == self._candidate["fingerprint"]:
            self._candidate = snapshot   # same demand: keep its settle clock, refresh its age
            return
        self._candidate = snapshot
        self._changed_at = now
        if snapshot["fingerprint"] == self.last_emitted:
            self._first_change = None   # back to what was said: nothing to say
        elif self._first_change is None:
            self._first_change = now

    def due(self, now):
        if self._candidate is None or self._first_change is None:
            return None
        if now - self._changed_at < self.settle and now - self._first_change < self.max_wait:
            return None
        emitted = self._candidate
        self.last_emitted = emitted["fingerprint"]
        self._first_change = None
        return emitted

    def wait(self, now, idle=60.0):
        if self._first_change is None:
            return idle
        return max(0.0, min(self._changed_at + self.settle, self._first_change + self.max_wait) - now)


def check_seconds(value, name):
    if isinstance(value, bool):
        raise DemandError("%s must be a number of seconds, got %r" % (name, value))
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise DemandError("%s must be a number of seconds, got %r" % (name, value))
    if not 0 <= seconds <= 86400:
        raise DemandError("%s must be between 0 and 86400 seconds, got %r" % (name, value))
    return seconds


class Backoff(object):
    """Seconds to wait before reconnecting: doubling from ``first`` up to ``most``, reset after a success."""

    def __init__(self, first=1.0, most=30.0):
        self.first, self.most = first, most
        self.next = first

    def failed(self):
        delay = self.next
        self.next = min(self.most, self.next * 2)
        return delay

    def succeeded(self):
        self.next = self.first
