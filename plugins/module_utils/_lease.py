# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""One writer per node: the decisions of gpuops.mig.mig_node_lease, given what holds the node now.

A rollout holds a node while it changes it: a coordination.k8s.io/v1 Lease per node, or a lock file on
the host where there is no Kubernetes. Both are read into the same record (see `record`), and `decide`
says what to do with it: create, take (a released or expired one), renew, refuse, release, or nothing.
The caller writes with optimistic concurrency (a Lease update carries the resourceVersion read) and,
when someone else wrote first, reads again and asks again.

Private to the collection; no Ansible imports. In module_utils, not plugin_utils: the lock-file variant
runs as a module on the node.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError

# Annotations on the Lease (and keys of the lock file) that name who holds it.
ANNOTATION_PREFIX = "gpuops.mig/"
HOLDER_FIELDS = ("run_id", "controller", "job_id", "workflow_id", "started")

# What decide() answers.
CREATE = "create"        # nothing holds the node: create the Lease or lock file
TAKE = "take"            # a released Lease: take it (update)
TAKE_OVER = "take-over"  # a holder that stopped renewing: take it over (update), and say so
RENEW = "renew"          # ours: renew it (update)
REFUSE = "refuse"        # someone else holds it
LOST = "lost"            # renewing one that someone else took meanwhile
RELEASE = "release"      # ours: release it (empty its holderIdentity)
SHARE = "share"          # another slice of this run's AWX workflow job holds it: go on, write nothing
NOTHING = "nothing"      # releasing one that is not ours, or that is gone

STATES = ("acquired", "renewed", "released")


