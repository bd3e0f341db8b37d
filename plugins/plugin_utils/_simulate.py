# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What a simulated host is, from its one variable ``gpuops_mig_simulate`` (docs/simulator.md).

A simulated host is the controller itself (connection local) with simulated GPUs in a state
file, the collection's stand-in host commands (simulator/bin: nvidia-smi, systemctl,
nvidia-ctk) first on PATH, and a root directory of its own for what the roles write on a host
(the boot-time restore, the lock and owed files, systemd units). The playbooks work it out once
per host (playbooks/tasks/simulate.yml) and set it.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Mapping

from ansible_collections.gpuops.mig.plugins.module_utils import _input
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError

# plugins/plugin_utils/ -> the collection's root (installed or a source checkout).
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# COUNTxMODEL[,COUNTxMODEL...], as tools/mig-sim create --gpus takes them.
_MODEL = r"\d+x[A-Za-z0-9][A-Za-z0-9.+-]*"
GPUS = _input.pattern(r"%s(,%s)*" % (_MODEL, _MODEL))


def _cache_dir(environ: Mapping[str, str]) -> str:
    home = environ.get("HOME") or os.path.expanduser("~")
    base = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return os.path.join(base, "gpuops-mig", "simulated")


def simulated_host(simulate: Any, host: str, python: str,
                   environ: Mapping[str, str] | None = None,
                   collection_root: str = COLLECTION_ROOT) -> dict[str, Any]:
    """How host ``host`` is simulated when its ``gpuops_mig_simulate`` is ``simulate``.

    ``simulate`` is either the GPUs (``2xH100-SXM5-80GB``, ``1xA100-SXM4-40GB,1xA30-24GB``): the
    host's state is then kept in the controller's cache directory, one per host and GPU list,
    and made when missing; or the path of a state file that tools/mig-sim made (``.json``): the
    host's root directory is that path without ``.json``. ``python`` is the controller's Python
    (ansible_playbook_python), which runs the modules and the stand-ins; ``environ`` the
    controller's environment (PATH, PYTHONPATH, HOME, XDG_CACHE_HOME).

    Returns ``state``, ``root``, ``create`` (the argv that makes the state, or None),
    ``environment`` (for the playbooks' tasks on the host) and ``settings`` (the role variables
    a simulated host needs).
    """
    environ = os.environ if environ is None else environ
    value = "" if simulate is None else str(simulate).strip()
    mig_sim = os.path.join(collection_root, "tools", "mig-sim")
    if value.endswith(".json"):
        state = os.path.abspath(os.path.expanduser(value))
        root = state[:-len(".json")]
        create = None
    elif _input.whole(GPUS, value):
        root = os.path.join(_cache_dir(environ), host, value)
        state = root + ".json"
        create = [python, mig_sim, "create", state, "--gpus", value, "--seed", host]
    else:
        raise RefusedError(
            "%s: gpuops_mig_simulate is %r: give the simulated GPUs as COUNTxMODEL[,...] (e.g. "
            "2xH100-SXM5-80GB; tools/mig-sim models lists the models) or the path of a state file "
            "that tools/mig-sim made (.json)" % (host, value))
    simulator = os.path.join(collection_root, "simulator")
    search = (os.path.join(simulator, "bin"), os.path.dirname(python), environ.get("PATH", ""))
    environment = {
        "GPUOPS_MIG_SIMULATE": state,
        "PATH": os.pathsep.join(p for p in search if p),
        "PYTHONPATH": os.pathsep.join(p for p in (simulator, environ.get("PYTHONPATH", "")) if p),
        "SYSTEMD_UNIT_PATH": os.path.join(root, "etc", "systemd", "system"),
    }
    boot_id = (python, mig_sim, "boot-id", state)
    settings = {
        # The boot-time restore, the driver's /proc, /dev/nvidia-caps, the CDI spec, and (every
        # simulated host is this machine) the host's own lock and owed files under its root.
        "mig_node_persist_root": root,
        # ansible.builtin.reboot refuses connection local: the stand-in systemctl reboots the
        # simulated host, and the simulator's boot id tells that it did.
        "mig_node_reboot_method": "command",
        "mig_node_reboot_command": "systemctl reboot",
        "mig_node_reboot_boot_time_command": " ".join(shlex.quote(a) for a in boot_id),
    }
    return {"state": state, "root": root, "create": create, "environment": environment,
            "settings": settings}
