#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_node_stale_resources
short_description: Remove from a Node's status the zero-count MIG resources its layout lacks
version_added: 0.1.0
description:
  - When a device plugin stops advertising a resource (after a MIG layout change, a MIG profile
    the node no longer has), the kubelet keeps it in the Node's C(status.capacity) and
    C(status.allocatable) at 0 until the node restarts, and some schedulers count it as a resource
    the node serves.
  - This module reads the Node and removes from both fields, as that restart would, each
    C(nvidia.com/mig-*) resource (C(.shared) names included) that O(expected) does not promise,
    with a JSON patch on the Node's C(status) subresource (the C(kubernetes.core) client;
    C(kubernetes.core.k8s) and C(kubernetes.core.k8s_json_patch) cannot write a subresource). Run
    it on the controller (C(delegate_to) V(localhost)).
  - A resource is removed only where every field that lists it says 0; one with devices left (an
    unhealthy device keeps its capacity) is kept. Each removal is guarded by a C(test) of the value
    read, so a resource that a device plugin advertises again in between makes the API server
    refuse the patch; the module then reads the Node again and decides again (up to 5 times).
  - The M(gpuops.mig.mig_node) role runs it after validation with the advertisement the node's
    layout promises.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - kubernetes >= 24.2.0 (the Python client, as for M(kubernetes.core.k8s))
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
    support: full
    details: Reads the Node and says what it would remove.
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
  expected:
    description:
      - The result of P(gpuops.mig.mig_expected_advertisement#filter) for the node's layout. The
        MIG resources in its C(resources) are kept; the Node's other C(nvidia.com/mig-*) resources
        at 0 are removed.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Remove the MIG resources the node no longer has
  gpuops.mig.mig_node_stale_resources:
    name: gpu-01
    expected: "{{ ansible_facts.gpuops_mig.gpus
                  | gpuops.mig.mig_expected_advertisement('mixed') }}"
  delegate_to: localhost
"""

RETURN = r"""
removed:
  description: The resources removed (in check mode, that would be removed).
  returned: success
  type: list
  elements: str
  sample: [nvidia.com/mig-1g.10gb]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_api import bounded
from ansible_collections.gpuops.mig.plugins.module_utils._stale_resources import (
    StaleResourcesError, promised, removal_patch)

# Patches refused because the Node's status changed after it was read, before giving up.
ATTEMPTS = 5


def remove_stale(nodes, name, expected, check_mode):
    """The resources removed: read the Node, decide which are stale, patch its status; again when
    the guard's test failed (422), since the Node changed after the decision."""
    from kubernetes.dynamic.exceptions import DynamicApiError
    for _attempt in range(ATTEMPTS):
        node = nodes.get(name=name).to_dict()
        operations, removed = removal_patch(node, expected)
        if not operations or check_mode:
            return removed
        try:
            nodes.client.patch(nodes.status, body=operations, name=name,
                               content_type="application/json-patch+json")
        except DynamicApiError as err:
            if err.status != 422:
                raise
            continue   # a test operation failed (a device plugin wrote the status in between): read it again
        return removed
    raise RuntimeError("its status changed under this run %d times in a row" % ATTEMPTS)


def main():
    spec = dict(AUTH_ARG_SPEC)
    spec.update(name=dict(type="str", required=True),
                expected=dict(type="dict", required=True))
    module = AnsibleK8SModule(module_class=AnsibleModule, argument_spec=spec, supports_check_mode=True,
                              check_k8s=False, check_pyyaml=False)
    name, expected = module.params["name"], module.params["expected"]
    try:
        promised(expected)
    except StaleResourcesError as err:   # refused before any request
        module.fail_json(msg="Node %s: %s." % (name, err))
    try:
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
        module.requires("kubernetes")
        # Each request with a timeout and retries (module_utils/_k8s_api.py).
        nodes = bounded(get_api_client, module).resource("Node", "v1")
        removed = remove_stale(nodes, name, expected, module.check_mode)
    except Exception as err:  # the client's API errors (404, 403, 5xx, no connection), phrased for a person
        module.fail_json(msg="Node %s: the stale MIG resources could not be removed from its "
                             "status: %s. Nothing was removed." % (name, err))
    done = "removed %s from its status" % ", ".join(removed) if removed else "nothing to remove"
    module.exit_json(changed=bool(removed), removed=removed, msg="Node %s: %s." % (name, done))


if __name__ == "__main__":
    main()
