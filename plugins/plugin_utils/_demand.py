# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the event source gpuops.mig.mig_demand decides: pending MIG demand, and when to say so.

Pure Python (no Ansible, no Kubernetes client), so the source stays a thin watch loop and the
decisions are unit-tested (docs/dynamic.md):

- ``pod_request``: the MIG devices one pod waits for (a pod not yet bound to a node, not finished,
  not being deleted), read as the planner reads them: per container its limits, else its requests.
- ``claim_request`` and ``workload_request``: the same for a pending ResourceClaim of NVIDIA's DRA driver
  and a Kueue Workload waiting for admission, read by the planner's own parsers (``_plan_demand.
  demand_from_claims``, ``_kueue.pending_pods``), so the loop and ``plan.yml`` count the same demand.
- ``watched_kinds``: which kinds the source watches, from its options.
- ``DemandTracker``: the waiting objects by kind and namespace/name, fed with a full listing of a kind
  (``replace``) or one watch event at a time (``apply``); ``snapshot`` aggregates them all into the
  event's payload; ``complete`` says whether every watched kind has been listed once (no demand is
  emitted before: a kind listed late would be missing from the first event).
- ``Debouncer``: the settle window. Demand must stay unchanged for ``settle_seconds`` (or keep changing
  for ``max_wait_seconds``, by default three windows) before it is emitted, and a fingerprint already emitted is never emitted
  again, so one burst of pods makes one event and a re-listing after a reconnect makes none.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any, Iterable, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.plugin_utils import _kueue as kueue
from ansible_collections.gpuops.mig.plugins.plugin_utils._plan_demand import PlanInputError, demand_from_claims

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_FINISHED = ("Succeeded", "Failed")


class DemandError(ValueError):
    """A source option that cannot be used; the message names it."""


def pod_request(pod: Mapping[str, Any]) -> dict[str, int]:
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


def claim_request(claim: Mapping[str, Any]) -> tuple[dict[str, int], str | None]:
    """({resource: count}, warning or None) of a ResourceClaim: what a pending claim of the DeviceClass
    mig.nvidia.com asks for, read by the planner (_plan_demand.demand_from_claims), its profiles named as the
    device plugin names them (1g.10gb -> nvidia.com/mig-1g.10gb) so that a pod and a claim add up. An
    allocated claim, one being deleted, and one the planner cannot resolve to a profile ask for nothing here."""
    if isinstance(claim, dict) and (claim.get("metadata") or {}).get("deletionTimestamp"):
        return {}, None
    try:
        items, _unresolved = demand_from_claims([claim])
    except PlanInputError as e:
        return {}, "ResourceClaim skipped, its demand is not counted: %s" % e
    return dict((resource_of(item["profile"]), item["count"]) for item in items if item["count"] > 0), None


def workload_request(workload: Mapping[str, Any]) -> tuple[dict[str, int], str | None]:
    """({resource: count}, warning or None) of a Kueue Workload waiting for admission: its pod sets as the
    planner reads them (_kueue.pending_pods), summed over the pods. An admitted Workload asks for nothing here
    (its pods exist and are counted as pods)."""
    pods, warnings = kueue.pending_pods([workload])
    asked = {}
    for pod in pods:
        for resource, count in pod_request(pod).items():
            asked[resource] = asked.get(resource, 0) + count
    return asked, (warnings[0] if warnings else None)