class LeaseHeld(GpuopsError):
    """Another rollout holds the node (refused), or took it from this one (lost)."""


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 with microseconds (a Lease's MicroTime)."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    """A Lease's MicroTime (or an RFC 3339 time without fraction); None when absent or unreadable."""
    if not text:
        return None
    for pattern in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.datetime.strptime(text, pattern).replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            continue
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def holder_identity(holder: Mapping[str, Any]) -> str:
    """The one string that names a holder (a Lease's spec.holderIdentity): the run, where and when it
    started, and its AWX job when there is one."""
    text = "gpuops.mig run %s on %s" % (holder.get("run_id") or "?", holder.get("controller") or "?")
    if holder.get("job_id"):
        text += " (AWX job %s)" % holder["job_id"]
    if holder.get("workflow_id"):
        text += " (AWX workflow job %s)" % holder["workflow_id"]
    return text + ", started %s" % (holder.get("started") or "?")


def describe(current: Mapping[str, Any]) -> str:
    """Who holds a record and since when, for a message."""
    if current.get("holder_identity"):
        who = current["holder_identity"]
    else:
        who = holder_identity(current.get("holder") or {})
    since = current.get("acquire_time") or "?"
    renewed = current.get("renew_time") or since
    return "%s (holds it since %s, last renewed %s, for %s s)" % (who, since, renewed, current.get("duration") or "?")


def expired(current: Mapping[str, Any], now: datetime.datetime) -> bool:
    """Whether the holder stopped renewing: renewTime (else acquireTime) + leaseDurationSeconds < now.
    A record without a time or a duration never expires by itself (someone must look at it)."""
    renewed = parse_time(current.get("renew_time")) or parse_time(current.get("acquire_time"))
    duration = current.get("duration")
    if renewed is None or not duration:
        return False
    return renewed + datetime.timedelta(seconds=int(duration)) < now


def is_ours(current: Mapping[str, Any], holder: Mapping[str, Any]) -> bool:
    """Held by this run: the same run ID (the run ID is unique per run; the controller name is not)."""
    return bool(current.get("holder_identity")) and (current.get("holder") or {}).get("run_id") == holder["run_id"]


def same_workflow(current: Mapping[str, Any], holder: Mapping[str, Any]) -> bool:
    """Held by another slice of this run's AWX sliced job: AWX runs a sliced job template as a
    workflow job whose slices share its ID (awx_workflow_job_id) and run at once on disjoint hosts,
    one rollout split for speed."""
    workflow = holder.get("workflow_id") or ""
    return bool(workflow and current.get("holder_identity")
                and (current.get("holder") or {}).get("workflow_id") == workflow)


def decide(state: str, current: Mapping[str, Any] | None, holder: Mapping[str, Any],
           now: datetime.datetime) -> str:
    """What to do with the node's lease record `current` (None: none exists) for `state`
    (acquired, renewed, released) on behalf of `holder` (HOLDER_FIELDS). Returns one of the
    answers above."""
    if state not in STATES:
        raise ValueError("state must be one of %s, not %r" % (", ".join(STATES), state))
    if state == "released":
        return RELEASE if current is not None and is_ours(current, holder) else NOTHING
    if current is None:
        return CREATE
    if is_ours(current, holder):
        return RENEW
    if not current.get("holder_identity"):
        return TAKE
    if expired(current, now):
        return TAKE_OVER
    if same_workflow(current, holder):
        return SHARE
    return LOST if state == "renewed" else REFUSE


def settings_problem(node: str, duration: int, wait: int, wait_delay: int, namespace: str | None,
                     lock_file: bool = False) -> str | None:
    """What is wrong with a lease's settings, or None; checked when the lease is taken and, for the
    role, in the node's preview, before any node is changed."""
    if namespace == "kube-node-lease" and not lock_file:
        return ("%s: namespace kube-node-lease holds the kubelets' heartbeats; choose another "
                "(mig_node_lease_namespace). Nothing was changed." % node)
    if duration < 1 or wait < 0 or wait_delay < 1:
        return ("%s: duration and wait_delay must be at least 1 and wait at least 0 (got %d, "
                "%d, %d; mig_node_lease_duration, mig_node_lease_wait). Nothing was changed."
                % (node, duration, wait_delay, wait))
    return None


def held_message(node: str, current: Mapping[str, Any], waited: int = 0) -> str:
    """The refusal: the node, who holds it and since when, and what to do."""
    waited_text = " after waiting %d s" % waited if waited else ""
    if not (current.get("holder") or {}).get("run_id"):
        return ("%s: the node's lease is held%s by %s, which is not a gpuops.mig rollout (its "
                "Lease carries no gpuops.mig/lease-run-id). Nothing was changed on the node. Find "
                "out who wrote it; a gpuops.mig run takes it only once it has not been renewed "
                "for its duration."
                % (node, waited_text, describe(current)))
    return ("%s: another MIG rollout holds this node%s: %s. Nothing was changed on the node. Run again when "
            "it is done, wait for it with mig_node_lease_wait, or, if that run is gone, the lease is taken "
            "over once it has not been renewed for its duration." % (node, waited_text, describe(current)))


def lost_message(node: str, current: Mapping[str, Any]) -> str:
    return ("%s: this run's lease on the node was taken over by %s while the change was running (it was not "
            "renewed within its duration: raise mig_node_lease_duration). Stopping here; the other run now "
            "owns the node." % (node, describe(current)))


def record(holder: Mapping[str, Any], now: datetime.datetime, duration: int | str,
           acquire_time: str | None = None) -> dict[str, Any]:
    """The record written for `holder`: held since acquire_time (now when None), renewed now."""
    stamp = format_time(now)
    return dict(holder=dict((key, holder.get(key) or "") for key in HOLDER_FIELDS),
                holder_identity=holder_identity(holder), acquire_time=acquire_time or stamp, renew_time=stamp,
                duration=int(duration))


def lease_object(name: str, namespace: str, node: str, rec: Mapping[str, Any],
                 resource_version: str | None = None) -> dict[str, Any]:
    """The coordination.k8s.io/v1 Lease for a record (resource_version: the one read, for an update)."""
    annotations = dict((ANNOTATION_PREFIX + "lease-" + key.replace("_", "-"), rec["holder"].get(key) or "")
                       for key in HOLDER_FIELDS)
    annotations[ANNOTATION_PREFIX + "lease-node"] = node
    metadata = dict(name=name, namespace=namespace, annotations=annotations,
                    labels={"app.kubernetes.io/managed-by": "gpuops.mig"})
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return dict(apiVersion="coordination.k8s.io/v1", kind="Lease", metadata=metadata,
                spec=dict(holderIdentity=rec["holder_identity"], leaseDurationSeconds=rec["duration"],
                          acquireTime=rec["acquire_time"], renewTime=rec["renew_time"]))


def from_lease(lease: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a Lease object (a dict as the API serves it), with its resourceVersion."""
    spec = lease.get("spec") or {}
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    holder = dict((key, annotations.get(ANNOTATION_PREFIX + "lease-" + key.replace("_", "-")) or "")
                  for key in HOLDER_FIELDS)
    return dict(holder=holder, holder_identity=spec.get("holderIdentity") or "",
                acquire_time=spec.get("acquireTime") or "", renew_time=spec.get("renewTime") or "",
                duration=spec.get("leaseDurationSeconds") or 0,
                resource_version=(lease.get("metadata") or {}).get("resourceVersion"))


def outcome(action: str, current: Mapping[str, Any] | None, node: str) -> dict[str, Any]:
    """The module's result for an action taken: changed, the previous holder taken over, a message."""
    result = dict(changed=action in (CREATE, TAKE, TAKE_OVER, RENEW, RELEASE), action=action)
    if action == TAKE_OVER:
        result["taken_over_from"] = describe(current)
        result["msg"] = ("%s: took the lease over from %s, which had stopped renewing it; that run's change "
                         "of the node may be unfinished." % (node, describe(current)))
    elif action in (CREATE, TAKE):
        result["msg"] = "%s: lease taken" % node
    elif action == RENEW:
        result["msg"] = "%s: lease renewed" % node
    elif action == RELEASE:
        result["msg"] = "%s: lease released" % node
    elif action == SHARE:
        result["msg"] = "%s: held by another slice of this AWX workflow job: %s" % (
            node, describe(current))
    else:
        result["msg"] = "%s: no lease of this run to release" % node
    return result
