# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Filters for what a rollout writes about itself (logic in plugin_utils/_node_records.py)."""

from __future__ import annotations

import os
import secrets
import socket

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_records as records
from ansible_collections.gpuops.mig.plugins.plugin_utils._filter_errors import as_filter


def rollout_identity(given):
    """This run's identity, on the controller: its host name, environment (AWX's JOB_ID) and clock."""
    return records.rollout_identity(given, os.environ, socket.gethostname(), token=secrets.token_hex(4))


def owed_annotations(run, services=(), operands=None, device_plugin=False):
    """The Node annotation patch that records what this run must put back (removes it when nothing)."""
    return records.owed_annotations(records.owed_record(run, services, operands, device_plugin))


class FilterModule(object):
    def filters(self):
        return {
            "mig_rollout_identity": as_filter(rollout_identity, records.IdentityError),
            "mig_node_outcome": as_filter(records.node_outcome, records.OutcomeError),
            "mig_clients_to_pause": records.clients_to_pause,
            "mig_owed_annotations": owed_annotations,
        }
