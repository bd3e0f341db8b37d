# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The host's CDI spec for its NVIDIA devices, regenerated after a MIG change (gpuops.mig.mig_cdi_refresh).

A CDI spec (Container Device Interface) lists the devices containers may get; with the device plugin's
cdi-annotations / cdi-cri strategies the runtime injects devices from it. `nvidia-ctk cdi generate`
describes the devices of the moment it runs, so after a MIG change the spec can still name the old MIG
devices and pods fail to start (CreateContainerError) until it is regenerated (mig-parted PR #82).
Private to the collection; no Ansible imports.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Iterable

from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError

# Where NVIDIA's toolkit writes the spec: its docs (/etc/cdi), and nvidia-cdi-refresh (/var/run/cdi).
DEFAULT_SPEC_PATHS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")


class CdiError(GpuopsError):
    """The spec could not be regenerated (nothing was replaced)."""


def spec_paths(root: str | None, paths: Iterable[str] = DEFAULT_SPEC_PATHS) -> list[str]:
    """``paths`` under the host root ``root`` (empty or "/": the host's own root; another
    directory for a simulated host, whose spec lives under it as every other file the roles
    write there)."""
    prefix = (root or "").rstrip("/")
    return [prefix + path for path in paths]


def spec_in_use(paths: Iterable[str], exists: Callable[[str], bool] = os.path.isfile) -> str | None:
    """The first of ``paths`` that exists: the spec the host uses (None: the host has none, nothing to do)."""
    return next((path for path in paths if exists(path)), None)


def refresh(path: str, run: Callable[..., tuple[int, str, str]], command: str = "nvidia-ctk",
            check_mode: bool = False) -> bool:
    """Regenerate the spec at ``path`` with ``command cdi generate``; replace it only when it differs.

    The new spec is written in a private directory first (a file in the spec directory with a spec's
    extension would be read by the runtime as a second spec), then renamed into place in the spec's
    directory, keeping its mode. run(argv, env) -> (rc, out, err). Returns whether it changed."""
    scratch = tempfile.mkdtemp(prefix="gpuops-mig-cdi-")
    try:
        generated = os.path.join(scratch, os.path.basename(path))   # same extension: same format
        argv = [command, "cdi", "generate", "--output=%s" % generated]
        try:
            rc, out, err = run(argv)
        except TimeoutError as e:     # _nvml.ProgramTimedOut: killed at its timeout
            raise CdiError("%s. The CDI spec %s was left as it is." % (e, path))
        except OSError as e:
            raise CdiError("%s cannot run: %s. The CDI spec %s was left as it is." % (command, e, path))
        if rc != 0 or not os.path.isfile(generated):
            raise CdiError("%s failed (exit status %s): %s. The CDI spec %s was left as it is."
                           % (" ".join(argv[:3]), rc, (err or out or "no output").strip(), path))
        with open(generated, "rb") as handle:
            new = handle.read()
        with open(path, "rb") as handle:
            old = handle.read()
        if new == old:
            return False
        if not check_mode:
            _replace(path, generated)
        return True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _replace(path, generated):
    directory = os.path.dirname(path) or "."
    handle, staged = tempfile.mkstemp(prefix=".gpuops-mig-cdi-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out, open(generated, "rb") as source:
            shutil.copyfileobj(source, out)
        os.chmod(staged, os.stat(path).st_mode & 0o7777)
        os.replace(staged, path)
    except BaseException:
        if os.path.exists(staged):
            os.unlink(staged)
        raise
