#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: mig_boot_restore
short_description: Install or remove the boot-time restore of a node's MIG mode and layout
version_added: 0.1.0
description:
  - GPU instances never survive a reboot, and from Hopper on neither does MIG mode. This module installs,
    on the managed host, what brings them back at boot without Ansible; a oneshot systemd unit
    C(gpuops-mig-restore.service) runs a launcher that uses a copy of the collection's own engine (the code
    M(gpuops.mig.mig_mode) and M(gpuops.mig.mig_config) run) with the declared layout.
  - The engine files are the restore's module and every collection module it imports (a list a unit test
    keeps equal to the imports); they travel inside this module's own payload, so the whole installation is
    one transfer. Each file is written only when it differs, and C(changed) says whether anything was written, enabled or removed.
  - What it installs runs as root at every boot, so it must run as root (C(become)); only root can then change
    it. Every file is written whole to a new file of an unguessable name in its directory (never through a
    symbolic link) and renamed into place, owned by root (the user the module runs as) with mode 0644, 0755 for
    the launcher and the directories. It refuses, before any change, a directory on the way to its files, or an
    interpreter (O(python), each link on the way to it and the directories above them), that another user than
    root could change (owned by another user, or writable by group or others, sticky directories such as
    C(/tmp) aside).
  - The restore is in step when every installed file (the engine, the launcher, the unit and the desired state)
    has the content (compared by SHA-256 digest), owner and mode this module writes, and nothing else lies
    under O(lib_dir); otherwise the files that differ are written again, their directories given back to root,
    and anything else under O(lib_dir) removed. M(gpuops.mig.mig_node_info) makes the same check.
  - The desired-state file also carries one checksum (the stamp) of everything installed.
  - Each C(systemctl) call (C(daemon-reload), C(enable), C(disable)) may run for 120 seconds;
    one that runs longer is killed and fails the module.
  - With the host's own driver the unit runs before kubelet and the GPU clients. With a driver under a driver
    root (the GPU Operator's driver container, which kubelet starts), it runs after boot and waits up to
    O(wait_for_driver) seconds for the driver to appear.
  - At boot it validates everything before the first change, never destroys a busy MIG device and never
    reboots; a mode that stays pending is logged (exit status 3).
  - With the host's own driver, after the layout it makes C(/dev/nvidia-caps) current for the MIG devices it
    created (as M(gpuops.mig.mig_device_nodes) does) and regenerates the host's CDI spec, the first of
    C(/etc/cdi/nvidia.yaml) and C(/var/run/cdi/nvidia.yaml) (under O(root)) that exists, replacing it only when it
    differs (as M(gpuops.mig.mig_cdi_refresh) does). With a driver root (the GPU Operator's driver container) the
    container owns the device nodes and the operator's toolkit the spec; the restore leaves both alone.
author:
  - gpuops.mig contributors (@gpuops)
requirements:
  - systemd on the managed host
  - root on the managed host (C(become))
extends_documentation_fragment:
  - gpuops.mig._attributes
  - gpuops.mig._attributes.ACTIONGROUP_MIG
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  state:
    description:
      - V(present) installs (or updates) the restore; V(absent) disables the unit and removes every file.
    type: str
    choices: [present, absent]
    default: present
  config:
    description:
      - The mig-parted v1 config to restore (a mapping, or YAML text), as M(gpuops.mig.mig_config) takes it.
      - Exactly one of O(config) and O(layouts) is required with O(state=present).
    type: raw
  layouts:
    description: Inline per-GPU layouts to restore, as M(gpuops.mig.mig_config) takes them.
    type: list
    elements: dict
  config_name:
    description: The config of O(config) to restore.
    type: str
  allow_unmatched:
    description: As in M(gpuops.mig.mig_config).
    type: bool
    default: false
  reset:
    description:
      - At boot, reset idle GPUs whose new MIG mode is pending (Ampere), instead of leaving them
        pending.
      - A reset may take 120 seconds (as M(gpuops.mig.mig_mode)'s default C(reset_timeout)); one
        still running then is killed and the mode left pending, and the GPUs after it are not
        tried.
    type: bool
    default: true
  nvidia_smi:
    description:
      - The C(nvidia-smi) the restore uses for GPU resets.
      - A single program, a name looked up in E(PATH) at boot or an absolute path; it runs without a shell, so
        arguments and shell syntax (C(;), C(|), C(&), C($), backticks, C(<), C(>)) are refused before any file
        is written. It is not looked up now, since a driver container's C(nvidia-smi) is there only after boot.
    type: str
    default: nvidia-smi
  driver_root:
    description:
      - Where the restore finds the NVIDIA driver at boot (see M(gpuops.mig.mig_mode)'s O(gpuops.mig.mig_mode#module:driver_root)).
      - A driver root other than V(auto) and V(/) orders the unit after boot instead of before kubelet.
    type: str
    default: auto
  wait_for_driver:
    description:
      - Seconds the restore waits at boot for the driver to appear. Defaults to 900 when O(driver_root) names a
        driver root (a driver container comes up after kubelet), else 0.
      - A negative value fails the module before any file is written.
    type: int
  before:
    description:
      - Units the restore must run before, with the host's own driver (kubelet and the services that hold the GPUs).
      - With a driver root, C(kubelet.service) is left out (it starts the driver container).
    type: list
    elements: str
    default: [kubelet.service, nvidia-persistenced.service, nvidia-fabricmanager.service, nvidia-dcgm.service,
              dcgm.service, dcgm-exporter.service, nvsm.service]
  python:
    description:
      - The Python that runs the restore at boot. Defaults to the one running this module.
      - The absolute path of an executable (it becomes the launcher's C(#!) line), checked before any file is
        written; arguments and shell syntax are refused.
    type: str
  root:
    description: A directory every path below is placed under (a test host's own root); empty for a real host.
    type: path
    default: ""
  config_dir:
    description: Where the desired state goes.
    type: path
    default: /etc/gpuops-mig
  lib_dir:
    description:
      - Where the engine copy goes; a directory of the restore's own (anything else in it is removed, as the
        launcher imports from it first).
    type: path
    default: /usr/local/lib/gpuops-mig
  script:
    description: Where the launcher goes.
    type: path
    default: /usr/local/sbin/gpuops-mig-restore
  unit_dir:
    description: Where the systemd unit goes.
    type: path
    default: /etc/systemd/system
  enable:
    description: Enable the unit (and reload systemd when its file changed).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Restore the all-balanced layout of the node at every boot
  gpuops.mig.mig_boot_restore:
    config: "{{ lookup('ansible.builtin.file', 'mig-parted-config.yaml') }}"
    config_name: all-balanced

- name: A node whose driver is the GPU Operator's driver container
  gpuops.mig.mig_boot_restore:
    layouts:
      - gpus: all
        devices: {1g.10gb: 7}
    driver_root: /run/nvidia/driver

- name: MIG is off for good on this node
  gpuops.mig.mig_boot_restore:
    state: absent
"""

RETURN = r"""
stamp:
  description: The checksum of the installation (also kept in the desired-state file); null with O(state=absent).
  returned: always
  type: str
written:
  description: The directories created or given back their owner and mode, and the files written (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
removed:
  description: The files and directories removed (O(state=absent)), or, with O(state=present), found under O(lib_dir) though not part of the restore.
  returned: always
  type: list
  elements: str
unit:
  description: The unit's name and whether this run enabled (or disabled) it and reloaded systemd.
  returned: always
  type: dict
"""

import os
import shutil
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
from ansible_collections.gpuops.mig.plugins.module_utils._common import fail_from
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._input import seconds
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    DRIVER_ROOT_AUTO,
    check_driver_root,
    check_program,
    find_program,
    run_program,
)


def paths_of(params):
    return boot_restore.paths_of(params)


def bundle_for(params):
    """What the installation consists of, and its stamp (mig_node_info computes the same)."""
    return boot_restore.bundle_for(params, params["python"] or sys.executable)


def check_programs(params):
    """What the restore runs at boot, checked before any file is written. nvidia-smi is not looked
    up now: under a driver container's root it appears only once the driver is up after boot."""
    check_driver_root(params["driver_root"])
    check_program(params["nvidia_smi"], "nvidia_smi")
    if params["wait_for_driver"] is not None:
        seconds(params["wait_for_driver"], "wait_for_driver")
    if params["python"] is not None:   # the launcher's #! line: an absolute path
        find_program(params["python"], "python", absolute=True)


def install(module):
    files, stamp = bundle_for(module.params)
    paths = paths_of(module.params)
    # Root's (the running user's where the module runs unprivileged, as in tests).
    uid, gid = os.geteuid(), os.getegid()
    try:
        boot_restore.refuse_unsafe(files, paths, module.params["python"] or sys.executable, uid)
        written, removed = boot_restore.install_files(files, paths, uid, gid, dry_run=module.check_mode)
    except GpuopsError as e:
        fail_from(module, e)
    unit_path = os.path.join(paths["unit_dir"], boot_restore.UNIT_NAME)
    unit = {"name": boot_restore.UNIT_NAME, "reloaded": False, "enabled": False}
    if module.params["enable"]:
        if unit_path in written:
            unit["reloaded"] = True
            systemctl(module, "daemon-reload")
        if systemctl(module, "is-enabled", boot_restore.UNIT_NAME, check=False)[0] != 0:
            unit["enabled"] = True
            systemctl(module, "enable", boot_restore.UNIT_NAME)
    return dict(changed=bool(written or removed or unit["enabled"]), stamp=stamp, written=written, removed=removed,
                unit=unit)


def remove(module):
    paths = paths_of(module.params)
    unit_path = os.path.join(paths["unit_dir"], boot_restore.UNIT_NAME)
    desired_path = os.path.join(paths["config_dir"], boot_restore.DESIRED_FILE)
    try:
        boot_restore.refuse_unsafe({unit_path: None, desired_path: None, paths["script"]: None}, paths, None,
                                   os.geteuid())
    except GpuopsError as e:
        fail_from(module, e)
    unit = {"name": boot_restore.UNIT_NAME, "reloaded": False, "enabled": False, "disabled": False}
    if os.path.exists(unit_path) and module.params["enable"]:
        unit["disabled"] = True
        systemctl(module, "disable", boot_restore.UNIT_NAME)
    removed = []
    for path in (unit_path, desired_path, paths["script"], paths["lib_dir"]):
        if not os.path.lexists(path):
            continue
        removed.append(path)
        if module.check_mode:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return dict(changed=bool(removed), stamp=None, written=[], removed=removed, unit=unit)


def systemctl(module, *args, **kwargs):
    """Runs systemctl (not in check mode, except for queries)."""
    if module.check_mode and args[0] != "is-enabled":
        return 0, "", ""
    argv = [module.get_bin_path("systemctl", required=True)] + list(args)
    try:
        rc, out, err = run_program(argv)      # at most PROGRAM_TIMEOUT seconds
    except OSError as e:                      # cannot run, or killed at its timeout
        module.fail_json(msg="systemctl %s failed: %s" % (" ".join(args), e))
    if rc != 0 and kwargs.get("check", True):
        module.fail_json(msg="systemctl %s failed: %s" % (" ".join(args), (err or out).strip()), rc=rc)
    return rc, out, err


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            config=dict(type="raw"),
            layouts=dict(type="list", elements="dict"),
            config_name=dict(type="str"),
            allow_unmatched=dict(type="bool", default=False),
            reset=dict(type="bool", default=True),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            driver_root=dict(type="str", default=DRIVER_ROOT_AUTO),
            wait_for_driver=dict(type="int"),
            before=dict(type="list", elements="str", default=list(boot_restore.DEFAULT_BEFORE)),
            python=dict(type="str"),
            root=dict(type="path", default=""),
            config_dir=dict(type="path", default=boot_restore.DEFAULT_CONFIG_DIR),
            lib_dir=dict(type="path", default=boot_restore.DEFAULT_ENGINE_DIR),
            script=dict(type="path", default=boot_restore.DEFAULT_SCRIPT),
            unit_dir=dict(type="path", default=boot_restore.DEFAULT_UNIT_DIR),
            enable=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("config", "layouts")],
        required_if=[("state", "present", ("config", "layouts"), True)],
        supports_check_mode=True,
    )
    if module.params["state"] == "present":
        try:
            check_programs(module.params)
        except GpuopsError as e:
            fail_from(module, e)
        module.exit_json(**install(module))
    module.exit_json(**remove(module))


if __name__ == "__main__":
    main()
