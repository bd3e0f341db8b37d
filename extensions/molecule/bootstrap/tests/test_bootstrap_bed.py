# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the bootstrap and a real reboot: the layout was in place before kubelet started."""

import os

from bedview import BED, RESTORE_UNIT, gpu_state, mig_devices

testinfra_hosts = ["ansible://h200-0"]


def test_booted_once_with_the_pool_layout(name):
    state = gpu_state(name)
    assert state["boot_count"] == 1
    for gpu in state["gpus"]:
        assert gpu["mig"] == {"current": 1, "pending": 1}
        assert mig_devices(gpu) == ["1g.18gb"] * 7


def test_the_restore_ran_before_kubelet_which_found_the_layout(host, name):
    # simulator/bin/systemctl (the host's init) logs each unit it started at boot, in order.
    with open(os.path.join(BED, "hosts", name, "state.json.boot.log"), encoding="utf-8") as handle:
        log = handle.read()
    started = [line.split(":")[0] for line in log.splitlines() if ": exit " in line]
    assert started == [RESTORE_UNIT, "kubelet.service"], log
    assert "%s: exit 0" % RESTORE_UNIT in log, log
    seen = host.file("/var/lib/kubelet/gpus-at-start").content_string
    assert seen.count("MIG 1g.18gb") == 14, seen
