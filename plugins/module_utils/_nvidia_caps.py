# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""/dev/nvidia-caps made current after a MIG change, as nvidia-modprobe does (gpuops.mig.mig_device_nodes, the
boot-time restore).

The driver describes each MIG capability in /proc/driver/nvidia/capabilities: mig/config, mig/monitor, and per
GPU instance and compute instance gpu<N>/mig/gi<G>/access and gpu<N>/mig/gi<G>/ci<C>/access, each holding
"DeviceFileMinor: <m>", "DeviceFileMode: <decimal mode>" and "DeviceFileModify: 0|1". A process reaches a
capability through the character device /dev/nvidia-caps/nvidia-cap<m> (the major of "nvidia-caps" in
/proc/devices), which the driver never creates: nvidia-modprobe (run by nvidia-smi and the CUDA library) does,
on demand. A container runtime injects these nodes, so after a change they must exist for the new GPU and
compute instances, and the nodes of instances that are gone must go. Everything lives under ``root`` (a host
root, "/" on a real host). Private to the collection; no Ansible imports.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ApplyError, GpuopsError

CAPABILITIES = ("proc", "driver", "nvidia", "capabilities")
PROC_DEVICES = ("proc", "devices")
DEV_CAPS = ("dev", "nvidia-caps")
MAJOR_NAME = "nvidia-caps"
NODE_PREFIX = "nvidia-cap"
DIR_MODE = 0o755

CREATE, REPLACE, CHMOD, REMOVE = "create", "replace", "chmod", "remove"


class CapsError(GpuopsError):
    """The driver's capabilities could not be read (nothing was changed)."""


class CapsWriteError(CapsError, ApplyError):
    """A device node could not be written (what came before it was)."""


def _under(root, parts):
    return os.path.join(root or "/", *parts)


def caps_major(root: str | None) -> int | None:
    """The character major of nvidia-caps in <root>/proc/devices, or None when the driver registered none."""
    path = _under(root, PROC_DEVICES)
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as e:
        raise CapsError("%s cannot be read: %s" % (path, e.strerror or e))
    section = text.split("Block devices:")[0]
    for line in section.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == MAJOR_NAME and checks.count(fields[0]) is not None:
            return int(fields[0])
    return None


def parse_capability(path: str, text: str) -> dict[str, Any]:
    """{"minor", "mode", "modify"} from a capability file's text."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    try:
        return {"minor": int(values["DeviceFileMinor"]), "mode": int(values.get("DeviceFileMode", "256")) & 0o7777,
                "modify": values.get("DeviceFileModify", "1") != "0"}
    except (KeyError, ValueError):
        raise CapsError("%s is not a capability file of the NVIDIA driver (no DeviceFileMinor): %r"
                        % (path, text[:200]))


def capabilities(root: str | None) -> dict[int, dict[str, Any]]:
    """{minor: {"name", "minor", "mode", "modify"}} of every capability the driver lists now ({} without the
    directory: no driver, or one without MIG)."""
    top = _under(root, CAPABILITIES)
    found = {}
    for directory, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                with open(path) as handle:
                    text = handle.read()
            except OSError as e:
                raise CapsError("%s cannot be read: %s" % (path, e.strerror or e))
            capability = dict(parse_capability(path, text), name=os.path.relpath(path, top))
            other = found.get(capability["minor"])
            if other:
                raise CapsError("%s and %s both claim minor %d" % (other["name"], capability["name"],
                                                                   capability["minor"]))
            found[capability["minor"]] = capability
    return found


def node_path(root: str | None, minor: int) -> str:
    return os.path.join(_under(root, DEV_CAPS), "%s%d" % (NODE_PREFIX, minor))


def _node_minor(name):
    digits = name[len(NODE_PREFIX):]
    return checks.count(digits) if name.startswith(NODE_PREFIX) else None


def plan(root: str | None, lstat: Callable[[str], os.stat_result] = os.lstat,
         listdir: Callable[[str], list[str]] = os.listdir) -> list[tuple[str, str, dict[str, Any] | None]]:
    """[(action, path, capability or None)] that makes <root>/dev/nvidia-caps what the driver lists: a missing
    node created, one of the wrong kind or device numbers replaced, a wrong mode put right where the driver
    allows it (DeviceFileModify), and nvidia-cap<m> nodes of capabilities the driver no longer lists removed.
    Other entries are left alone. [] when all is current, or when the driver lists no capability."""
    wanted = capabilities(root)
    if not wanted:
        return []
    major = caps_major(root)
    if major is None:
        raise CapsError("%s lists MIG capabilities, but %s has no %s character major"
                        % (_under(root, CAPABILITIES), _under(root, PROC_DEVICES), MAJOR_NAME))
    actions = []
    for minor, capability in sorted(wanted.items()):
        path = node_path(root, minor)
        capability = dict(capability, major=major)
        try:
            st = lstat(path)
        except FileNotFoundError:
            actions.append((CREATE, path, capability))
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            actions.append((REPLACE, path, capability))
        elif capability["modify"] and stat.S_IMODE(st.st_mode) != capability["mode"]:
            actions.append((CHMOD, path, capability))
    try:
        present = listdir(_under(root, DEV_CAPS))
    except FileNotFoundError:
        present = []
    for name in sorted(present, key=lambda n: (_node_minor(n) is None, _node_minor(n), n)):
        minor = _node_minor(name)
        if minor is not None and minor not in wanted:
            actions.append((REMOVE, os.path.join(_under(root, DEV_CAPS), name), None))
    return actions


def apply(root: str | None, actions: Sequence[tuple[str, str, dict[str, Any] | None]]) -> None:
    """Carry out plan()'s actions (root's /dev/nvidia-caps created 0755 when missing)."""
    try:
        if actions:
            os.makedirs(_under(root, DEV_CAPS), mode=DIR_MODE, exist_ok=True)
        for action, path, capability in actions:
            if action in (REPLACE, REMOVE):
                os.unlink(path)
            if action in (CREATE, REPLACE):
                os.mknod(path, stat.S_IFCHR | capability["mode"], os.makedev(capability["major"], capability["minor"]))
                os.chmod(path, capability["mode"])     # mknod's mode passes through the umask
            elif action == CHMOD:
                os.chmod(path, capability["mode"])
    except OSError as e:
        raise CapsWriteError("%s could not be made current: %s%s" % (
            _under(root, DEV_CAPS), e.strerror or e, " (%s)" % e.filename if e.filename else ""))


def describe(actions: Sequence[tuple[str, str, dict[str, Any] | None]]) -> list[str]:
    """One line per action, for the result and the restore's log."""
    words = {CREATE: "created", REPLACE: "replaced", CHMOD: "mode set", REMOVE: "removed (no such capability)"}
    return ["%s %s%s" % (os.path.basename(path), words[action],
                         " (%s)" % capability["name"] if capability else "") for action, path, capability in actions]


def refresh(root: str | None, check_mode: bool = False) -> list[str]:
    """Make <root>/dev/nvidia-caps current; returns the lines of what changed (empty: nothing did)."""
    actions = plan(root)
    if not check_mode:
        apply(root, actions)
    return describe(actions)
