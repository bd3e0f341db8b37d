# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which variables with the collection's prefixes exist, so that a misspelt one stops the rollout.

Ansible ignores a variable nobody reads: ``mig_node_config_nmae: all-3g`` would leave the node "already in
place". The names the collection knows are the options of its roles' argument specs (every entry point) plus
PLAYBOOK_VARIABLES (the playbooks' own, documented in docs/rollout.md) and ROLE_RESULTS (what the roles
register or set on a host). Names starting with ``__`` are internal and never checked.
"""

from __future__ import annotations

import difflib
import glob
import os

import yaml
from typing import Collection, Iterable

PREFIXES = ("mig_node_", "mig_preflight_", "mig_device_plugin_", "gpuops_mig_")

# The playbooks' variables (site.yml, disable.yml, facts.yml, plan.yml, demand_round.yml) and what they hand to AWX: exactly the
# gpuops_mig_* names docs/rollout.md documents (a unit test holds the two together).
PLAYBOOK_VARIABLES = (
    "gpuops_mig_hosts", "gpuops_mig_serial", "gpuops_mig_canary", "gpuops_mig_max_fail_percentage",
    "gpuops_mig_preview_failure", "gpuops_mig_deploy_device_plugin", "gpuops_mig_environment",
    "gpuops_mig_simulate",
    "gpuops_mig_kubernetes", "gpuops_mig_strategy", "gpuops_mig_kubeconfig", "gpuops_mig_kube_context",
    "gpuops_mig_driver_root", "gpuops_mig_plan", "gpuops_mig_report_file", "gpuops_mig_run_id",
    "gpuops_mig_plan_demand", "gpuops_mig_plan_file", "gpuops_mig_plan_from_cluster", "gpuops_mig_plan_policy",
    "gpuops_mig_plan_single_profile", "gpuops_mig_plan_vars_file", "gpuops_mig_plan_kueue_api_version",
    "gpuops_mig_summary", "gpuops_mig_totals", "gpuops_mig_fleet",
    "gpuops_mig_round_dir", "gpuops_mig_round_max_nodes", "gpuops_mig_round_cooldown", "gpuops_mig_round_dry_run",
    "gpuops_mig_round_lease_duration", "gpuops_mig_round_lease_wait", "gpuops_mig_round_lease_namespace",
    "gpuops_mig_round_serial",
    "gpuops_mig_round_event",
    "gpuops_mig_round_deploy_device_plugin", "gpuops_mig_round",
    "gpuops_mig_ready_taint", "gpuops_mig_ready_pools", "gpuops_mig_pool",
    "gpuops_mig_ready_nodes", "gpuops_mig_ready_overdue",
)

# Released variables that go in 1.0.0, with what replaces each. No argument spec documents them any more,
# the roles still read a value set for one, and gpuops.mig.mig_node_preview warns about it (deprecated()).
DEPRECATED_VARIABLES = {
    "mig_node_operator_detect": "a Kubernetes node's GPU Operator is always looked for",
    "mig_node_config_configmap_namespace": "write mig_node_config_configmap as namespace/name",
    "mig_node_reboot_test_command": "ansible.builtin.reboot's own test_command (whoami) is used",
    "mig_node_reboot_post_delay": "the reboot checks the host as soon as it answers",
    "mig_node_mig_manager_delay": "mig-manager is polled every mig_node_validate_delay seconds",
    "mig_node_drain_retry_delay": "a refused eviction is retried every mig_node_validate_delay seconds",
    "mig_node_operand_wait_timeout": "operand pods are waited for mig_node_drain_timeout seconds",
    "mig_node_smoke_test_timeout": "smoke pods are waited for mig_node_validate_timeout seconds",
    "mig_device_plugin_create_namespace": "the release's namespace is always created when missing",
    "mig_device_plugin_wait": "set mig_device_plugin_wait_timeout to '' for no wait",
    "mig_preflight_check_container_toolkit": "set mig_preflight_container_toolkit_command to '' to skip "
                                             "the check",
}

# Results the roles leave on a host (a later batch's preview sees them): not settings, but not typos either.
ROLE_RESULTS = ("mig_node_report", "mig_node_preview", "mig_device_plugin_release", "mig_node_run")


def spec_options(roles_dir: str) -> set[str]:
    """The option names of every entry point of every role under roles_dir (meta/argument_specs.yml)."""
    names = set()
    for path in sorted(glob.glob(os.path.join(roles_dir, "*", "meta", "argument_specs.yml"))):
        with open(path) as handle:     # plain data: libyaml's loader where PyYAML has it
            specs = (yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {})
        for entry in (specs.get("argument_specs") or {}).values():
            names.update((entry or {}).get("options") or {})
    return names


def known_names(roles_dir: str) -> set[str]:
    return spec_options(roles_dir) | set(PLAYBOOK_VARIABLES) | set(ROLE_RESULTS) | set(DEPRECATED_VARIABLES)


def deprecated(names: Iterable[str]) -> list[str]:
    """A message for each deprecated variable among ``names``, sorted (the same on every host, so that
    Ansible shows each once)."""
    return ["%s is deprecated and goes in gpuops.mig 1.0.0: %s." % (name, DEPRECATED_VARIABLES[name])
            for name in sorted(set(names)) if name in DEPRECATED_VARIABLES]


def unknown(names: Iterable[str], known: Collection[str]) -> list[tuple[str, str | None]]:
    """[(name, closest known name or None)] for each name with one of PREFIXES that is not known, sorted."""
    found = []
    for name in sorted(set(names)):
        if not name.startswith(PREFIXES) or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        found.append((name, close[0] if close else None))
    return found


def problem(host: str, names: Iterable[str], known: Collection[str]) -> str | None:
    """The message for the unknown names among ``names`` (None when every one is known)."""
    found = unknown(names, known)
    if not found:
        return None
    parts = ["%s (did you mean %s?)" % (name, close) if close else name for name, close in found]
    return ("%s: unknown variable%s %s: no role argument spec or playbook of gpuops.mig documents %s, so it "
            "would be ignored. Nothing was changed. Fix the name, or remove the variable."
            % (host, "s" if len(found) > 1 else "", ", ".join(parts), "them" if len(found) > 1 else "it"))
