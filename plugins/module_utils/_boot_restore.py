# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The boot-time restore: bring the declared MIG mode and layout back at boot, without Ansible.

GPU instances never survive a reboot, and from Hopper on neither does MIG mode.
The gpuops.mig.mig_boot_restore module installs, on a node, a copy of this
engine (this file and the modules it imports: ENGINE_MODULES), a small
launcher script, the desired state and a systemd unit that runs ``main()`` at
boot: before kubelet and the GPU clients when the driver is the host's, once
the driver container is up when it is the GPU Operator's.

Private to the collection; no Ansible imports.

main() sets the MIG mode of every GPU the config selects with _host_mode (the
engine of gpuops.mig.mig_mode), resets GPUs whose mode is still pending (only
when nothing runs on them), then applies the layout with _host_layout (the
engine of gpuops.mig.mig_config). It never reboots: a mode that stays pending is
logged and the exit status is 3, so a reboot loop cannot happen. Everything is
validated and planned before the first change: bad input, or a MIG device with
processes that would have to go, changes nothing. With the host's own driver it
then makes /dev/nvidia-caps current (_nvidia_caps) and regenerates the CDI spec
the host has (_cdi), so containers get the MIG devices just created.

Exit status: 0 done (or nothing to do), 1 refused before any change (bad input,
busy devices), 2 NVML or apply failure (or the device nodes or CDI spec could not
be made current), 3 MIG mode still pending (a reboot or a manual reset is needed).

