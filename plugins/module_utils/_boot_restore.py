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
processes that would have to go, changes nothing.

Exit status: 0 done (or nothing to do), 1 refused before any change (bad input,
busy devices), 2 NVML or apply failure, 3 MIG mode still pending (a reboot or a
manual reset is needed).

The desired-state file is JSON: {"format": 1, "config": {...mig-parted v1...} or
"layouts": [...], "config_name": "...", "allow_unmatched": false, "reset": true,
"nvidia_smi": "nvidia-smi", "driver_root": "auto", "wait_for_driver": 0,
"installed": "<stamp>"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from ansible_collections.gpuops.mig.plugins.module_utils import _errors as errors
from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
from ansible_collections.gpuops.mig.plugins.module_utils import _host_mode as host_mode
from ansible_collections.gpuops.mig.plugins.module_utils import _nvml as nvml_lib

PACKAGE = "ansible_collections.gpuops.mig.plugins.module_utils"
ENTRY = PACKAGE + "._boot_restore"
FORMAT = 1
UNIT_NAME = "gpuops-mig-restore.service"
DEFAULT_DESIRED = "/etc/gpuops-mig/desired.json"
DEFAULT_ENGINE_DIR = "/usr/local/lib/gpuops-mig"

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PENDING = 0, 1, 2, 3


# -- what is installed -------------------------------------------------------------

# The engine: this file and every collection module_utils it imports, transitively. A list
# rather than found from the imports at run time (ast, about 25 ms), because every node read
# (gpuops.mig.mig_node_info) derives the restore's stamp from these sources;
# tests/unit/plugins/module_utils/test__boot_restore.py keeps it equal to what the imports say.
ENGINE_MODULES = tuple("%s.%s" % (PACKAGE, name) for name in (
    "_boot_restore", "_bounded_yaml", "_errors", "_gpu_layout", "_gpu_selection", "_host_layout", "_host_mode",
    "_migparted", "_nvml"))


def engine_sources(read_source=None):
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


def launcher(python, engine_dir):
    """The script the unit runs: import the engine from engine_dir (a regular package there, found
    ahead of any other copy on sys.path, an installed collection say) and run it."""
    return ("#!%s\n"
            "# gpuops-mig-restore, installed by gpuops.mig.mig_boot_restore: restores the MIG mode and layout\n"
            "# at boot with the engine copy under %s (see its _boot_restore.py).\n"
            "import sys\n"
            "sys.path.insert(0, %r)\n"
            "from %s import main\n"
            "sys.exit(main(sys.argv[1:]))\n" % (python, engine_dir, engine_dir, ENTRY))


def unit_text(python, script, desired_path, engine_dir, before=(), after=(), container_driver=False):
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
        "ExecStart=%s %s --desired %s --engine-dir %s" % (python, script, desired_path, engine_dir),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def bundle(paths, desired, python, before=(), after=(), read_source=None):
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
    desired_path = os.path.join(paths["config_dir"], "desired.json")
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


def paths_of(params):
    """Where the installation goes: config_dir, lib_dir, script, unit_dir, under params["root"]."""
    root = params.get("root") or ""
    return dict((key, root + params[key]) for key in ("config_dir", "lib_dir", "script", "unit_dir"))


def desired_of(params):
    """The desired state the restore reads at boot (written with the installation's stamp)."""
    wait = params.get("wait_for_driver")
    container = params.get("driver_root") not in _HOST_DRIVER
    return {
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


def unit_order(params):
    """(before, after): with a driver container kubelet must come first (it starts the driver)."""
    before = params.get("before") or list(DEFAULT_BEFORE)
    if params.get("driver_root") in _HOST_DRIVER:
        return before, []
    return [u for u in before if u != "kubelet.service"], ["kubelet.service"]


def bundle_for(params, python):
    """bundle() for mig_boot_restore's parameters."""
    before, after = unit_order(params)
    return bundle(paths_of(params), desired_of(params), python, before=before, after=after)


def installed_stamp(config_dir):
    """The stamp of the restore installed on this host, or None."""
    try:
        with open(os.path.join(config_dir, "desired.json")) as handle:
            return json.load(handle).get("installed")
    except (IOError, OSError, ValueError, AttributeError):
        return None


# -- what runs at boot ----------------------------------------------------------

def log(message):
    sys.stdout.write("gpuops-mig-restore: %s\n" % message)
    sys.stdout.flush()


def run_command(argv, env=None):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=dict(os.environ, **env) if env else None, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def open_session(desired):
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


def restore(desired, dry_run=False):
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
            host_mode.reset_pending(nvml, records, run_command,
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
        return EXIT_OK
    finally:
        nvml.__exit__(None, None, None)


def main(argv=None):
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
