# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What a rollout writes about itself on the cluster: who it is (the holder of a node's lease), and on
the Node why its change failed (annotation gpuops.mig/last-error and a Warning Event) or that it was
applied (a Normal Event). Controller-side; no Ansible imports (plugins/filter/node_records.py wraps it).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Any, Iterable, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils import _lease
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    ANNOTATION_LAST_ERROR as LAST_ERROR_ANNOTATION,
    ANNOTATION_RUN_ID,
    LABEL_DEPLOY_PREFIX,
    PAUSED_VALUE,
)
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_messages as messages

OWED_ANNOTATION = "gpuops.mig/owed"           # what a run must put back (see "repair first" below)

EVENT_NAMESPACE = "default"          # where the kubelet records a Node's Events (kubectl describe node finds them)
FAILED_REASON = "MigReconfigureFailed"
DONE_REASON = "MigReconfigured"
COMPONENT = "gpuops.mig"
MESSAGE_LIMIT = 1024                 # events.k8s.io caps a note at 1 kB; the core Event is kept as short


# Where a host outside Kubernetes keeps its records, under its root (mig_node_persist_root; a
# simulated host's directory): the hold in /run, gone with a reboot as the run that held it is;
# what a run owes in /var/lib, kept across the reboot it may have to outlive.
HOST_FILES = {"lock": ("run", "gpuops-mig", "lock"), "owed": ("var", "lib", "gpuops-mig", "owed.json")}


def host_files(root: str | None) -> dict[str, str]:
    """{lock, owed}: the paths of the host's hold and owed record under its root ('' or None: /)."""
    return dict((name, os.path.join(root or "/", *parts)) for name, parts in HOST_FILES.items())


def _utc(now=None):
    return (now or datetime.datetime.now(datetime.timezone.utc)).astimezone(datetime.timezone.utc)


def _stamp(now):
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


# A run ID and a job ID end up in Lease and Node annotations, Event names and messages: one short
# token.
RUN_ID_PATTERN = checks.pattern(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,62}")
JOB_ID_PATTERN = checks.pattern(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class IdentityError(ValueError):
    """A run or job ID that is no short token (a newline, 10 kB, a space)."""


def rollout_identity(given: Mapping[str, Any], environ: Mapping[str, str], hostname: str,
                     now: datetime.datetime | None = None, token: str = "") -> dict[str, str]:
    """Who this rollout is, once per run: run ID (given['run_id'], else the start time and `token`), the
    controller host, the AWX job ID (given['job_id'] from the awx_job_id/tower_job_id extra vars, else the
    JOB_ID or AWX_JOB_ID environment variable of an AWX job), the AWX workflow job ID
    (given['workflow_id'], awx_workflow_job_id: a sliced job's slices share it) and the start time.
    A run or job ID
    that is not one token of at most 63 letters, digits and ._:+- raises IdentityError."""
    now = _utc(now)
    given = given or {}
    run_id = str(given.get("run_id") or "") or "%s-%s" % (now.strftime("%Y%m%dT%H%M%SZ"), token)
    job_id = str(given.get("job_id") or "") or environ.get("JOB_ID") or environ.get("AWX_JOB_ID") or ""
    workflow_id = str(given.get("workflow_id") or "")
    for what, value, pattern in (("run ID (gpuops_mig_run_id)", run_id, RUN_ID_PATTERN),
                                 ("job ID (awx_job_id, JOB_ID)", str(job_id), JOB_ID_PATTERN),
                                 ("workflow job ID (awx_workflow_job_id)", workflow_id,
                                  JOB_ID_PATTERN)):
        if value and not checks.whole(pattern, value):
            raise IdentityError("the %s %s is not one token of at most 63 letters, digits and "
                                "._:+- ; nothing was changed" % (what, json.dumps(value)[:80]))
    return dict(run_id=run_id, controller=hostname, job_id=str(job_id), workflow_id=workflow_id,
                started=_stamp(now))


def _text(value):
    """A failed task's message, one line, without a final full stop."""
    return re.sub(r"\s+", " ", str(value)).strip().rstrip(".")


def failure_message(step: str | None, result: Any) -> str:
    """What went wrong: the failed task and its message (else the result as text)."""
    result = result if isinstance(result, dict) else {"msg": result}
    message = _text(result.get("msg") or "") or _text(json.dumps(result, sort_keys=True, default=str))[:400]
    return "failed at '%s': %s" % (step or "?", message)


def _event_name(node, run, reason):
    """A name unique per node, run and reason, as DNS subdomain (the API's rule for Event names)."""
    name = "%s.gpuops-mig-%s-%s" % (node, run.get("run_id") or "run", reason)
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")[:253]


def event(node: str, run: Mapping[str, Any], reason: str, kind: str, message: str,
          now: datetime.datetime | None = None) -> dict[str, Any]:
    """A core v1 Event about the Node (involvedObject uid: the node's name, as the kubelet records it)."""
    stamp = _stamp(_utc(now))
    controller = run.get("controller") or ""
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": _event_name(node, run, reason), "namespace": EVENT_NAMESPACE,
                     "annotations": {ANNOTATION_RUN_ID: run.get("run_id") or ""}},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason, "type": kind, "message": message[:MESSAGE_LIMIT], "action": "Reconfigure",
        "source": {"component": COMPONENT, "host": controller},
        "reportingComponent": COMPONENT, "reportingInstance": controller,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def node_failure(node: str, run: Mapping[str, Any], step: str | None, result: Any, layout: str | None,
                 now: datetime.datetime | None = None) -> dict[str, Any]:
    """For a failed node: the last-error annotation (JSON text) and the Warning Event."""
    now = _utc(now)
    what = failure_message(step, result)
    record = {"step": step or "?", "message": what.split(": ", 1)[1], "layout": layout or "",
              "run": run.get("run_id") or "", "job": run.get("job_id") or "", "time": _stamp(now)}
    message = "MIG reconfiguration to layout '%s' %s (gpuops.mig run %s)" % (layout or "?", what, record["run"])
    return {"annotations": {LAST_ERROR_ANNOTATION: json.dumps(record, sort_keys=True)},
            "event": event(node, run, FAILED_REASON, "Warning", message, now),
            "message": message}


