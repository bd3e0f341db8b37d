# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Filters through which playbooks/demand_round.yml runs one round of the demand loop (logic in
plugin_utils/_rounds.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import plain
from ansible_collections.gpuops.mig.plugins.plugin_utils import _rounds as rounds


def _plain_args(function):
    """The round's inputs come from files, registered results and extra vars: plain Python values first."""
    def run(*args, **kwargs):
        return function(*plain(list(args), "the round's input"), **plain(kwargs, "the round's input"))
    run.__name__ = function.__name__
    run.__doc__ = function.__doc__
    return as_filter(run, (rounds.RoundError, RefusedError))


class FilterModule(object):
    def filters(self):
        return {
            "mig_round_settings": _plain_args(rounds.settings),
            "mig_round_plan_policy": _plain_args(rounds.plan_policy),
            "mig_round_select": _plain_args(rounds.select),
            "mig_round_record": _plain_args(rounds.round_record),
            "mig_round_deferral": _plain_args(rounds.deferral),
        }