def resource_of(profile: str) -> str:
    """1g.10gb+me -> nvidia.com/mig-1g.10gb.me: the device plugin's resource of a MIG profile."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


PODS, CLAIMS, WORKLOADS = "pods", "claims", "workloads"
_READERS = {PODS: lambda pod: (pod_request(pod), None), CLAIMS: claim_request, WORKLOADS: workload_request}
CLAIMS_API = ("resource.k8s.io", "v1", "resourceclaims")
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")


def watched_kinds(args: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """{kind: (group, version, plural)} the source watches: pods always, ResourceClaims unless ``claims`` is
    false, Kueue Workloads (of ``kueue_api_version``) unless ``workloads`` is false."""
    kinds = {PODS: ("", "v1", "pods")}
    if check_flag(args.get("claims", True), "claims"):
        kinds[CLAIMS] = CLAIMS_API
    api_version = args.get("kueue_api_version") or "%s/%s" % (KUEUE_GROUP, KUEUE_VERSIONS[0])
    group, _slash, version = str(api_version).partition("/")
    if group != KUEUE_GROUP or version not in KUEUE_VERSIONS:
        raise DemandError("kueue_api_version must be one of %s, got %r"
                          % (", ".join("%s/%s" % (KUEUE_GROUP, v) for v in KUEUE_VERSIONS), api_version))
    if check_flag(args.get("workloads", True), "workloads"):
        kinds[WORKLOADS] = (group, version, "workloads")
    return kinds


def check_flag(value: Any, name: str) -> bool:
    """true or false; ansible-rulebook renders templated options as text, so 'True' and 'false' count too."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
        return value.strip().lower() in ("true", "yes")
    raise DemandError("%s must be true or false, got %r" % (name, value))


def _quantity(value):
    """A device count ("2" as the API server writes it, or 2); anything that is not a whole
    number in ASCII digits is no request (the API server refuses those)."""
    return checks.count(value) or 0


def _created(pod):
    stamp = ((pod.get("metadata") or {}).get("creationTimestamp")) or ""
    try:
        return datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return None


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace") or "default", meta.get("name") or "")


