#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_node_lease
short_description: Hold a node for one MIG rollout at a time (a Kubernetes Lease, or a lock file on the host)
version_added: 0.2.0
description:
  - Takes, renews or releases the hold of one rollout on one node, so that two rollouts never change the same
    node at once. The M(gpuops.mig.mig_node) role takes it before the node's first change (before it is
    cordoned), renews it between steps, and releases it at the end, after a success or a failure.
  - On a Kubernetes node (without O(lock_file)) the hold is a C(coordination.k8s.io/v1) Lease, O(name) in
    O(namespace), written with the C(kubernetes.core) client, as the cluster's own controllers hold theirs. Run it
    on the controller (C(delegate_to) V(localhost)). C(spec.holderIdentity) and annotations C(gpuops.mig/lease-*)
    name the holder (O(holder)).
  - Every write carries the C(resourceVersion) that was read (or is a create, which fails when the Lease exists);
    when another rollout wrote in between, the API server answers 409 Conflict and the module reads the Lease
    again and decides again.
  - With O(lock_file) the hold is a file on the host the module runs on (for hosts that are no Kubernetes node);
    created exclusively (C(O_EXCL)), holding the same holder information as JSON; reads and writes are
    serialized by an C(flock) on O(lock_file) plus C(.guard).
  - A hold that another holder has not renewed for its duration (renew time + duration earlier than now) is
    taken over, and the result says from whom (RV(taken_over_from)). Clocks of the controllers are compared;
    keep them in step (NTP).
  - A hold that is not expired is refused at once (O(wait=0)), or waited for up to O(wait) seconds; the failure
    names the holder and since when it holds the node.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - kubernetes >= 24.2.0 (the Python client, as for M(kubernetes.core.k8s)), without O(lock_file) only
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
    support: full
    details: Reads the hold and says what it would do; writes nothing.
  diff_mode:
    description: Returns what changed in diff mode.
    support: none
  idempotent:
    description: When run twice in a row with the same arguments, the second run reports no change.
    support: partial
    details: O(state=acquired) and O(state=renewed) renew the hold each time (a new renew time).
