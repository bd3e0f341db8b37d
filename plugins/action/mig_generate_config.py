# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Action plugin for gpuops.mig.mig_generate_config (documentation: plugins/modules/mig_generate_config.py)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpuops.mig.plugins.action.mig_plan import fleet_from_hostvars
from ansible_collections.gpuops.mig.plugins.module_utils._config_builder import generate_config, models_from_facts
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError

try:
    import yaml
except ImportError:  # pragma: no cover - ansible-core depends on PyYAML
    yaml = None

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    gpus=dict(type="list", elements="dict"),
)


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC,
                                                  mutually_exclusive=[("hosts", "gpus")])
        result["changed"] = False
        gpus = args["gpus"]
        if gpus is None:
            hosts = args["hosts"] if args["hosts"] is not None else task_vars.get("ansible_play_hosts_all", [])
            fleet = fleet_from_hostvars(task_vars, hosts)
            missing = sorted(h for h, f in fleet.items() if f is None)
            if missing:
                result.update(failed=True, msg="no MIG facts from %s (run gpuops.mig.mig_facts there first, or leave "
                                               "the host out)" % ", ".join(missing))
                return result
            gpus = [gpu for facts in fleet.values() for gpu in facts.get("gpus") or []]
        try:
            config = generate_config(gpus)
            models = models_from_facts(gpus)
        except GpuopsError as e:
            result.update(failed=True, msg="cannot generate a mig-parted config: %s" % e)
            return result
        result.update(
            config=config,
            content=yaml.safe_dump(config, sort_keys=False, default_flow_style=False),
            config_names=list(config["mig-configs"]),
            models=[{"pci_device_id": pci, "name": name} for pci, (name, dummy) in models.items()],
        )
        return result