def node_success(node: str, run: Mapping[str, Any], layout: str | None,
                 now: datetime.datetime | None = None) -> dict[str, Any]:
    """For a node whose change succeeded: the failure annotation and any owed record removed (null in a merge
    patch: a validated node owes nothing) and a Normal Event that supersedes an earlier failure's."""
    message = "MIG layout '%s' applied (gpuops.mig run %s)" % (layout or "?", run.get("run_id") or "")
    return {"annotations": {LAST_ERROR_ANNOTATION: None, OWED_ANNOTATION: None},
            "event": event(node, run, DONE_REASON, "Normal", message, now),
            "message": message}


OUTCOMES = ("applied", "failed")


class OutcomeError(ValueError):
    """An outcome the role does not record (neither applied nor failed)."""


def node_outcome(node: str, outcome: str, run: Mapping[str, Any] | None = None,
                 layout: str | None = None, step: str | None = None, result: Any = None,
                 host: str | None = None, reboot_in_progress: bool = False,
                 kubernetes: bool = True, state_label: str = "",
                 reboot_timeout: int | str | None = None,
                 now: datetime.datetime | None = None) -> dict[str, Any]:
    """What the mig_node role records for a node's change: node_success (``applied``) or
    node_failure (``failed``). A failure given the ``host`` also says, as ``summary``, the role's
    fail message (what was put back, what to do: _node_messages.reconfigure_failed); the
    mig-manager path fails with its own message, so it passes no host."""
    if outcome not in OUTCOMES:
        raise OutcomeError("the outcome %s is none of %s"
                           % (json.dumps(outcome, default=str)[:80], ", ".join(OUTCOMES)))
    run = run or {}
    if outcome == "applied":
        return node_success(node, run, layout, now)
    out = node_failure(node, run, step, result, layout, now)
    if host is not None:
        out["summary"] = messages.reconfigure_failed(host, step, result, reboot_in_progress,
                                                     kubernetes, state_label, reboot_timeout)
    return out


