# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_node_preview (documentation: plugins/modules/mig_node_preview.py).

One read of the node (gpuops.mig.mig_node_info), then on the controller: the preflight
checks (plugin_utils/_preflight.py), where the layout comes from, and the decision
(plugin_utils/_node_decision.py). A converged node costs this one module run.
"""

from __future__ import annotations

import base64
import os

import yaml

from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.mig.plugins.module_utils import _bounded_yaml as bounded_yaml
from ansible_collections.gpuops.mig.plugins.module_utils import _k8s_objects as k8s_objects
from ansible_collections.gpuops.mig.plugins.module_utils import _lease as lease
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError, GpuopsError, RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _layout_source as layout_source
from ansible_collections.gpuops.mig.plugins.plugin_utils import _handoff as handoff
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as node_decision
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_records as node_records
from ansible_collections.gpuops.mig.plugins.plugin_utils import _preflight as preflight
from ansible_collections.gpuops.mig.plugins.plugin_utils import _role_contract as role_contract
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import plain
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing
from ansible_collections.gpuops.mig.plugins.plugin_utils import _variable_names as variable_names

# The options the mig_node role's variables feed (role_variables=true) take their type, choices and default from
# the role's argument spec (plugin_utils/_role_contract.py); a config may also be text here.
ROLE_OPTIONS = role_contract.role_options()
# The boot-time restore (option restore), when mig_node_persist is true.
RESTORE_OPTIONS = role_contract.restore_options()

ARGUMENT_SPEC = dict(
    decide=dict(type="bool", default=True),
    role_variables=dict(type="bool", default=False),
    nodes=dict(type="list", elements="dict", default=[]),
    cluster_policies=dict(type="list", elements="dict", default=[]),
    gpu_clusters=dict(type="list", elements="dict", default=[]),
    daemonsets=dict(type="list", elements="dict", default=[]),
    configmaps=dict(type="dict", default={}),
    plan=dict(type="dict"),
    cordoned_annotation=dict(type="str", default=k8s_objects.ANNOTATION_CORDONED),
    restore=dict(type="dict"),
    lease=dict(type="dict"),
    dra_allocations=dict(type="dict"),
    preflight=dict(type="dict", options=dict(
        require_mig_capable=dict(type="bool", default=True),
        min_driver_versions=dict(type="list", elements="dict", default=[]),
        container_toolkit_command=dict(type="str", default=""),
        container_toolkit_min_version=dict(type="str", default="0"),
        install_nvml=dict(type="bool", default=False),
        nvml_package=dict(type="str", default="nvidia-ml-py"),
        pip_extra_args=dict(type="str", default=""),
    )),
    **role_contract.node_preview_spec({"config": {"type": "raw"}})
)


def options_from_role(host, args, role_vars, given):
    """args with every option of ROLE_OPTIONS (and restore) that the task did not give (given: the task's own
    argument names) taken from the mig_node role's checked variables (None: the task runs in no role with an
    argument spec)."""
    if role_vars is None or "mig_node_kubernetes" not in role_vars:
        raise RefusedError("%s: role_variables needs the task to run in the gpuops.mig.mig_node role." % host)
    args = dict(args)
    for option, name in ROLE_OPTIONS:
        if option in given or name not in role_vars:
            continue
        value = role_vars[name]
        if value in layout_source.UNSET:
            value = ARGUMENT_SPEC[option].get("default")
        args[option] = value
    problem = lease.settings_problem(host, int(role_vars.get("mig_node_lease_duration", 3600)),
                                     int(role_vars.get("mig_node_lease_wait", 0)), 1,
                                     role_vars.get("mig_node_lease_namespace"),
                                     not role_vars["mig_node_kubernetes"])
    if problem:       # checked here, before any node changes, not only when a lease is taken
        raise RefusedError(problem)
    if "restore" not in given and role_vars.get("mig_node_persist"):
        args["restore"] = dict((option, role_vars.get(name)) for option, name in RESTORE_OPTIONS)
        args["restore"]["python"] = args["restore"]["python"] or None
    return args


def check_variable_names(host, task_vars):
    """A variable with the collection's prefixes that nothing documents is a typo Ansible would ignore.
    Returns the deprecations of the variables set (task results' `deprecations` items)."""
    known = variable_names.known_names(os.path.dirname(os.path.normpath(task_vars["role_path"])))
    message = variable_names.problem(host, task_vars, known)
    if message:
        raise RefusedError(message)
    return [{"msg": msg, "version": "1.0.0", "collection_name": "gpuops.mig"}
            for msg in variable_names.deprecated(task_vars)]


def check_settings(host, args, sources):
    layout_source.check_one_source(host, sources)
    if args["reboot_method"] == "command" and not args["reboot_command"]:
        raise RefusedError("%s: mig_node_reboot_method=command needs mig_node_reboot_command." % host)


def pick_node(host, args):
    """The host's Kubernetes Node object (None outside Kubernetes)."""
    if not args["kubernetes"]:
        return None
    name = args["k8s_node_name"] or host
    found = [n for n in args["nodes"] if n.get("metadata", {}).get("name") == name]
    if len(found) != 1:
        raise RefusedError("%s: no Kubernetes node named '%s'. Set mig_node_k8s_node_name to the node's name, or "
                           "mig_node_kubernetes=false for a host outside Kubernetes." % (host, name))
    return found[0]


def config_names(config):
    """The names under mig-configs of a mig-parted config (text or data); [] when it cannot be read here
    (the module says what is wrong with it)."""
    if isinstance(config, str):
        try:
            config = migparted.parse_yaml(config, "config")
        except ConfigError:
            return []
    configs = config.get("mig-configs") if isinstance(config, dict) else None
    return list(configs) if isinstance(configs, dict) else []


def sharing_plan(host, args, info, layout, decision):
    """The device plugin's per-node config for the node's new layout (plugin_utils/_sharing.py), checked now."""
    declared = args["sharing"] not in layout_source.UNSET or args["device_plugin_config_name"]
    if info.get("change") is None:        # no layout for this node: it is left as it is
        return dict(sharing.UNMANAGED)
    if declared and not args["kubernetes"]:
        raise sharing.SharingError("%s: mig_node_sharing and mig_node_device_plugin_config_name configure NVIDIA's "
                                   "device plugin, which needs Kubernetes (mig_node_kubernetes is false). Nothing was "
                                   "changed." % host)
    plan = sharing.node_plan(host, {
        "sharing": plain(args["sharing"], "mig_node_sharing"), "entry": args["device_plugin_config_name"],
        "configmap": args["device_plugin_config_map"]},
        info.get("planned"), decision["strategy"], layout["source_kind"], layout["operator"], layout["node"],
        args["configmaps"])
    if plan["managed"] and decision["path"] == "mig-manager" and (plan["data"] or plan["label"]):
        raise sharing.SharingError(
            "%s: the GPU Operator's mig-manager would change the layout, and the device plugin's config for it cannot "
            "be switched inside mig-manager's window. Nothing was changed. Set mig_node_operator_mode=takeover so the "
            "rollout changes layout and sharing config together." % host)
    return plan


class ActionModule(ActionBase):

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname", "?")
        result["changed"] = False
        try:
            role_vars = self._check_role_variables(host, task_vars)
            if args["role_variables"]:
                args = options_from_role(host, args, role_vars, self._task.args)
                deprecations = check_variable_names(host, task_vars)
                if deprecations:
                    result["deprecations"] = deprecations
            # dynamic-dra and dynamic-hami: the hand-off path, and who partitions the node from then on
            args["operator_mode"], args["dynamic_partitioner"] = handoff.split_mode(args["operator_mode"])
            # Outside Kubernetes, the host's hold and owed record (lease.yml, clients_*.yml, repair.yml)
            result["host_files"] = node_records.host_files(args["host_root"])
            if args["decide"]:
                layout = self._layout(host, args, task_vars)
                module_args = dict(layout["module_args"])
                if module_args:
                    module_args["restore"] = args["restore"]
            else:
                layout, module_args = None, {}
            info = self._read(host, args, module_args, task_vars, result)
            if info.get("ansible_facts"):      # interpreter discovery, kept for the host's later tasks
                result["ansible_facts"] = info.pop("ansible_facts")
            if info.get("failed"):
                return dict(result, **info)
            checks = args["preflight"]
            if checks is not None or not info["facts"]["driver"]["present"]:
                problems = preflight.problems(host, info["facts"], info.get("container_toolkit"), checks or {},
                                              self._python(task_vars, result.get("ansible_facts")))
                if problems:
                    return dict(result, failed=True, msg=" ".join(problems), problems=problems, facts=info["facts"])
            result["ready"] = preflight.ready(host, info["facts"], info.get("container_toolkit"))
            result.update(facts=info["facts"], container_toolkit=info.get("container_toolkit"))
            if layout is None:
                result["msg"] = result["ready"]
                return result
            decision = node_decision.decide(info, layout["node"], layout["operator"], {
                "host": host, "kubernetes": args["kubernetes"], "strategy": args["strategy"],
                "operator_mode": args["operator_mode"], "source": layout["source_kind"],
                "config_label": layout["config_label"], "cordoned_annotation": args["cordoned_annotation"],
                "drain": args["drain"] if args["kubernetes"] else "none", "lease": args["lease"],
                "configmap": layout.pop("configmap"), "configmap_explicit": bool(args["configmap"]),
                "partitioner": args["dynamic_partitioner"], "take_back": args["dynamic_take_back"],
                "daemonsets": args["daemonsets"], "gpu_clients": args["gpu_clients"],
                "operand_components": args["operand_components"]})
            result["sharing"] = sharing_plan(host, args, info, layout, decision)
        except GpuopsError as e:   # a refusal, or sharing's and plain()'s errors
            return dict(result, failed=True, msg=str(e))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        info.pop("facts", None)
        result.update(layout, info=info, decision=decision, msg=decision["summary"])
        result.pop("module_args")
        return result

    def _check_role_variables(self, host, task_vars):
        """The variables of the role this task runs in, against the role's argument spec (entry point main),
        as Ansible's own validation task would check them. Here, in the one task a node's preview costs,
        playbooks/site.yml can import the role with rolespec_validate false and spare every node a task.
        Returns them checked and typed (None where the role has no argument spec)."""
        role_path = task_vars.get("role_path")
        path = os.path.join(role_path or "", "meta", "argument_specs.yml")
        if not role_path or not os.path.exists(path):
            return None
        with open(path) as handle:   # plain data: libyaml's loader where PyYAML has it (most of the cost otherwise)
            specs = (yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}).get("argument_specs") or {}
        spec = (specs.get("main") or {}).get("options") or {}
        values = self._templar.template(dict((name, task_vars[name]) for name in spec if name in task_vars))
        checked = ArgumentSpecValidator(spec).validate(values, validate_role_argument_spec=True)
        if checked.error_messages:
            raise RefusedError("%s: the %s role's variables are wrong, nothing was changed: %s"
                               % (host, task_vars.get("role_name", "?"), "; ".join(checked.error_messages)))
        return checked.validated_parameters

    def _layout(self, host, args, task_vars):
        """Settle where the layout comes from, the config name and the label that names it (nothing read
        from the node yet)."""
        dynamic = args["operator_mode"] == "dynamic"
        sources = layout_source.sources_of(args)
        if not dynamic:          # handed over, the node's layout is the hand-off's, whatever else is declared
            check_settings(host, args, sources)
        node = pick_node(host, args)
        try:
            record = handoff.record_of(node, host)
        except handoff.HandoffError as e:
            raise RefusedError(str(e))
        if record and args["dynamic_take_back"] and not dynamic:
            node = handoff.taken_back_node(node, record)   # the static layout is decided on the node taken back
        labels = dict(((node or {}).get("metadata") or {}).get("labels") or {})
        operator = node_decision.operator_view(args["cluster_policies"] if args["kubernetes"] else [], node,
                                               args["daemonsets"], args["gpu_clusters"] if args["kubernetes"] else [])
        if dynamic:
            return {"node": node, "labels": labels, "operator": operator, "source_kind": "dynamic",
                    "source": {"layouts": list(handoff.HANDOFF_LAYOUT)}, "config_name": "",
                    "config_label": handoff.HANDOFF_LABEL, "configmap": None,
                    "module_args": {"layouts": list(handoff.HANDOFF_LAYOUT), "allow_unmatched": False}}
        source_of = layout_source.layout_source(host, args, labels, operator["present"])
        kind, name = source_of["kind"], source_of["config_name"]
        origin = configmap = None
        if kind == layout_source.CONFIGMAP:
            namespace, named = sharing.config_map_ref(host, args["configmap"], "mig_node_config_configmap")
            candidates = [named] if named else operator["mig_manager"]["config_maps"]
            namespace = namespace or operator.get("namespace") or "gpu-operator"
            found = node_decision.config_from_configmaps(args["configmaps"].get(namespace) or [], candidates,
                                                         namespace, args["configmap_key"], host)
            if found["error"]:
                raise RefusedError(found["error"])
            module_args, origin, configmap = {"config": found["config"]}, found["origin"], found["configmap"]
        elif kind == "mig_node_config":
            module_args = {"config": args["config"]}
        elif kind == "mig_node_config_file":
            text, origin = self._read_file(args["config_file"], task_vars)
            module_args = {"config": text}
        elif kind == layout_source.PLAN:
            # No layouts: the plan leaves the node as it is (no MIG-capable GPU); it is only read.
            planned = args["plan"].get("layouts") or None
            module_args, origin = ({"layouts": planned} if planned else {}), "gpuops_mig_plan (plan.yml)"
        else:
            module_args = {"layouts": args["layouts"]}
        label = source_of["label"]
        if label is None:     # the name the config itself holds
            label = layout_source.label_from_config(config_names(module_args["config"]))
        if module_args:       # else there is no layout to apply: the node is only read
            if origin:
                module_args["config_origin"] = origin
            if name:
                module_args["config_name"] = name
            module_args["allow_unmatched"] = args["allow_unmatched"]
        source = dict((k, v) for k, v in module_args.items() if k in ("config", "layouts"))
        if origin:
            source["origin"] = origin
        return {"node": node, "labels": labels, "operator": operator, "source_kind": kind, "source": source,
                "config_name": name, "config_label": label, "module_args": module_args, "configmap": configmap}

    def _read_file(self, path, task_vars):
        """(text, origin: None on the controller, else where on the node it was read). On the
        controller as the file lookup finds it (the role's
        files/, the playbook's directory, or an absolute path); else, for an absolute path, on the
        node, where NVIDIA's host install keeps /etc/nvidia-mig-manager/config.yaml. The module
        parses the text, so a key defined twice is refused rather than silently dropped. Read as
        the modules read config_file: a regular file only (a FIFO would hang the play), within the
        limit on a config's size, every error a refusal naming the variable."""
        try:
            found = self._find_needle("files", path)
        except (AnsibleError, ValueError) as e:
            if not (isinstance(path, str) and path.startswith("/")):
                raise RefusedError("mig_node_config_file %s cannot be read: %s" % (path, e))
            origin = "mig_node_config_file %s on the node" % path
            return self._read_node_file(path, task_vars), origin
        return migparted.read_config_file(found, "mig_node_config_file"), None

    def _read_node_file(self, path, task_vars):
        """The text of `path` on the node, looked at first (a regular file within the limit)."""
        where = "mig_node_config_file %s" % path
        st = self._execute_module("ansible.builtin.stat", task_vars=task_vars,
                                  module_args={"path": path, "get_checksum": False})
        st_info = st.get("stat") or {}
        if st.get("failed") or not st_info.get("exists"):
            raise RefusedError("%s cannot be read: it is neither on the controller (next to the "
                               "playbook, in the role's files/, or at that path) nor on the node"
                               % where)
        if not st_info.get("isreg"):
            raise RefusedError("%s on the node is not a regular file" % where)
        if int(st_info.get("size") or 0) > bounded_yaml.MAX_CHARS:
            raise RefusedError("%s on the node: more than %d bytes, the most it may have"
                               % (where, bounded_yaml.MAX_CHARS))
        got = self._execute_module("ansible.builtin.slurp", module_args={"src": path},
                                   task_vars=task_vars)
        if got.get("failed"):
            raise RefusedError("%s on the node cannot be read: %s" % (where, got.get("msg") or "?"))
        try:
            return base64.b64decode(got.get("content") or "").decode("utf-8")
        except (ValueError, UnicodeDecodeError) as e:
            raise RefusedError("%s on the node: not UTF-8 text (%s)" % (where, e))

    def _read(self, host, args, module_args, task_vars, result):
        """gpuops.mig.mig_node_info once; with nvidia-ml-py missing and preflight.install_nvml, pip installs it
        and the node is read again."""
        checks = args["preflight"] or {}
        # force plans as mig_mode and mig_config will apply (busy devices destroyed rather than refused).
        read_args = dict(module_args, driver_root=args["driver_root"], fail_on_missing_driver=False,
                         force=args["force"], pod_resources_socket=args["pod_resources_socket"],
                         # Outside Kubernetes no kubelet holds devices: nothing to ask.
                         read_allocations=bool(args["kubernetes"]))
        if read_args["read_allocations"] and args["dra_allocations"] is not None:   # the node's ResourceClaims
            read_args["dra_allocations"] = args["dra_allocations"]
        if not args["kubernetes"]:      # a Kubernetes node keeps its owed record on the Node
            read_args["owed_file"] = node_records.host_files(args["host_root"])["owed"]
        if checks.get("container_toolkit_command"):
            read_args["container_toolkit_command"] = checks["container_toolkit_command"]
        info = self._execute_module("gpuops.mig.mig_node_info", module_args=read_args, task_vars=task_vars)
        if info.get("failed") or not (checks.get("install_nvml") and preflight.nvml_missing(info["facts"])):
            return info
        pip_args = {"name": checks.get("nvml_package") or "nvidia-ml-py"}
        if checks.get("pip_extra_args"):
            pip_args["extra_args"] = checks["pip_extra_args"]
        pip = self._execute_module("ansible.builtin.pip", module_args=pip_args, task_vars=task_vars)
        result["pip"] = pip
        if pip.get("failed"):
            return dict(pip, msg="%s: installing %s failed: %s" % (host, pip_args["name"], pip.get("msg", "")))
        result["changed"] = bool(pip.get("changed"))
        if pip.get("changed") and not self._task.check_mode:
            info = self._execute_module("gpuops.mig.mig_node_info", module_args=read_args, task_vars=task_vars)
        return info

    def _python(self, task_vars, result_facts):
        """The Python Ansible runs on the host, for the message about nvidia-ml-py."""
        found = (result_facts or {}).get("discovered_interpreter_python") \
            or task_vars.get("discovered_interpreter_python") or task_vars.get("ansible_python_interpreter")
        return self._templar.template(found) if found else "python3"