The desired-state file is JSON: {"format": 1, "config": {...mig-parted v1...} or
"layouts": [...], "config_name": "...", "allow_unmatched": false, "reset": true,
"nvidia_smi": "nvidia-smi", "driver_root": "auto", "wait_for_driver": 0,
"device_nodes_root": "/" (null: leave /dev/nvidia-caps alone), "cdi_spec_paths":
[...] (the first that exists is regenerated), "installed": "<stamp>"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils import _cdi as cdi
from ansible_collections.gpuops.mig.plugins.module_utils import _errors as errors
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_mode as host_mode
from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_caps as nvidia_caps
from ansible_collections.gpuops.mig.plugins.module_utils import _nvml as nvml_lib

PACKAGE = "ansible_collections.gpuops.mig.plugins.module_utils"
ENTRY = PACKAGE + "._boot_restore"
FORMAT = 1
UNIT_NAME = "gpuops-mig-restore.service"
# Where the restore goes on a node by default (the module's options, the mig_node role's mig_node_persist_*
# defaults and tools/gpuops-mig-restore repeat them; a unit test holds them together).
DESIRED_FILE = "desired.json"
DEFAULT_CONFIG_DIR = "/etc/gpuops-mig"
DEFAULT_ENGINE_DIR = "/usr/local/lib/gpuops-mig"
DEFAULT_SCRIPT = "/usr/local/sbin/gpuops-mig-restore"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
DEFAULT_DESIRED = DEFAULT_CONFIG_DIR + "/" + DESIRED_FILE

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PENDING = 0, 1, 2, 3


# -- what is installed -------------------------------------------------------------

# The engine: this file and every collection module_utils it imports, transitively. A list
# rather than found from the imports at run time (ast, about 25 ms), because every node read
# (gpuops.mig.mig_node_info) derives the restore's stamp from these sources;
# tests/unit/plugins/module_utils/test__boot_restore.py keeps it equal to what the imports say.
ENGINE_MODULES = tuple("%s.%s" % (PACKAGE, name) for name in (
    "_boot_restore", "_bounded_yaml", "_cdi", "_errors", "_gpu_layout", "_gpu_selection", "_host_layout",
    "_host_mode", "_input", "_migparted", "_nvidia_caps", "_nvml"))


def engine_sources(read_source: Callable[[str], str] | None = None) -> dict[str, str]:
    """{dotted module name: source} of the engine (ENGINE_MODULES).

    read_source(name) returns a module's source (default: through its loader, which
    also works inside a module's AnsiballZ payload).
    """
    read_source = read_source or _loader_source
    return dict((name, read_source(name)) for name in ENGINE_MODULES)


def _loader_source(name):
    __import__(name)
    module = sys.modules[name]
    source = module.__loader__.get_source(name)
    if source is None:  # pragma: no cover - no source kept by the loader
        with open(module.__file__) as handle:
            source = handle.read()
    return source


def launcher(python: str, engine_dir: str) -> str:
    """The script the unit runs: import the engine from engine_dir (a regular package there, found
    ahead of any other copy on sys.path, an installed collection say) and run it."""
    return ("#!%s\n"
            "# gpuops-mig-restore, installed by gpuops.mig.mig_boot_restore: restores the MIG mode and layout\n"
            "# at boot with the engine copy under %s (see its _boot_restore.py).\n"
            "import sys\n"
            "sys.dont_write_bytecode = True  # the engine dir holds what was installed, nothing else\n"
            "sys.path.insert(0, %r)\n"
            "from %s import main\n"
            "sys.exit(main(sys.argv[1:]))\n" % (python, engine_dir, engine_dir, ENTRY))


def unit_text(python: str, script: str, desired_path: str, engine_dir: str, before: Iterable[str] = (),
              after: Iterable[str] = (), container_driver: bool = False) -> str:
    """The systemd unit. With the host's driver it runs before kubelet and the GPU clients; with a
    driver container it cannot (kubelet starts that container), so it waits for the driver instead."""
    lines = [
        "# Installed by gpuops.mig.mig_boot_restore; changes here are overwritten.",
        "# Restores the NVIDIA MIG mode and layout declared by gpuops.mig at boot. Never reboots.",
        "[Unit]",
        "Description=Restore the NVIDIA MIG mode and layout declared by gpuops.mig",
        "After=%s" % " ".join(["systemd-modules-load.service"] + list(after)),
    ]
    if before:
        lines.append("Before=%s" % " ".join(before))
    lines += [
        "ConditionPathExists=%s" % desired_path,
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
    ]
    if container_driver:
        lines.append("TimeoutStartSec=infinity")
    lines += [
        # -I (isolated): no PYTHON* variables, no user site-packages, no script directory on
        # the path.
        "ExecStart=%s -I %s --desired %s --engine-dir %s"
        % (python, script, desired_path, engine_dir),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def bundle(paths: Mapping[str, str], desired: Mapping[str, Any], python: str, before: Iterable[str] = (),
           after: Iterable[str] = (), read_source: Callable[[str], str] | None = None
           ) -> tuple[dict[str, tuple[str, int]], str]:
    """{path: (content, mode)} of everything the restore consists of, and its stamp.

    paths: dict with config_dir, lib_dir (the engine dir), script, unit_dir. The
    desired state is written last and carries the stamp, so a node whose restore is
    in place is recognised by reading one file (installed_stamp).
    """
    files = {}
    package_dir = os.path.join(paths["lib_dir"], *PACKAGE.split("."))
    for depth in range(1, len(PACKAGE.split(".")) + 1):
        files[os.path.join(paths["lib_dir"], *PACKAGE.split(".")[:depth] + ["__init__.py"])] = ("", 0o644)
    for name, source in sorted(engine_sources(read_source=read_source).items()):
        files[os.path.join(package_dir, name.rsplit(".", 1)[1] + ".py")] = (source, 0o644)
    files[paths["script"]] = (launcher(python, paths["lib_dir"]), 0o755)
    desired_path = os.path.join(paths["config_dir"], DESIRED_FILE)
    files[os.path.join(paths["unit_dir"], UNIT_NAME)] = (
        unit_text(python, paths["script"], desired_path, paths["lib_dir"], before, after,
                  container_driver=bool(desired.get("wait_for_driver"))), 0o644)
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(("%s\0%o\0%s\0" % (path, files[path][1], files[path][0])).encode("utf-8"))
    digest.update(json.dumps(desired, sort_keys=True).encode("utf-8"))
    stamp = digest.hexdigest()
    content = dict(desired, format=FORMAT, installed=stamp)
    files[desired_path] = (json.dumps(content, indent=2, sort_keys=True) + "\n", 0o644)
    return files, stamp


# -- installing (gpuops.mig.mig_boot_restore; gpuops.mig.mig_node_info checks the stamp) --------

CONTAINER_DRIVER_WAIT = 900
DEFAULT_BEFORE = ("kubelet.service", "nvidia-persistenced.service", "nvidia-fabricmanager.service",
                  "nvidia-dcgm.service", "dcgm.service", "dcgm-exporter.service", "nvsm.service")
_HOST_DRIVER = ("auto", "/", "", None)


def paths_of(params: Mapping[str, Any]) -> dict[str, str]:
    """Where the installation goes: config_dir, lib_dir, script, unit_dir, under params["root"]."""
    root = params.get("root") or ""
    return dict((key, root + params[key]) for key in ("config_dir", "lib_dir", "script", "unit_dir"))


def desired_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """The desired state the restore reads at boot (written with the installation's stamp). With the host's own
    driver it also makes /dev/nvidia-caps current and regenerates the CDI spec the host has, under params' root
    as every other path; a driver container (the GPU Operator's) and its toolkit do both themselves."""
    wait = params.get("wait_for_driver")
    container = params.get("driver_root") not in _HOST_DRIVER
    root = params.get("root") or ""
    return {
        "device_nodes_root": None if container else root or "/",
        "cdi_spec_paths": [] if container else cdi.spec_paths(root),
        "format": FORMAT,
        "config": params.get("config"),
        "layouts": params.get("layouts"),
        "config_name": params.get("config_name"),
        "allow_unmatched": params.get("allow_unmatched", False),
        "reset": params.get("reset", True),
        "nvidia_smi": params.get("nvidia_smi") or "nvidia-smi",
        "driver_root": params.get("driver_root") or "auto",
        "wait_for_driver": (CONTAINER_DRIVER_WAIT if container else 0) if wait is None else wait,
    }


def unit_order(params: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(before, after): with a driver container kubelet must come first (it starts the driver)."""
    before = params.get("before") or list(DEFAULT_BEFORE)
    if params.get("driver_root") in _HOST_DRIVER:
        return before, []
    return [u for u in before if u != "kubelet.service"], ["kubelet.service"]


def bundle_for(params: Mapping[str, Any], python: str) -> tuple[dict[str, tuple[str, int]], str]:
    """bundle() for mig_boot_restore's parameters."""
    before, after = unit_order(params)
    return bundle(paths_of(params), desired_of(params), python, before=before, after=after)


def installed_stamp(config_dir: str) -> str | None:
    """The stamp of the restore installed on this host, or None."""
    try:
        with open(os.path.join(config_dir, DESIRED_FILE)) as handle:
            return json.load(handle).get("installed")
    except (IOError, OSError, ValueError, AttributeError):
        return None


# -- only root can change what runs at boot ------------------------------------------
# The unit runs the engine as root at every boot, so every file of it, the directories it lies
# in and the interpreter must be root's alone (the running user's where the module runs
# unprivileged, in tests). The restore's own directories (config_dir, lib_dir and the package
# under it) are brought to that; any other directory on the way, and the interpreter, are
# checked and refused when another user could change them.

DIR_MODE = 0o755
_MAX_LINKS = 40


def own_dirs(files: Iterable[str], paths: Mapping[str, str]) -> set[str]:
    """The directories that belong to the restore: config_dir, lib_dir and every directory under lib_dir
    holding one of its files (lib_dir is the restore's alone: anything else in it is removed)."""
    found = set([paths["config_dir"], paths["lib_dir"]])
    for path in files:
        directory = os.path.dirname(path)
        while is_under(directory, paths["lib_dir"]) and directory not in found:
            found.add(directory)
            directory = os.path.dirname(directory)
    return found


def is_under(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def _prefixes(path):
    """"/", "/a", "/a/b" for "/a/b"."""
    parts = [part for part in os.path.normpath(path).split("/") if part]
    return ["/"] + ["/" + "/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]


def _who_can_change(path, st, uid):
    """Why a user other than root and uid could change what lies at path (its stat st), or None."""
    if st.st_uid not in (0, uid):
        return "%s is owned by uid %d, not by root%s" % (path, st.st_uid, "" if uid == 0 else " or uid %d" % uid)
    # A sticky directory (/tmp) lets others add entries, never replace or remove another's.
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    writers = [who for bit, who in ((0o020, "its group"), (0o002, "others")) if st.st_mode & bit]
    if writers and not sticky:
        return "%s is writable by %s (mode %04o)" % (path, " and ".join(writers), stat.S_IMODE(st.st_mode))
    return None


def unsafe_directories(directory: str, uid: int, skip: Collection[str] = ()) -> str | None:
    """Why another user than root and uid could change what lies under directory (one of it or the directories
    above it, as given and as resolved, is theirs or writable by group or others), or None. Directories in skip
    (the restore's own, brought to root's) and the ones not there yet (created root's) are not checked."""
    chains = [_prefixes(directory), _prefixes(os.path.realpath(directory))]
    for prefix in chains[0] + [p for p in chains[1] if p not in chains[0]]:
        if prefix in skip:
            continue
        try:
            st = os.stat(prefix)
        except FileNotFoundError:
            break
        except OSError as e:
            return "%s cannot be read: %s" % (prefix, e.strerror)
        if not stat.S_ISDIR(st.st_mode):
            return "%s is not a directory" % prefix
        why = _who_can_change(prefix, st, uid)
        if why:
            return why
    return None


def unsafe_interpreter(python: str, uid: int) -> str | None:
    """Why another user than root and uid could change the interpreter the unit runs (the file, a link on the way
    to it, or a directory above any of them), or None."""
    if not os.path.isabs(python):
        return "the interpreter %s is not an absolute path" % python
    path = python
    for _hop in range(_MAX_LINKS):
        why = unsafe_directories(os.path.dirname(path), uid)
        if why:
            return why
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    else:
        return "the interpreter %s: too many symbolic links" % python
    try:
        st = os.stat(path)
    except OSError as e:
        return "the interpreter %s cannot be used: %s" % (python, e.strerror)
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
        return "the interpreter %s is not an executable file" % python
    return _who_can_change(path, st, uid) or unsafe_import_path(python, uid)


# What the interpreter imports from: its sys.path without site processing (-S: no .pth file
# runs while asking) and the site-packages that site adds at boot, a virtual environment's
# included. os and site are frozen in the interpreter (3.11+), so asking reads no module from a
# directory not yet checked.
_PATH_PROBE = ("import os, site, sys\n"
               "d = os.path.dirname(sys.executable)\n"
               "venv = [p for p in (d, os.path.dirname(d))\n"
               "        if os.path.exists(os.path.join(p, 'pyvenv.cfg'))]\n"
               "prefixes = venv + [sys.prefix, sys.exec_prefix]\n"
               "print(repr([p for p in sys.path if p] + site.getsitepackages(prefixes)))")


def import_path(python: str) -> list[str]:
    """The directories (and zip files) the interpreter imports from at boot, site-packages
    included."""
    import ast
    proc = subprocess.run([python, "-I", "-S", "-c", _PATH_PROBE], capture_output=True, text=True,
                          timeout=60, check=False)
    if proc.returncode != 0:
        raise errors.RefusedError("The interpreter %s could not say where it imports from: %s"
                                  % (python, (proc.stderr or proc.stdout).strip()[-300:]))
    seen = []
    for entry in ast.literal_eval(proc.stdout.strip()):
        if entry not in seen:
            seen.append(entry)
    return seen


def _pth_dirs(site_dir, name):
    """The directories a .pth file adds to the path (its lines neither comments nor imports)."""
    with open(os.path.join(site_dir, name)) as handle:
        lines = [line.strip() for line in handle]
    return [os.path.join(site_dir, line) for line in lines
            if line and not line.startswith("#") and not line.startswith(("import ", "import\t"))]


def unsafe_import_path(python: str, uid: int) -> str | None:
    """Why another user than root and uid could change what the interpreter imports at boot (a
    directory on its path or above one, a site-packages directory, a .pth file in one or a
    directory such a file adds), or None."""
    try:
        entries = import_path(python)
    except (OSError, ValueError, SyntaxError, subprocess.SubprocessError) as e:
        return "the interpreter %s could not say where it imports from (%s)" % (python, e)
    except errors.RefusedError as e:
        return str(e)
    pending, seen = list(entries), set(entries)
    while pending:
        entry = pending.pop(0)
        if os.path.isfile(entry):           # a zip on the path (pythonXY.zip)
            why = (unsafe_directories(os.path.dirname(entry), uid)
                   or _who_can_change(entry, os.stat(entry), uid))
        else:
            why = unsafe_directories(entry, uid)
        if why:
            return why
        if not os.path.isdir(entry):
            continue
        for name in sorted(os.listdir(entry)):
            if not name.endswith(".pth"):
                continue
            pth = os.path.join(entry, name)
            why = _who_can_change(pth, os.stat(pth), uid)
            if why:
                return "%s, a .pth file Python runs at start-up" % why
            added = [d for d in _pth_dirs(entry, name) if d not in seen]
            seen.update(added)
            pending += added
    return None


def refuse_unsafe(files: Mapping[str, tuple[str, int]], paths: Mapping[str, str], python: str | None,
                  uid: int) -> None:
    """Raise RefusedError, before any change, when another user than root and uid could change what the unit
    runs at boot: a directory on the way to one of the restore's files that is not the restore's own, or the
    interpreter (python; None for a removal)."""
    skip = own_dirs(files, paths)
    for directory in sorted(set(os.path.dirname(path) for path in files) | skip):
        why = unsafe_directories(directory, uid, skip)
        if why:
            raise errors.RefusedError("The boot-time restore is not installed under %s: %s, so another user than root "
                                      "could change what runs as root at boot. Nothing was changed; use a directory "
                                      "only root can write to." % (directory, why))
    why = python and unsafe_interpreter(python, uid)
    if why:
        raise errors.RefusedError("The boot-time restore would run %s at boot as root, but %s: another user than root "
                                  "could change it. Nothing was changed; give a Python only root can change "
                                  "(mig_boot_restore's python, mig_node_persist_python)." % (python, why))


def _installed_file(path):
    """(sha256 hex digest or None, stat or None) of what lies at path, read without following a symbolic link
    (a link, a directory: no digest)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        try:
            return None, os.lstat(path)
        except OSError:
            return None, None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, st
        return hashlib.sha256(handle.read()).hexdigest(), st


def _mismatch(st, mode, uid, gid):
    if stat.S_IMODE(st.st_mode) != mode:
        return "mode %04o, not %04o" % (stat.S_IMODE(st.st_mode), mode)
    if (st.st_uid, st.st_gid) != (uid, gid):
        return "owned by %d:%d, not %d:%d" % (st.st_uid, st.st_gid, uid, gid)
    return None


def drift(files: Mapping[str, tuple[str, int]], paths: Mapping[str, str], uid: int, gid: int) -> dict[str, str]:
    """What on the host differs from the restore files ({path: (content, mode)}) describe, as {path: why}: a file's
    content (by its sha256), mode or owner, something other than a regular file, the restore's own directories'
    mode and owner, and entries under lib_dir that are not part of it. Empty when the restore is in step."""
    found = {}
    own = own_dirs(files, paths)
    for directory in sorted(own):
        try:
            st = os.lstat(directory)
        except OSError:
            found[directory] = "missing"
            continue
        found[directory] = ("not a directory" if not stat.S_ISDIR(st.st_mode)
                            else _mismatch(st, DIR_MODE, uid, gid))
    for path, (content, mode) in sorted(files.items()):
        digest, st = _installed_file(path)
        if st is None:
            found[path] = "missing"
        elif digest is None:
            found[path] = "not a regular file"
        elif digest != hashlib.sha256(content.encode("utf-8")).hexdigest():
            found[path] = "content differs"
        else:
            found[path] = _mismatch(st, mode, uid, gid)
    for path in strays(files, paths, own):
        found[path] = "not part of the restore"
    return dict((path, why) for path, why in found.items() if why)


def strays(files: Mapping[str, tuple[str, int]], paths: Mapping[str, str],
           own: Collection[str] | None = None) -> list[str]:
    """Entries under lib_dir that are not the restore's (the launcher puts lib_dir first on the path: a module
    there would run as root at boot)."""
    own = own_dirs(files, paths) if own is None else own
    found = []
    for top, dirs, names in os.walk(paths["lib_dir"]):
        for name in list(dirs):
            path = os.path.join(top, name)
            if path not in own:
                found.append(path)
                dirs.remove(name)   # removed as a whole
        found.extend(os.path.join(top, name) for name in names if os.path.join(top, name) not in files)
    return sorted(found)


def write_file(path: str, content: str, mode: int, uid: int, gid: int) -> None:
    """Write path whole, owned uid:gid with mode: a new file of a name no one can guess (mkstemp, which never
    follows a link) in the same directory, renamed over path (a link there is replaced, not followed)."""
    fd, scratch = tempfile.mkstemp(dir=os.path.dirname(path), prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(scratch, path)
    except BaseException:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise


def _own_dir(directory, uid, gid):
    """Create the restore's own directory, or bring an existing one to uid:gid, DIR_MODE (never through a link)."""
    os.makedirs(os.path.dirname(directory), mode=DIR_MODE, exist_ok=True)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise errors.RefusedError("%s is not a directory (a link, say): the boot-time restore keeps its files in a "
                                  "directory of its own there. Remove it and run again." % directory)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(directory, uid, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(directory, DIR_MODE)


def _remove(path):
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def install_files(files: Mapping[str, tuple[str, int]], paths: Mapping[str, str], uid: int, gid: int,
                  dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Bring the host's restore files in step with files: (written, removed). Written: the files and the own
    directories created or brought back to their owner and mode, the desired state last (its stamp says the
    rest is in place); removed: what lay under lib_dir and was not the restore's. Call refuse_unsafe first."""
    differs = drift(files, paths, uid, gid)
    desired_path = os.path.join(paths["config_dir"], DESIRED_FILE)
    own = own_dirs(files, paths)
    directories = sorted(path for path in differs if path in own)
    removed = [path for path in differs if path not in files and path not in own]
    written = directories + sorted((path for path in differs if path in files), key=lambda p: (p == desired_path, p))
    if dry_run:
        return written, sorted(removed)
    try:
        for directory in directories:
            _own_dir(directory, uid, gid)
        for path in sorted(removed):
            _remove(path)
        for path in written[len(directories):]:
            os.makedirs(os.path.dirname(path), mode=DIR_MODE, exist_ok=True)
            write_file(path, files[path][0], files[path][1], uid, gid)
    except OSError as e:
        raise errors.ApplyError("The boot-time restore could not be written: %s%s" % (
            e.strerror or e, " (%s)" % e.filename if e.filename else ""))
    return written, sorted(removed)


def in_step(files: Mapping[str, tuple[str, int]], paths: Mapping[str, str], python: str | None, uid: int,
            gid: int) -> bool:
    """Whether the restore installed on the host is exactly files (content by sha256, mode, owner), with nothing
    else under lib_dir, and nothing another user than root could change on the way to it."""
    try:
        refuse_unsafe(files, paths, python, uid)
    except errors.RefusedError:
        return False
    return not drift(files, paths, uid, gid)


# -- what runs at boot ----------------------------------------------------------

def log(message: str) -> None:
    sys.stdout.write("gpuops-mig-restore: %s\n" % message)
    sys.stdout.flush()


def open_session(desired: Mapping[str, Any]) -> nvml_lib.Nvml:
    """An NVML session, waiting up to wait_for_driver seconds for a driver that is not there yet."""
    deadline = time.monotonic() + float(desired.get("wait_for_driver") or 0)
    while True:
        session = nvml_lib.Nvml(driver_root=desired.get("driver_root"))
        try:
            return session.__enter__()
        except errors.DriverNotFound as e:
            if time.monotonic() >= deadline:
                raise
            log("waiting for the NVIDIA driver: %s" % e)
            time.sleep(2)


def restore(desired: Mapping[str, Any], dry_run: bool = False) -> int:
    nvml = open_session(desired)
    try:
        if nvml.driver.root:
            log("NVIDIA driver under %s" % nvml.driver.root)
        try:
            entries = host_layout.load_entries(config=desired.get("config"), config_name=desired.get("config_name"),
                                               layouts=desired.get("layouts"))
            # The whole config, geometry included, is checked before the first change.
            request = host_mode.request_from_config(nvml, entries, bool(desired.get("allow_unmatched")))
            records = host_mode.plan(nvml, request)
        except (errors.ConfigError, errors.LayoutError, errors.RefusedError, errors.SelectionError) as e:
            log("the desired state cannot be applied: %s" % e)
            return EXIT_BAD_INPUT
        for record in records:
            if record.get("needs_set"):
                log("%s: MIG mode %s -> %s" % (record["label"], record["mig_mode_before"]["current"],
                                               nvml_lib.mode_name(record["desired"])))
        host_mode.apply(nvml, records, check_mode=dry_run)
        if desired.get("reset", True) and not dry_run:
            host_mode.reset_pending(nvml, records, nvml_lib.timed_run(nvml_lib.RESET_TIMEOUT),
                                    nvml.driver.smi_command(desired.get("nvidia_smi") or "nvidia-smi"))
            for record in records:
                reset = record["reset"]
                if reset["attempted"] or reset["reason"]:
                    log("%s: GPU reset %s" % (record["label"], "done" if reset["ok"] else "refused (%s): %s"
                                              % (reset["reason"], reset["message"])))
        host_mode.report(nvml, records, check_mode=dry_run)
        pending = host_mode.pending_labels(records)
        if pending and not dry_run:
            log("MIG mode still pending on %s; not rebooting (reboot the node, or stop the GPU clients and "
                "run this again)" % "; ".join(pending))
            return EXIT_PENDING
        work = host_layout.plan_host(nvml, request.resolution, request.gpus, force=False, check_mode=dry_run)
        if not dry_run:
            host_layout.apply_host(nvml, work)
            host_layout.reread(nvml, work)
        for item in host_layout.report(work):
            if not item["mig_enabled"]:
                continue
            devices = item.get("mig_devices") if not dry_run else item["target"]
            log("GPU %d (%s): %s%s" % (item["index"], item["name"],
                                       ", ".join("%s x%d" % kv for kv in sorted(devices.items())) or "no MIG devices",
                                       " (would change)" if dry_run and item["changed"] else
                                       " (created)" if item["changed"] else " (already in place)"))
        return fresh_device_files(desired, dry_run)
    finally:
        nvml.__exit__(None, None, None)


def fresh_device_files(desired: Mapping[str, Any], dry_run: bool = False) -> int:
    """After the layout: /dev/nvidia-caps made current and the host's CDI spec regenerated, so containers get
    the MIG devices that now exist (absent keys: a restore installed before these steps, nothing to do). Each
    is tried; a failure is logged and gives EXIT_FAILED."""
    status = EXIT_OK
    root = desired.get("device_nodes_root")
    if root:
        try:
            lines = nvidia_caps.refresh(root, check_mode=dry_run)
            log("/dev/nvidia-caps: %s" % ("; ".join(lines) + (" (would change)" if dry_run else "")
                                          if lines else "already current"))
        except errors.GpuopsError as e:
            log("/dev/nvidia-caps: %s" % e)
            status = EXIT_FAILED
    spec = cdi.spec_in_use(desired.get("cdi_spec_paths") or [])
    if spec:
        try:
            run = nvml_lib.timed_run(nvml_lib.PROGRAM_TIMEOUT)
            changed = cdi.refresh(spec, run, check_mode=dry_run)
            log("CDI spec %s: %s" % (spec, ("would be regenerated" if dry_run else "regenerated") if changed
                                     else "already lists the current devices"))
        except errors.GpuopsError as e:
            log("CDI spec %s: %s" % (spec, e))
            status = EXIT_FAILED
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuops-mig-restore",
                                     description="Restore the MIG mode and layout declared by gpuops.mig.")
    parser.add_argument("--desired", default=DEFAULT_DESIRED, help="desired-state file (default %(default)s)")
    parser.add_argument("--engine-dir", default=DEFAULT_ENGINE_DIR,
                        help="where the engine copy lives (default %(default)s); the launcher imports it from there")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    args = parser.parse_args(argv)
    try:
        with open(args.desired) as f:
            desired = json.load(f)
    except (IOError, OSError, ValueError) as e:
        log("cannot read the desired state %s: %s" % (args.desired, e))
        return EXIT_BAD_INPUT
    if not isinstance(desired, dict) or desired.get("format") != FORMAT or \
            (desired.get("config") is None) == (desired.get("layouts") is None):
        log("%s: expected {\"format\": 1} with exactly one of \"config\" and \"layouts\"" % args.desired)
        return EXIT_BAD_INPUT
    try:
        return restore(desired, args.dry_run)
    except errors.GpuopsError as e:
        log("%s" % e)
        return EXIT_FAILED
