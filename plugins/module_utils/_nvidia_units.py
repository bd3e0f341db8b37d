# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""NVIDIA's host service nvidia-mig-manager.service, as gpuops.mig.mig_node_info reads it on a node.

NVIDIA/mig-parted deployments/systemd installs a oneshot unit that runs at every boot after
nvidia-persistenced and applies the config named by MIG_PARTED_SELECTED_CONFIG in its drop-in
/etc/systemd/system/nvidia-mig-manager.service.d/override.conf (all-disabled as installed; the GPU Operator's
mig-manager rewrites it on host-driver nodes). On a node the collection manages, it runs after the
collection's boot-time restore and reverts the layout, so the mig_node role switches it off (systemctl
disable, the drop-in left as it is) and leaves a marker, so that the hand-back switches it on again.

Private to the collection; no Ansible imports; the module runs systemctl and passes the text here.
"""

from __future__ import annotations

import os
from typing import Any, Callable

UNIT = "nvidia-mig-manager.service"
OVERRIDE = "etc/systemd/system/nvidia-mig-manager.service.d/override.conf"
# Written by the mig_node role when it disables the unit; the hand-back enables it again and removes it.
MARKER = "var/lib/gpuops-mig/nvidia-mig-manager.service.disabled-by-gpuops"
SHOW_ARGS = ("show", UNIT)


def parse_show(text: str | None) -> dict[str, bool]:
    """`systemctl show` output (KEY=VALUE lines) -> {present, enabled}."""
    values = dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)
    return {"present": values.get("LoadState") == "loaded",
            "enabled": values.get("UnitFileState") in ("enabled", "enabled-runtime")}


def selected_config(override_text: str | None) -> str | None:
    """MIG_PARTED_SELECTED_CONFIG from the drop-in's Environment= lines, or None."""
    found = None
    for line in (override_text or "").splitlines():
        key, dummy, value = line.strip().partition("=")
        if key.strip() != "Environment":
            continue
        for word in value.strip().strip('"').split():
            name, dummy, setting = word.strip('"').partition("=")
            if name == "MIG_PARTED_SELECTED_CONFIG":
                found = setting
    return found


def state(show_text: str | None, root: str | None,
          read_text: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """What the role decides on: {unit, present, enabled, selected_config, override, marker,
    disabled_by_gpuops}. show_text: `systemctl show` output, None where there is no systemctl."""
    read_text = read_text or _read_text
    override = os.path.join(root or "/", OVERRIDE)
    marker = os.path.join(root or "/", MARKER)
    found = parse_show(show_text) if show_text is not None else {"present": False, "enabled": False}
    return dict(found, unit=UNIT, override=override, marker=marker,
                selected_config=selected_config(read_text(override)),
                disabled_by_gpuops=os.path.exists(marker))


def _read_text(path):
    try:
        with open(path) as handle:
            return handle.read(65536)
    except (IOError, OSError):
        return None