def fingerprint(profiles: Mapping[str, int], pods: int, claims: int = 0, workloads: int = 0) -> str:
    """The demand's identity: the devices asked for per resource and the number of pods, claims and Workloads
    asking (claims and Workloads only when there are some, so a demand of pods alone keeps its fingerprint)."""
    counted = {"profiles": profiles, "pods": pods}
    counted.update((name, n) for name, n in ((CLAIMS, claims), (WORKLOADS, workloads)) if n)
    text = json.dumps(counted, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


EMPTY_FINGERPRINT = fingerprint({}, 0)


class DemandTracker(object):
    """The pods, ResourceClaims and Kueue Workloads that wait for MIG devices, kept current from listings and
    watch events of each kind."""

    def __init__(self, kinds: Iterable[str] = (), patience: float | None = None,
                 now: float | None = None) -> None:
        self.pending = {}   # (kind, namespace/name) -> (request, created epoch seconds or None)
        self._said = {}     # (kind, namespace/name) -> the warning last given for it
        self._warnings = []
        self.kinds = tuple(kinds)   # the kinds watched: each must be listed once (complete)
        self.listed = set()
        self._patience = patience
        self._since = now
        self._gave_up = False

    def replace(self, objs: Iterable[Any], kind: str = PODS) -> None:
        """A full listing of one kind (at start and after 410 Gone): its waiting objects are exactly these."""
        self.listed.add(kind)
        self.pending = dict((key, value) for key, value in self.pending.items() if key[0] != kind)
        listed = set()
        for obj in objs:
            self.apply("ADDED", obj, kind)
            listed.add((kind, pod_key(obj)) if isinstance(obj, dict) else None)
        # A warning already given for an object still listed is not given again; one gone is forgotten.
        self._said = dict((key, value) for key, value in self._said.items() if key[0] != kind or key in listed)

    def apply(self, event_type: str, obj: Any, kind: str = PODS) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED) of one kind. Returns True when the demand changed."""
        if not isinstance(obj, dict):
            return False
        key = (kind, pod_key(obj))
        before = self.pending.get(key)
        request, warning = ({}, None) if event_type == "DELETED" else _READERS[kind](obj)
        if request:
            self.pending[key] = (request, _created(obj))
        else:
            self.pending.pop(key, None)
        if warning and self._said.get(key) != warning:
            self._warnings.append(warning)   # once per object and problem, not at every event or re-listing
        if warning:
            self._said[key] = warning
        else:
            self._said.pop(key, None)
        return self.pending.get(key) != before

    def complete(self, now: float) -> bool:
        """Whether the demand may be emitted: every watched kind has been listed once (a kind the
        cluster does not serve lists as none). A kind still not listed ``patience`` seconds after
        the start (its API keeps failing) no longer holds the others back; that is said once."""
        missing = [kind for kind in self.kinds if kind not in self.listed]
        if not missing:
            return True
        if self._patience is None or self._since is None or now - self._since < self._patience:
            return False
        if not self._gave_up:
            self._gave_up = True
            self._warnings.append("%s not listed %d s after the start: the demand is emitted "
                                  "without them until they are"
                                  % (", ".join(missing), self._patience))
        return True

    def take_warnings(self) -> list[str]:
        """The warnings not handed out yet (objects skipped because they cannot be read)."""
        warnings, self._warnings = self._warnings, []
        return warnings

    def snapshot(self, now: float) -> dict[str, Any]:
        """The aggregated demand: {profiles, pods, claims, workloads, waiting, oldest_pending_seconds, fingerprint}."""
        profiles = {}
        counts = {PODS: 0, CLAIMS: 0, WORKLOADS: 0}
        oldest = None
        for (kind, _name), (request, created) in self.pending.items():
            counts[kind] += 1
            for resource, count in request.items():
                profiles[resource] = profiles.get(resource, 0) + count
            if created is not None and (oldest is None or created < oldest):
                oldest = created
        profiles = dict(sorted(profiles.items()))
        return dict(counts, **{
            "profiles": profiles,
            "waiting": sum(counts.values()),
            "oldest_pending_seconds": max(0, int(now - oldest)) if oldest is not None else 0,
            "fingerprint": fingerprint(profiles, counts[PODS], counts[CLAIMS], counts[WORKLOADS]),
        })


class Debouncer(object):
    """When to emit: a demand unchanged for the settle window, once per fingerprint.

    ``observe(snapshot, now)`` after each change; ``due(now)`` returns the snapshot to emit (or None);
    ``wait(now)`` how long the caller may sleep before ``due`` can change its answer.
    Nothing is emitted at start while nothing waits (the empty demand counts as already said).
    """

    def __init__(self, settle_seconds: Any, max_wait_seconds: Any = None) -> None:
        self.settle = check_seconds(settle_seconds, "settle_seconds")
        # By default a demand is said at most three settle windows after it first changed, however
        # many pods keep coming: a burst is one event, and a pod does not wait long for the burst
        # behind it to end.
        self.max_wait = check_seconds(self.settle * 3 if max_wait_seconds is None else max_wait_seconds,
                                      "max_wait_seconds")
        if self.max_wait < self.settle:
            raise DemandError("max_wait_seconds (%s) must be at least settle_seconds (%s)"
                              % (self.max_wait, self.settle))
        self.last_emitted = EMPTY_FINGERPRINT
        self._candidate = None      # the latest snapshot seen
        self._changed_at = None     # when the demand last changed
        self._first_change = None   # when it first differed from what was last emitted

    def observe(self, snapshot: Mapping[str, Any], now: float) -> None:
        if self._candidate is not None and snapshot["fingerprint"] == self._candidate["fingerprint"]:
            self._candidate = snapshot   # same demand: keep its settle clock, refresh its age
            return
        self._candidate = snapshot
        self._changed_at = now
        if snapshot["fingerprint"] == self.last_emitted:
            self._first_change = None   # back to what was said: nothing to say
        elif self._first_change is None:
            self._first_change = now

    def due(self, now: float) -> Mapping[str, Any] | None:
        if self._candidate is None or self._first_change is None:
            return None
        if now - self._changed_at < self.settle and now - self._first_change < self.max_wait:
            return None
        emitted = self._candidate
        self.last_emitted = emitted["fingerprint"]
        self._first_change = None
        return emitted

    def wait(self, now: float, idle: float = 60.0) -> float:
        if self._first_change is None:
            return idle
        return max(0.0, min(self._changed_at + self.settle, self._first_change + self.max_wait) - now)


def check_seconds(value: Any, name: str) -> float:
    """An event source's number of seconds, from 0 to a day: a number, or ASCII digits as text
    (the rulebook renders its options as text); DemandError naming it otherwise (" 30",
    "\\uff13\\uff10", "nan", "inf", -1)."""
    seconds = checks.number(value)
    if seconds is None:
        raise DemandError("%s must be a number of seconds, got %r" % (name, value))
    if not 0 <= seconds <= 86400:      # NaN too
        raise DemandError("%s must be between 0 and 86400 seconds, got %r" % (name, value))
    return float(seconds)


def watch_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """The watch's options of an event source (mig_demand, mig_ready), checked before it starts:
    reconnect_max_seconds (default 30) a number of seconds over 0, up to a day, and
    watch_timeout_seconds (default 300) a whole number of seconds from 1 to a day (the API
    server's timeoutSeconds).
    DemandError naming the option otherwise (negative, NaN, infinite, other digits than ASCII)."""
    reconnect = check_seconds(args.get("reconnect_max_seconds", 30), "reconnect_max_seconds")
    if reconnect <= 0:       # no wait at all: a reconnection loop that spins
        raise DemandError("reconnect_max_seconds must be more than 0, got %r"
                          % args.get("reconnect_max_seconds"))
    timeout = args.get("watch_timeout_seconds", 300)
    whole = checks.count(timeout, 5)
    if whole is None or not 1 <= whole <= 86400:
        raise DemandError("watch_timeout_seconds must be a whole number of seconds from 1 to "
                          "86400, got %r" % (timeout,))
    return {"reconnect_max_seconds": reconnect, "watch_timeout_seconds": whole}


class Handoff(object):
    """What an event source's watch threads see, handed to its event loop: ``deliver(*item)``, from
    any thread, puts ``item`` on the asyncio ``inbox`` of ``loop``. Once ``stop`` is set (the
    source was cancelled) or the loop is closed, an item is dropped and False returned: a watch
    still open when ansible-rulebook stops the source may end or fail afterwards, and its thread
    must end quietly, not die with "Event loop is closed"."""

    def __init__(self, loop: Any, inbox: Any, stop: Any) -> None:
        self.loop, self.inbox, self.stop = loop, inbox, stop

    def __call__(self, *item: Any) -> bool:
        if self.stop.is_set():
            return False
        try:
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, item)
        except RuntimeError:    # the loop is closed: the source has ended
            self.stop.set()
            return False
        return True


class Backoff(object):
    """Seconds to wait before reconnecting: doubling from ``first`` up to ``most``, reset after a success."""

    def __init__(self, first: float = 1.0, most: float = 30.0) -> None:
        self.first, self.most = first, most
        self.next = first

    def failed(self) -> float:
        delay = self.next
        self.next = min(self.most, self.next * 2)
        return delay

    def succeeded(self) -> None:
        self.next = self.first


def api_client(args: Mapping[str, Any]) -> Any:
    """The Kubernetes client of an event source (mig_demand, mig_ready): ``kubeconfig`` and
    ``context``, else K8S_AUTH_KUBECONFIG, KUBECONFIG, ~/.kube/config, else the in-cluster service
    account."""
    import os

    from kubernetes import client, config

    kubeconfig = (args.get("kubeconfig") or os.environ.get("K8S_AUTH_KUBECONFIG")
                  or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config"))
    if os.path.exists(kubeconfig):
        return config.new_client_from_config(config_file=kubeconfig, context=args.get("context"))
    config.load_incluster_config()
    return client.ApiClient()
