# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The filter through which playbooks/facts.yml builds the fleet report and its table (logic in
plugin_utils/_fleet_report.py)."""

from __future__ import annotations

from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter
from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_report as fleet_report


def _wrap(function):
    return as_filter(function, fleet_report.ReportError)


class FilterModule(object):
    def filters(self):
        return {
            "mig_fleet_report": _wrap(fleet_report.report_and_table),
        }
