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
import re

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import (
    ANNOTATION_LAST_ERROR as LAST_ERROR_ANNOTATION,
    ANNOTATION_RUN_ID,
)

EVENT_NAMESPACE = "default"          # where the kubelet records a Node's Events (kubectl describe node finds them)
FAILED_REASON = "MigReconfigureFailed"
DONE_REASON = "MigReconfigured"
COMPONENT = "gpuops.mig"
MESSAGE_LIMIT = 1024                 # events.k8s.io caps a note at 1 kB; the core Event is kept as short


def _utc(now=None):
    return (now or datetime.datetime.now(datetime.timezone.utc)).astimezone(datetime.timezone.utc)


def _stamp(now):
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def rollout_identity(given, environ, hostname, now=None, token=""):
    """Who this rollout is, once per run: run ID (given['run_id'], else the start time and `token`), the
    controller host, the AWX job ID (given['job_id'] from the awx_job_id/tower_job_id extra vars, else the
    JOB_ID or AWX_JOB_ID environment variable of an AWX job) and the start time."""
    now = _utc(now)
    given = given or {}
    run_id = str(given.get("run_id") or "") or "%s-%s" % (now.strftime("%Y%m%dT%H%M%SZ"), token)
    job_id = str(given.get("job_id") or "") or environ.get("JOB_ID") or environ.get("AWX_JOB_ID") or ""
    return dict(run_id=run_id, controller=hostname, job_id=str(job_id), started=_stamp(now))


def _text(value):
    """A failed task's message, one line, without a final full stop."""
    return re.sub(r"\s+", " ", str(value)).strip().rstrip(".")


def failure_message(step, result):
    """What went wrong: the failed task and its message (else the result as text)."""
    result = result if isinstance(result, dict) else {"msg": result}
    message = _text(result.get("msg") or "") or _text(json.dumps(result, sort_keys=True, default=str))[:400]
    return "failed at '%s': %s" % (step or "?", message)


def _event_name(node, run, reason):
    """A name unique per node, run and reason, as DNS subdomain (the API's rule for Event names)."""
    name = "%s.gpuops-mig-%s-%s" % (node, run.get("run_id") or "run", reason)
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.")[:253]


def event(node, run, reason, kind, message, now=None):
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


def node_failure(node, run, step, result, layout, now=None):
    """For a failed node: the last-error annotation (JSON text) and the Warning Event."""
    now = _utc(now)
    what = failure_message(step, result)
    record = {"step": step or "?", "message": what.split(": ", 1)[1], "layout": layout or "",
              "run": run.get("run_id") or "", "job": run.get("job_id") or "", "time": _stamp(now)}
    message = "MIG reconfiguration to layout '%s' %s (gpuops.mig run %s)" % (layout or "?", what, record["run"])
    return {"annotations": {LAST_ERROR_ANNOTATION: json.dumps(record, sort_keys=True)},
            "event": event(node, run, FAILED_REASON, "Warning", message, now),
            "message": message}


def node_success(node, run, layout, now=None):
    """For a node whose change succeeded: the annotation removed (null in a merge patch) and a Normal Event
    that supersedes an earlier failure's."""
    message = "MIG layout '%s' applied (gpuops.mig run %s)" % (layout or "?", run.get("run_id") or "")
    return {"annotations": {LAST_ERROR_ANNOTATION: None},
            "event": event(node, run, DONE_REASON, "Normal", message, now),
            "message": message}