options:
  state:
    description:
      - V(acquired) takes the hold (creates it, takes a released one, takes over an expired one), or renews it
        when this run holds it already. Fails when another rollout holds it (after O(wait)).
      - V(renewed) renews this run's hold (takes it when nothing holds the node). Fails when another rollout took
        it over meanwhile.
      - >-
        V(released) releases this run's hold: the Lease is kept with an empty
        C(spec.holderIdentity) (as client-go's leader election releases one) and its
        C(gpuops.mig/lease-*) annotations naming this run, the last holder; the lock file is
        deleted. A hold of another run is left alone.
    type: str
    required: true
    choices: [acquired, renewed, released]
  node:
    description: The node held (its Kubernetes Node name, or the host's name), for the annotations and messages.
    type: str
    required: true
  name:
    description: The Lease's name. Default C(gpuops-mig-) followed by O(node).
    type: str
  namespace:
    description:
      - The Lease's namespace. Not C(kube-node-lease), whose Leases are the kubelets' heartbeats.
    type: str
    default: default
  holder:
    description: Who holds the node.
    type: dict
    required: true
    suboptions:
      run_id:
        description: This rollout's ID, unique per run; a hold with the same run ID is this run's own.
        type: str
        required: true
      controller:
        description: The host the rollout runs from.
        type: str
        default: ""
      job_id:
        description: The AWX or Automation Controller job ID, when there is one.
        type: str
        default: ""
      workflow_id:
        description:
          - The AWX workflow job ID, when there is one (C(awx_workflow_job_id)). The slices of a
            sliced job template run at once as one workflow job; a hold of another slice of the
            same workflow job is shared (V(share)), not refused.
        type: str
        default: ""
      started:
        description: When the rollout started (RFC 3339).
        type: str
        default: ""
  duration:
    description:
      - Seconds after its last renewal that a hold counts as abandoned and may be taken over (C(leaseDurationSeconds)).
      - Must cover the longest step between two renewals.
    type: int
    default: 3600
  wait:
    description: Seconds to wait for another rollout's hold to end before failing; V(0) fails at once.
    type: int
    default: 0
  wait_delay:
    description: Seconds between two reads while waiting.
    type: int
    default: 5
  lock_file:
    description:
      - Hold the node with this lock file on the host instead of a Kubernetes Lease.
      - Where something is at that path already, it must be a regular file of at most 64 KiB (a
        FIFO, a device or a directory is refused before it is opened).
    type: path
  keep_alive:
    description:
      - With a Lease (not O(lock_file)), once the hold is taken or renewed, a process on the
        controller renews it every third of O(duration) for as long as the C(ansible-playbook)
        run that took it lives, and stops when that run ends, when the hold is released or taken
        over, or when no renewal got through for a whole O(duration). So O(duration) can be
        short whatever the longest step; a run that dies blocks the node for O(duration) at most.
      - One such process per hold and run; another call for the same hold finds it running.
      - Ignored in check mode; without an C(ansible-playbook) or C(ansible-runner) process above
        the module, nothing is started and RV(kept_alive) says so.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Hold the node for this rollout (refuse when another one holds it)
  gpuops.mig.mig_node_lease:
    state: acquired
    node: gpu-01
    namespace: default
    holder:
      run_id: 20260101T120000Z-1a2b3c4d
      controller: awx-ee-7f9c
      job_id: "4711"
      started: "2026-01-01T12:00:00Z"
    duration: 3600
  delegate_to: localhost

- name: Hold a host without Kubernetes with a lock file, waiting up to 10 minutes
  gpuops.mig.mig_node_lease:
    state: acquired
    node: "{{ inventory_hostname }}"
    holder:
      run_id: "{{ run_id }}"
    lock_file: /run/gpuops-mig/lock
    wait: 600

- name: Release it
  gpuops.mig.mig_node_lease:
    state: released
    node: gpu-01
    holder:
      run_id: 20260101T120000Z-1a2b3c4d
  delegate_to: localhost
"""

RETURN = r"""
action:
  description:
    - What was done, V(create), V(take) (a released hold), V(take-over) (an expired hold of another run),
      V(renew), V(release), V(share) (held by another slice of the same AWX workflow job, nothing
      written) or V(nothing) (no hold of this run to release).
    - In check mode, what would be done.
  returned: success
  type: str
  sample: create
holder_identity:
  description: The holder, as written to C(spec.holderIdentity) or the lock file.
  returned: success
  type: str
  sample: gpuops.mig run 20260101T120000Z-1a2b3c4d on awx-ee-7f9c (AWX job 4711), started 2026-01-01T12:00:00Z
taken_over_from:
  description: The holder whose expired hold was taken over, and since when it held the node.
  returned: when RV(action=take-over)
  type: str
waited:
  description: Seconds waited for another rollout's hold.
  returned: success
  type: int
lease:
  description: The hold as written (holder, holder identity, acquire and renew times, duration).
  returned: success, unless released
  type: dict
kept_alive:
  description:
    - With O(keep_alive), what renews the hold from now on, C(started), C(kept already) (by an
      earlier call of this run), or why nothing does.
  returned: when O(keep_alive) and the hold was taken or renewed
  type: str
"""

import contextlib
import datetime
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.gpuops.mig.plugins.module_utils import _keep_alive, _lease
from ansible_collections.gpuops.mig.plugins.module_utils._common import fail_from
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_api import bounded
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._input import read_file

# A lock file holds one record of a few hundred bytes.
LOCK_FILE_LIMIT = 65536

LEASE_OPTIONS = dict(
    state=dict(type="str", required=True, choices=list(_lease.STATES)),
    node=dict(type="str", required=True),
    name=dict(type="str"),
    namespace=dict(type="str", default="default"),
    holder=dict(type="dict", required=True, options=dict(
        run_id=dict(type="str", required=True),
        controller=dict(type="str", default=""),
        job_id=dict(type="str", default=""),
        workflow_id=dict(type="str", default=""),
        started=dict(type="str", default=""),
    )),
    duration=dict(type="int", default=3600),
    wait=dict(type="int", default=0),
    wait_delay=dict(type="int", default=5),
    lock_file=dict(type="path"),
    keep_alive=dict(type="bool", default=False),
)

# Seconds the module waits for its keep-alive process to be ready (its first API call).
KEEP_ALIVE_READY = 60

# Writes lost to another rollout (409) before giving up: each loss means that rollout made progress.
MAX_CONFLICTS = 10


class LeaseStore(object):
    """The node's Lease in the cluster: read, and write with the resourceVersion read."""

    def __init__(self, module, name, namespace):
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client

        module.requires("kubernetes")
        self.client = bounded(get_api_client, module)      # a timeout and retries on each call
        self.api = self.client.resource("Lease", "coordination.k8s.io/v1")
        self.name, self.namespace = name, namespace

    def guarded(self):
        return contextlib.nullcontext()   # the API server checks the resourceVersion of each write

    def body(self, node, rec):
        return _lease.lease_object(self.name, self.namespace, node, rec)

    def read(self):
        from kubernetes.dynamic.exceptions import NotFoundError
        try:
            return _lease.from_lease(self.api.get(name=self.name, namespace=self.namespace).to_dict())
        except NotFoundError:
            return None

    def write(self, action, current, obj):
        """False when another writer came first (409: read and decide again)."""
        from kubernetes.dynamic.exceptions import ConflictError, NotFoundError
        try:
            if action == _lease.CREATE:
                self.api.create(body=obj, namespace=self.namespace)
            else:
                # Released as client-go's leader election releases: the Lease kept, its
                # holderIdentity emptied; its annotations keep naming the last holder, which is
                # what ties an owed record on the Node to the run that held the node
                # (plugin_utils/_node_records.py, owed_problems).
                if action == _lease.RELEASE:
                    obj["spec"]["holderIdentity"] = ""
                obj["metadata"]["resourceVersion"] = current["resource_version"]
                self.api.replace(body=obj, name=self.name, namespace=self.namespace)
        except (ConflictError, NotFoundError):
            return False
        return True


class LockFileStore(object):
    """A lock file on this host. The read-decide-write runs under an flock of a guard file beside it, so it is
    as safe as a Lease's resourceVersion check; the file itself is created with O_EXCL."""

    def __init__(self, path, duration):
        self.path, self.duration = path, duration

    @contextlib.contextmanager
    def guarded(self):
        import fcntl
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o755, exist_ok=True)
        guard = os.open(self.path + ".guard", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            yield
        finally:
            os.close(guard)

    def read(self):
        try:
            os.stat(self.path)
        except FileNotFoundError:
            return None
        # Looked at before it is opened: a FIFO, a device or a directory is refused (FileRefused,
        # naming lock_file), not read for ever.
        text = read_file(self.path, "lock_file", LOCK_FILE_LIMIT)
        try:
            rec = json.loads(text)
            if not isinstance(rec, dict) or not rec.get("holder_identity"):
                raise ValueError("no holder")
            return rec
        except ValueError:
            # Unreadable: held by someone unknown since the file's last change, stale after this run's duration.
            changed = datetime.datetime.fromtimestamp(os.stat(self.path).st_mtime, datetime.timezone.utc)
            stamp = _lease.format_time(changed)
            return dict(holder={}, holder_identity="an unreadable lock file %s" % self.path, acquire_time=stamp,
                        renew_time=stamp, duration=self.duration)

    def body(self, node, rec):
        return rec

    def write(self, action, current, rec):
        if action == _lease.RELEASE:
            os.unlink(self.path)
            return True
        data = json.dumps(rec, indent=2, sort_keys=True) + "\n"
        if action == _lease.CREATE:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as handle:
                handle.write(data)
            return True
        temporary = self.path + ".new"
        with open(temporary, "w") as handle:
            handle.write(data)
        os.replace(temporary, self.path)
        return True


def settle(module, store, params):
    """Read, decide, write; again after a lost write; waiting while another rollout holds the node."""
    holder, node, state = params["holder"], params["node"], params["state"]
    started = time.monotonic()
    conflicts = 0
    while True:
        with store.guarded():
            current = store.read()
            now = _lease.utc_now()
            action = _lease.decide(state, current, holder, now)
            waited = int(time.monotonic() - started)
            if action == _lease.LOST:
                raise _lease.LeaseHeld(_lease.lost_message(node, current),
                                       details=dict(holder=_lease.describe(current), lost=True))
            if action == _lease.REFUSE:
                if waited >= params["wait"]:
                    raise _lease.LeaseHeld(_lease.held_message(node, current, waited),
                                           details=dict(holder=_lease.describe(current), waited=waited))
                # else: sleep below, outside the guard, and read again
            else:
                keep_since = current["acquire_time"] if action == _lease.RENEW else None
                rec = _lease.record(holder, now, params["duration"], keep_since)
                result = _lease.outcome(action, current, node)
                result.update(holder_identity=rec["holder_identity"], waited=waited)
                if action not in (_lease.RELEASE, _lease.NOTHING, _lease.SHARE):
                    result["lease"] = rec
                if module.check_mode or action in (_lease.NOTHING, _lease.SHARE):
                    return result
                if store.write(action, current, store.body(node, rec)):
                    return result
                conflicts += 1
                if conflicts >= MAX_CONFLICTS:
                    raise GpuopsError("%s: the node's lease changed under this run %d times in a row; giving up"
                                      % (node, conflicts))
                continue
        time.sleep(max(1, min(params["wait_delay"], params["wait"] - waited)))


def keep_alive(module, name, params):
    """Start the process that renews this run's Lease while the run lives (_keep_alive.py)."""
    run = _keep_alive.run_process()
    if run is None:
        return "not started: no ansible-playbook or ansible-runner process runs this module"
    holder, node, duration = params["holder"], params["node"], params["duration"]
    key = "%s/%s/%s" % (params["namespace"], name, holder["run_id"])
    box = {}

    def warm_up():
        box["lock"] = _keep_alive.exclusive(key)
        if box["lock"] is None:
            return False
        box["store"] = LeaseStore(module, name, params["namespace"])
        box["store"].read()
        return True

    def step():
        store = box["store"]
        try:
            current = store.read()
            if current is None or not _lease.is_ours(current, holder):
                return "stop"
            rec = _lease.record(holder, _lease.utc_now(), duration, current["acquire_time"])
            written = store.write(_lease.RENEW, current, store.body(node, rec))
            return "renewed" if written else "failed"
        except Exception:  # pylint: disable=broad-except
            return "failed"    # the API did not answer: tried again at the next interval

    def work():
        try:
            return _keep_alive.renew_while(run, duration, step)
        finally:
            _keep_alive.release(box["lock"], key)

    return _keep_alive.detach(KEEP_ALIVE_READY, warm_up, work)


def main():
    spec = dict(AUTH_ARG_SPEC)
    spec.update(LEASE_OPTIONS)
    module = AnsibleK8SModule(module_class=AnsibleModule, argument_spec=spec, supports_check_mode=True,
                              check_k8s=False, check_pyyaml=False)
    params = module.params
    name = params["name"] or "gpuops-mig-%s" % params["node"]
    problem = _lease.settings_problem(params["node"], params["duration"], params["wait"],
                                      params["wait_delay"], params["namespace"],
                                      bool(params["lock_file"]))
    if problem:
        module.fail_json(msg=problem)
    try:
        if params["lock_file"]:
            store = LockFileStore(params["lock_file"], params["duration"])
        else:
            store = LeaseStore(module, name, params["namespace"])
        result = settle(module, store, params)
        taken = (_lease.CREATE, _lease.TAKE, _lease.TAKE_OVER, _lease.RENEW)
        if (params["keep_alive"] and not params["lock_file"] and not module.check_mode
                and result["action"] in taken):
            result["kept_alive"] = keep_alive(module, name, params)
    except GpuopsError as err:
        fail_from(module, err)
    except Exception as err:  # the client's API errors (403, 5xx, no connection) and OS errors, phrased for a person
        module.fail_json(msg="%s: the node's lease (%s) could not be %s: %s" % (
            params["node"], params["lock_file"] or "%s/%s" % (params["namespace"], name), params["state"], err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
