# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The roles' contract read from their own argument specs (roles/<role>/meta/argument_specs.yml), so that
gpuops.mig.mig_node_preview takes the types, choices and defaults of its role-fed options from there instead
of a second copy. tests/unit/plugins/plugin_utils/test__role_contract.py holds the argument specs, the roles'
defaults/main.yml, the action's options and the module docs against each other.
"""

from __future__ import annotations

import functools
import os

import yaml
from typing import Any, Mapping

# The collection's roles/, beside plugins/ in a checkout and in an installed collection alike.
ROLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")

# What a validator takes from an option's documentation; the rest (description, version_added) is prose.
VALIDATION_KEYS = ("type", "elements", "choices", "default", "required", "options", "aliases")

# mig_node_preview's options that the mig_node role's variables feed (role_variables=true): each is the role
# variable "mig_node_<option>", except the few whose option name is shorter than the variable's.
NODE_ROLE_OPTIONS = ("kubernetes", "k8s_node_name", "config", "config_file", "layouts", "configmap",
                     "configmap_key", "config_name", "config_from_label", "allow_unmatched",
                     "force", "strategy", "operator_mode", "reboot_method", "reboot_command", "driver_root", "drain",
                     "pod_resources_socket", "host_root", "sharing", "device_plugin_config_map",
                     "device_plugin_config_name",
                     "dynamic_take_back", "gpu_clients", "operand_components")
# The boot-time restore's settings (the action's option restore), from mig_node_persist_<setting>.
NODE_RESTORE_OPTIONS = ("reset", "before", "python", "root", "config_dir", "lib_dir", "script", "unit_dir")
RENAMED = {"configmap": "mig_node_config_configmap", "configmap_key": "mig_node_config_configmap_key",
           "strategy": "mig_node_mig_strategy", "host_root": "mig_node_persist_root",
           "restore.reset": "mig_node_reset_gpus", "restore.before": "mig_node_persist_unit_before"}


def node_role_variable(option: str) -> str:
    """The mig_node role variable behind a mig_node_preview option (restore's settings as "restore.<name>")."""
    if option in RENAMED:
        return RENAMED[option]
    if option.startswith("restore."):
        return "mig_node_persist_" + option[len("restore."):]
    return "mig_node_" + option


def role_options() -> tuple[tuple[str, str], ...]:
    """((option, role variable), ...) for NODE_ROLE_OPTIONS."""
    return tuple((option, node_role_variable(option)) for option in NODE_ROLE_OPTIONS)


def restore_options() -> tuple[tuple[str, str], ...]:
    """((restore setting, role variable), ...) for NODE_RESTORE_OPTIONS."""
    return tuple((name, node_role_variable("restore." + name)) for name in NODE_RESTORE_OPTIONS)


@functools.lru_cache(maxsize=None)
def _load(path):
    with open(path) as handle:     # plain data: libyaml's loader where PyYAML has it
        return (yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}).get("argument_specs") or {}


def argument_spec(role: str, entry: str = "main", roles_dir: str = ROLES_DIR) -> dict[str, Any]:
    """The options of a role's entry point, as its meta/argument_specs.yml documents them (read once)."""
    specs = _load(os.path.join(roles_dir, role, "meta", "argument_specs.yml"))
    return (specs.get(entry) or {}).get("options") or {}


def validator_spec(documented: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """One documented option as an argument spec entry (no prose), with overrides (e.g. a wider type)."""
    spec = dict((key, documented[key]) for key in VALIDATION_KEYS if key in documented)
    spec.update(overrides)
    return spec


def node_preview_spec(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The argument spec entries of mig_node_preview's role-fed options, from the mig_node role's argument spec.
    overrides: {option: {key: value}} where the action takes more than the role (a config as text too)."""
    documented = argument_spec("mig_node")
    return dict((option, validator_spec(documented[name], **overrides.get(option, {})))
                for option, name in role_options())
