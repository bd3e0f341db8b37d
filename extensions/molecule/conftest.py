# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures for the testinfra tests of every scenario (helpers are in bedview.py).

`host` (testinfra) runs commands on a test host over SSH; `cluster` reads the
Kubernetes API; `name` is the host's inventory name.
"""

import os

import pytest

from bedview import BED, Cluster


@pytest.fixture(scope="session")
def cluster():
    return Cluster(os.path.join(BED, "kubeconfig"))


@pytest.fixture
def name(host):
    """The inventory name of the testinfra host (also its hostname and Kubernetes node name)."""
    return host.backend.host
