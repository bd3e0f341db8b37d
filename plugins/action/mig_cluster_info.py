# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_cluster_info (documentation: plugins/modules/mig_cluster_info.py).

Where the module would run on the controller itself (a local connection and the controller's own
Python, as with the roles' delegate_to localhost), the cluster is read right here, with
kubernetes.core's client, the way kubernetes.core's own k8s lookup reads it. A module run would
start a new Python that imports Ansible's module code and the client before its first request: about
0.4 s, once per batch, which nothing else overlaps. Anywhere else (a delegate host that reaches the
API, another Python, async) the module runs. Both ways read with the same code
(module_utils/_k8s_objects.py) and return the same result.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from ansible.plugins.action import ActionBase
from ansible.utils.vars import merge_hash

from ansible_collections.gpuops.mig.plugins.module_utils._k8s_api import bounded
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import cluster_read_spec, read_cluster
from ansible_collections.gpuops.mig.plugins.plugin_utils._node_decision import operator_view


def with_operator_view(result):
    """The result with C(operator): the GPU Operator and NVIDIA's DRA driver cluster-wide, as the rollout sees
    them (mig_node_preview's operator view, without a node), wherever their objects were read."""
    if "cluster_policies" in result and not result.get("failed"):
        result["operator"] = operator_view(result["cluster_policies"], None, result.get("daemonsets") or [],
                                           result.get("gpu_clusters") or [])
    return result


def kubernetes_client():
    """kubernetes.core's pieces for the read, or None where the controller's Python lacks the client.
    Imported here, in the worker, not at plugin load: a fleet without Kubernetes skips the task and never
    pays for the import."""
    try:
        importlib.import_module("kubernetes")   # kubernetes.core's module_utils import it inside a try
        from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException
        from ansible_collections.kubernetes.core.plugins.module_utils.k8s.service import K8sService
    except ImportError:
        return None
    return dict(auth_spec=AUTH_ARG_SPEC, get_api_client=get_api_client, error=CoreException, service=K8sService)


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True       # then the module runs

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        client = self._reads_here(task_vars) and kubernetes_client()
        if not client:           # as ansible.builtin's normal action runs a module
            wrap_async = self._task.async_val and not self._connection.has_native_async
            result = merge_hash(result, self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return with_operator_view(result)
        dummy, params = self.validate_argument_spec(argument_spec=cluster_read_spec(client["auth_spec"]))
        # The task's environment (K8S_AUTH_*, a proxy), as the module would have had it. This worker
        # process runs this one task only, so its own environment can take it.
        environment = {}
        self._compute_environment_string(environment)
        os.environ.update((str(key), str(value)) for key, value in environment.items())
        auth = dict((name, params[name]) for name in client["auth_spec"] if params.get(name) is not None)
        try:
            # Each request with a timeout and retries (module_utils/_k8s_api.py).
            service = client["service"](bounded(client["get_api_client"], **auth), None)
            result.update(read_cluster(service, params), changed=False)
        except client["error"] as e:
            return dict(result, failed=True, msg=str(e), exception="".join(traceback.format_exception(e)))
        return with_operator_view(result)

    def _reads_here(self, task_vars):
        """Whether the module would run on the controller with the controller's own Python (or with the
        Python Ansible would discover there, where none is set)."""
        if self._task.async_val or self._connection.transport != "local":
            return False
        host_vars = task_vars
        if self._task.delegate_to:
            host_vars = (task_vars.get("ansible_delegated_vars") or {}).get(self._task.delegate_to) or task_vars
        python = host_vars.get("ansible_python_interpreter")
        return not python or same_python(self._templar.template(python), sys.executable)


def same_python(path, executable):
    """Whether the interpreter at `path` is `executable`: the same file in the same directory (python3 and
    python3.11 of one virtual environment are; the base Python a virtual environment links to is not)."""
    try:
        return (os.path.realpath(os.path.dirname(path)) == os.path.realpath(os.path.dirname(executable))
                and os.path.samefile(path, executable))
    except (OSError, TypeError):
        return False
