# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_generate_config (documentation: plugins/modules/mig_generate_config.py)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import build
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils._fleet_facts import fleet_from_hostvars
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import plain, require_shapes

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    gpus=dict(type="list", elements="dict"),
)
# Checked before Ansible's own argument checks, which would make ["5"] of 5 and a mapping of "a=1".
SHAPES = dict(
    hosts=(list, str, "a list of inventory host names"),
    gpus=(list, dict, "a list of GPU facts (ansible_facts.gpuops_mig.gpus of gpuops.mig.mig_facts)"),
)


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        result["changed"] = False
        try:
            require_shapes(self._task.args, SHAPES)
        except GpuopsError as e:
            return dict(result, failed=True, msg="cannot generate a mig-parted config: %s" % e)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC,
                                                  mutually_exclusive=[("hosts", "gpus")])
        try:
            args = plain(args, "the arguments")
            gpus = args["gpus"]
            if gpus is None:
                fleet = fleet_from_hostvars(task_vars, args["hosts"])
                missing = sorted(h for h, f in fleet.items() if f is None)
                if missing:
                    return dict(result, failed=True,
                                msg="no MIG facts from %s (run gpuops.mig.mig_facts there first, or leave the host "
                                    "out)" % ", ".join(missing))
                gpus = []
                for host, facts in fleet.items():
                    host_gpus = facts.get("gpus") if isinstance(facts, dict) else None
                    if not isinstance(host_gpus, list):
                        return dict(result, failed=True, msg="the gpuops_mig facts of %s have no list of gpus" % host)
                    gpus.extend(host_gpus)
            built = build(gpus)
        except GpuopsError as e:
            return dict(result, failed=True, msg="cannot generate a mig-parted config: %s" % e)
        config = built["config"]
        result.update(
            config=config,
            content=built["content"],
            config_names=list(config["mig-configs"]),
            models=[{"pci_device_id": pci, "name": name} for pci, (name, dummy) in built["models"].items()],
        )
        return result
