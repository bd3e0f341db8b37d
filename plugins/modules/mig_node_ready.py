#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_node_ready
short_description: Set a Node's MIG-ready condition, and lift or hold its MIG-ready startup taint
version_added: 0.1.0
description:
  - Writes the verdict of P(gpuops.mig.mig_ready#filter) (or the rollout's) on a Node. The
    condition C(gpuops.mig/MIGReady) (status, reason, message) goes to the C(status) subresource,
    so the Node Readiness Controller or any other controller can act on it too.
  - When the verdict is ready, the taint O(taint) is removed from C(spec.taints); when it is not,
    the taint is kept, and added with O(hold) (what the rollout does before it changes a node). A
    taint is never lifted on a verdict that is not ready.
  - >-
    A lift is refused when the Node read now differs from the one the verdict was decided on (its
    labels, annotations, C(nvidia.com/) resources or taints; C(basis) of the verdict): nothing is
    written, RV(stale) says so, and the next decision reads it again. Each patch is a JSON patch
    guarded by a C(test) of the list it changes, read again (up to 5 times) when another writer got
    there first.
  - Run it on the controller (C(delegate_to) V(localhost)).
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - kubernetes >= 24.2.0 (the Python client, as for M(kubernetes.core.k8s))
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying
      target.
    support: full
    details: Reads the Node and says what it would write.
  diff_mode:
    description: Returns what changed in diff mode.
    support: none
  idempotent:
    description: When run twice in a row with the same arguments, the second run reports no change.
    support: full
options:
  name:
    description: The Node.
    type: str
    required: true
  taint:
    description: The startup taint, C(key[=value]:effect); refused when Kubernetes would refuse it.
    type: str
    default: gpuops.mig/not-ready:NoSchedule
  verdict:
    description:
      - C(ready) (bool), C(reason) and C(message), as P(gpuops.mig.mig_ready#filter) returns them,
        with its C(basis) to guard a lift.
    type: dict
    required: true
  hold:
    description: Add the taint when the verdict is not ready (the rollout, before it changes a
      node).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Lift the taint of the nodes whose layout is advertised; say why not on the others
  gpuops.mig.mig_node_ready:
    name: "{{ item.node }}"
    taint: "{{ gpuops_mig_ready_taint }}"
    verdict: "{{ item }}"
  loop: >-
    {{ nodes.resources
    | gpuops.mig.mig_ready(gpuops_mig_ready_taint, gpuops_mig_ready_pools) }}
  delegate_to: localhost
"""

RETURN = r"""
lifted:
  description: Whether the taint was removed (in check mode, would be).
  returned: success
  type: bool
tainted:
  description: Whether the Node carries the taint afterwards.
  returned: success
  type: bool
stale:
  description: The Node changed since the verdict was decided; nothing was written.
  returned: success
  type: bool
condition:
  description: The C(gpuops.mig/MIGReady) condition written (or already there).
  returned: success
  type: dict
"""

import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_api import bounded
from ansible_collections.gpuops.mig.plugins.module_utils._node_status import (
    TaintError,
    basis_of,
    condition_of,
    condition_patch,
    has_taint,
    parse_taint,
    taint_patch,
)

ATTEMPTS = 5
JSON_PATCH = "application/json-patch+json"


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _written(ops):
    """The condition a condition_patch writes, None when it writes none."""
    if not ops:
        return None
    value = ops[-1]["value"]
    return value[0] if isinstance(value, list) else value


def apply(nodes, name, wanted, verdict, hold, check_mode):
    """{changed, lifted, tainted, stale, condition}: read the Node, patch its taints then its
    condition, again when a guard's test failed (422)."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    ready = bool(verdict.get("ready"))
    reason = str(
        verdict.get("reason") or ("MIGLayoutReady" if ready else "MIGLayoutNotAdvertised")
    )
    message = str(verdict.get("message") or "")[:1024]
    for _attempt in range(ATTEMPTS):
        node = nodes.get(name=name).to_dict()
        if ready and verdict.get("basis") and basis_of(node) != verdict["basis"]:
            return dict(
                changed=False,
                lifted=False,
                tainted=has_taint(node, wanted),
                stale=True,
                condition=condition_of(node),
            )
        taint_ops = (
            taint_patch(node, wanted, present=False)
            if ready
            else (taint_patch(node, wanted, present=True) if hold else [])
        )
        status_ops = condition_patch(node, ready, reason, message, _now())
        result = dict(
            changed=bool(taint_ops or status_ops),
            lifted=bool(ready and taint_ops),
            tainted=not ready and (hold or has_taint(node, wanted)),
            stale=False,
        )
        if check_mode or not result["changed"]:
            return dict(result, condition=_written(status_ops) or condition_of(node))
        try:
            if taint_ops:
                nodes.client.patch(nodes, body=taint_ops, name=name, content_type=JSON_PATCH)
            if status_ops:
                node = nodes.client.patch(
                    nodes.status, body=status_ops, name=name, content_type=JSON_PATCH
                ).to_dict()
        except DynamicApiError as err:
            if err.status != 422:
                raise
            continue  # a guard's test failed (another writer in between): read the Node again
        return dict(result, condition=condition_of(node))
    raise RuntimeError("it changed under this run %d times in a row" % ATTEMPTS)


def main():
    spec = dict(AUTH_ARG_SPEC)
    spec.update(
        name=dict(type="str", required=True),
        taint=dict(type="str", default="gpuops.mig/not-ready:NoSchedule"),
        verdict=dict(type="dict", required=True),
        hold=dict(type="bool", default=False),
    )
    module = AnsibleK8SModule(
        module_class=AnsibleModule,
        argument_spec=spec,
        supports_check_mode=True,
        check_k8s=False,
        check_pyyaml=False,
    )
    name = module.params["name"]
    try:
        wanted = parse_taint(module.params["taint"], "taint")
    except TaintError as err:
        module.fail_json(msg="Node %s: %s. Nothing was written." % (name, err))
    verdict = module.params["verdict"]
    try:
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import (
            get_api_client,
        )

        module.requires("kubernetes")
        # Each request with a timeout and retries (module_utils/_k8s_api.py).
        nodes = bounded(get_api_client, module).resource("Node", "v1")
        result = apply(nodes, name, wanted, verdict, module.params["hold"], module.check_mode)
    except (
        Exception
    ) as err:  # the client's API errors (404, 403, 5xx, no connection), phrased for a person
        module.fail_json(
            msg="Node %s: its MIG-ready condition and taint %s could not be written: %s"
            % (name, module.params["taint"], err)
        )
    what = (
        "stale: the Node changed since the decision, nothing written"
        if result["stale"]
        else (
            "taint %s lifted" % wanted["key"]
            if result["lifted"]
            else "tainted %s" % wanted["key"] if result["tainted"] else "not tainted"
        )
    )
    module.exit_json(
        msg="Node %s: MIG-ready %s (%s); %s."
        % (name, "True" if verdict.get("ready") else "False", verdict.get("reason") or "", what),
        **result,
    )


if __name__ == "__main__":
    main()