# -- what a run owes the node (repair first) ---------------------------------------
#
# Before a run stops host services, pauses GPU Operator operands or changes the GPUs (after which the
# device plugin must be restarted), it writes what it must put back to the Node's annotation
# gpuops.mig/owed, and clears each part only once it is undone. A run that dies in between leaves the
# record; the next run, once it holds the node's lease (so the recording run is gone), puts it right
# before anything else (roles/mig_node/tasks/repair.yml).

OWED_PARTS = ("services", "operands", "device_plugin")


class OwedRecordError(ValueError):
    """An owed record on a Node that this collection did not write (or that was altered)."""


def clients_to_pause(labels: Mapping[str, Any] | None, components: Iterable[str], prefix: str, paused_value: str,
                     active_units: Iterable[str] | None = None, gpu_clients: Iterable[str] | None = (),
                     owed: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What clients_pause.yml pauses, and what to put back afterwards.

    operands: {label: value to restore} for each GPU Operator operand deployed on the node (label
    prefix+component not "false" and present); a label already paused (an interrupted run) is restored
    to the value that run recorded, else "true".
    services: the GPU clients (names without a dot are services) among the active units
    (`systemctl list-units --plain --no-legend` lines; None: stop nothing)."""
    labels = labels or {}
    recorded = (owed or {}).get("operands") or {}
    operands = {}
    for component in components or ():
        key = prefix + component
        value = str(labels.get(key, "false"))
        if value == "false":
            continue
        operands[key] = recorded.get(key, "true") if value == paused_value else value
    services = []
    if active_units is not None:
        active = set(line.split()[0] for line in active_units if line.split())
        for name in gpu_clients or ():
            unit = name if "." in name else name + ".service"
            if unit in active and unit not in services:
                services.append(unit)
    return {"operands": operands, "services": services}


def owed_record(run: Mapping[str, Any], services: Iterable[str] | None = (), operands: Mapping[str, str] | None = None,
                device_plugin: bool = False, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The record of what this run must put back (an empty dict when it owes nothing)."""
    parts = {"services": list(services or ()), "operands": dict(operands or {}), "device_plugin": bool(device_plugin)}
    if not any(parts.values()):
        return {}
    return dict(parts, run=(run or {}).get("run_id") or "", job=(run or {}).get("job_id") or "",
                time=_stamp(_utc(now)))


def owed_annotations(record: Mapping[str, Any] | None) -> dict[str, str | None]:
    """The Node annotation patch for a record (null removes it: nothing is owed)."""
    return {OWED_ANNOTATION: json.dumps(record, sort_keys=True) if record else None}


def settled(record: Mapping[str, Any] | None, *parts: str) -> dict[str, Any]:
    """The record once `parts` (of OWED_PARTS) are put back."""
    if not record:
        return {}
    unknown = set(parts) - set(OWED_PARTS)
    if unknown:
        raise ValueError("unknown parts of an owed record: %s" % ", ".join(sorted(unknown)))
    left = dict(services=[] if "services" in parts else record.get("services") or [],
                operands={} if "operands" in parts else record.get("operands") or {},
                device_plugin=False if "device_plugin" in parts else bool(record.get("device_plugin")))
    if not any(left.values()):
        return {}
    return dict(record, **left)


def read_owed(node: Mapping[str, Any] | None, host_record: str | None = None,
              where: str | None = None) -> dict[str, Any] | None:
    """The owed record on a Node, or outside Kubernetes the text of the host's record file (host_record,
    read by gpuops.mig.mig_node_info; where: its path, for messages). None when there is none. A record this
    collection could not have written raises OwedRecordError: guessing what to restart or relabel is worse
    than asking."""
    annotations = (((node or {}).get("metadata") or {}).get("annotations")) or {}
    text = annotations.get(OWED_ANNOTATION) if node else host_record
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    ok = (isinstance(record, dict) and isinstance(record.get("services", []), list)
          and all(isinstance(s, str) and s and not s.startswith("-") for s in record.get("services", []))
          and isinstance(record.get("operands", {}), dict)
          and all(isinstance(k, str) and isinstance(v, str) for k, v in record.get("operands", {}).items())
          and isinstance(record.get("device_plugin", False), bool))
    if not ok:
        raise OwedRecordError("the %s is not a record gpuops.mig wrote: %s"
                              % ("annotation " + OWED_ANNOTATION if node else "file " + (where or "?"),
                                 json.dumps(text)[:120]))
    return settled(record)   # normalised: every part present, {} when nothing is owed


# Label values as the API server accepts them (k8s.io/apimachinery validation IsValidLabelValue).
LABEL_VALUE = checks.pattern(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _unit(name: str) -> str:
    return name if "." in name else name + ".service"


def owed_bounds(gpu_clients: Iterable[str] | None, operand_components: Iterable[str] | None,
                lease: Mapping[str, Any] | None, kubernetes: bool = True) -> dict[str, Any]:
    """What a record may ask a run to put back: the host services of mig_node_gpu_clients, the
    operand labels of the components the collection pauses, and (on a Kubernetes node) only for the
    run that the node's Lease (as read before this run takes it; a released one keeps its last
    holder) names."""
    holder = _lease.from_lease(lease)["holder"]["run_id"] if lease else ""
    return {"services": sorted(set(_unit(n) for n in gpu_clients or ())),
            "operands": sorted(set(LABEL_DEPLOY_PREFIX + c for c in operand_components or ())),
            "kubernetes": bool(kubernetes), "lease_run": holder, "lease_seen": bool(lease)}


def owed_problems(record: Mapping[str, Any], bounds: Mapping[str, Any]) -> list[str]:
    """Why a well-formed record (read_owed) is still not one to act on ([] when it is): a service
    outside the GPU clients, a label outside the paused operand labels or a value the API would not
    take, or a run that never held the node's lease."""
    problems = []
    services = [s for s in record.get("services") or () if s not in bounds["services"]]
    if services:
        problems.append("service(s) %s are not among mig_node_gpu_clients"
                        % ", ".join(services)[:200])
    labels = [k for k in sorted(record.get("operands") or {}) if k not in bounds["operands"]]
    if labels:
        problems.append("label(s) %s are not operand labels gpuops.mig pauses "
                        "(mig_node_operand_components)" % ", ".join(labels)[:200])
    values = [k for k, v in sorted((record.get("operands") or {}).items()) if k not in labels
              and (len(v) > 63 or not checks.whole(LABEL_VALUE, v) or v == PAUSED_VALUE)]
    if values:
        problems.append("label(s) %s would get back a value no run recorded" % ", ".join(values))
    run = record.get("run") or ""
    if not checks.whole(RUN_ID_PATTERN, run):
        problems.append("it names no run ID")
    elif bounds["kubernetes"] and not bounds["lease_seen"]:
        problems.append("its run %s holds no lease on the node (no Lease gpuops-mig-<node>)" % run)
    elif bounds["kubernetes"] and run != bounds["lease_run"]:
        problems.append("its run %s never held the node's lease (the Lease names run %s)"
                        % (run, bounds["lease_run"] or "none"))
    return problems


def trusted_owed(node: Mapping[str, Any] | None, bounds: Mapping[str, Any],
                 host_record: str | None = None,
                 where: str | None = None) -> dict[str, Any] | None:
    """read_owed, then owed_problems: a record a run may act on, or OwedRecordError saying why."""
    record = read_owed(node, host_record, where)
    problems = owed_problems(record, bounds) if record else []
    if problems:
        where = "annotation " + OWED_ANNOTATION if node else "file " + (where or "?")
        raise OwedRecordError("the %s asks for what gpuops.mig does not put back: %s"
                              % (where, "; ".join(problems)))
    return record


def describe_owed(record: Mapping[str, Any]) -> str:
    """What an interrupted run left to put right, one phrase per part."""
    parts = []
    if record.get("services"):
        parts.append("host services stopped (%s)" % ", ".join(record["services"]))
    if record.get("operands"):
        parts.append("GPU Operator operands paused (%s)" % ", ".join(sorted(record["operands"])))
    if record.get("device_plugin"):
        parts.append("the device plugin not restarted after the GPUs changed")
    who = "run %s" % record["run"] if record.get("run") else "an earlier run"
    return "%s, interrupted, left %s" % (who, "; ".join(parts) or "nothing")
