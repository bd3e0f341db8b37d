# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inside of one test host: its start, its boot and its power commands (stdlib only, plain python3).

bed.py starts every host as

    ip netns exec gpuops-NAME unshare --uts --mount --propagation private \
        python3 guest.py start --host-dir DIR --hostname NAME [--boot]

`start` gives the host its own view of the machine (hostname; copy-on-write
/etc, /usr/local, /usr/sbin, /var/lib, /opt and /root, with the host's own
~/.bashrc and ~/.profile; a fresh /run with the host directory at
/run/gpuops-sim; the host directory's pod-resources/ at the kubelet's
/var/lib/kubelet/pod-resources; its own /proc/sys/kernel/random/boot_id), puts stand-ins for
shutdown/reboot/poweroff/halt in /usr/sbin, optionally boots (see `boot`), and
then becomes the host's sshd.

`power` is what those stand-ins run. It answers at once, then, detached
from the SSH session: kills every process of the host (so the connection
really drops), and for a reboot runs `boot` and starts sshd again inside the
same namespaces. A host whose directory holds the marker `no-return`, or a
poweroff, stays down until `bed.py power-on`.

`boot` is what a real boot does to the GPUs and the services: the simulator
reboots the GPUs (new boot id, pending Ampere modes apply, instances vanish,
Hopper+ loses MIG mode), the host's init (simulator/bin/systemctl) runs the
units the rollout enabled, such as the boot-time restore, then starts the GPU
clients again, and /run is emptied.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
MIG_SIM = os.path.join(REPO, "tools", "mig-sim")
SIM_BIN = os.path.join(REPO, "simulator", "bin")
HOST_DIR = "/run/gpuops-sim"  # every host sees its own directory here
STATE = HOST_DIR + "/state.json"
SSHD = "/usr/sbin/sshd"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Directories each host gets its own copy-on-write view of (tag = name of the upper dir).
OVERLAYS = {"etc": "/etc", "usr-local": "/usr/local", "usr-sbin": "/usr/sbin", "var-lib": "/var/lib", "opt": "/opt",
            "root": "/root"}
# root's shell startup files on a host: its own, not the controller's. sshd runs every command
# through `bash -c`, which reads ~/.bashrc; a controller's (a pyenv or cargo setup, say) would
# change the host's PATH and cost every command, Ansible's module runs included, its start-up.
DOTFILES = {
    ".bashrc": "# ~/.bashrc of a gpuops test bed host (its own; not the controller's).\n",
    ".profile": "# ~/.profile of a gpuops test bed host (its own; not the controller's).\n"
                'if [ -n "$BASH_VERSION" ] && [ -f ~/.bashrc ]; then . ~/.bashrc; fi\n',
}
POWER_COMMANDS = ("shutdown", "reboot", "poweroff", "halt")
# The kubelet's PodResources socket directory: the host directory's pod-resources/, where the test
# cluster's process on the controller (python -m tests.support.controlplane) serves the node's
# PodResources API (bed.py reset --pod-resources). A unix socket is a file, not an address: a bind
# mount makes it reachable from the host's network namespace.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"

# A host's PATH (sshd sessions and boot): the simulated driver's tools (nvidia-smi, nvidia-ctk,
# systemctl) come first.
HOST_PATH = SIM_BIN + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What a host's services see at boot: the simulated driver.
BOOT_ENV = {
    "PATH": HOST_PATH,
    "GPUOPS_MIG_SIMULATE": STATE,
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "SYSTEMD_UNIT_PATH": "/etc/systemd/system",  # where simulator/bin/systemctl finds unit files
}


def log(message):
    print("%s guest: %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def run(*argv):
    subprocess.run(list(argv), check=True)


# ----- start ------------------------------------------------------------------------------------

def start(host_dir, hostname, do_boot):
    run("hostname", hostname)
    for tag, target in OVERLAYS.items():
        upper, work = os.path.join(host_dir, "upper", tag), os.path.join(host_dir, "work", tag)
        os.makedirs(upper, exist_ok=True)
        os.makedirs(work, exist_ok=True)
        run("mount", "-t", "overlay", "overlay", "-o",
            "lowerdir=%s,upperdir=%s,workdir=%s" % (target, upper, work), target)
    os.makedirs(POD_RESOURCES_DIR, exist_ok=True)  # in the host's copy of /var/lib
    run("mount", "--bind", os.path.join(host_dir, "pod-resources"), POD_RESOURCES_DIR)
    for name, content in DOTFILES.items():  # into the host's copy of /root
        with open(os.path.join("/root", name), "w", encoding="utf-8") as handle:
            handle.write(content)
    # A fresh /run per host, as after a boot; sshd needs /run/sshd.
    run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run")
    os.makedirs(HOST_DIR)
    os.makedirs("/run/sshd", mode=0o755)
    run("mount", "--bind", host_dir, HOST_DIR)
    if not os.path.exists(os.path.join(HOST_DIR, "boot_id")):
        write_boot_id()
    run("mount", "--bind", os.path.join(HOST_DIR, "boot_id"), BOOT_ID)
    install_power_commands()
    if do_boot:
        boot()
    exec_sshd()


def install_power_commands():
    """Stand-ins in this host's /usr/sbin: a test host must never reboot the machine it runs on."""
    me = os.path.realpath(__file__)
    for name in POWER_COMMANDS:
        path = os.path.join("/usr/sbin", name)
        if os.path.lexists(path):
            os.unlink(path)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write('#!/bin/sh\n# gpuops test bed: simulated power command\n'
                         'exec /usr/bin/python3 %s power %s "$@"\n' % (shlex.quote(me), name))
        os.chmod(path, 0o755)


def write_boot_id():
    boot_id = subprocess.run([sys.executable, MIG_SIM, "boot-id", STATE], check=True,
                             capture_output=True, text=True).stdout.strip()
    # Rewrite in place: the file is bind-mounted over /proc/sys/kernel/random/boot_id.
    with open(os.path.join(HOST_DIR, "boot_id"), "w", encoding="utf-8") as handle:
        handle.write(boot_id + "\n")


def exec_sshd():
    os.execv(SSHD, [SSHD, "-D", "-e", "-f", os.path.join(HOST_DIR, "sshd_config")])


# ----- boot -------------------------------------------------------------------------------------

def boot():
    """What a boot does: the simulated driver reboots the GPUs, then init runs the enabled units.

    simulator/bin/systemctl is the host's init: `systemctl reboot` reboots the simulator's
    GPUs and runs every unit the rollout enabled (the boot-time restore) before the GPU
    clients start, as the real unit's Before= orders it.
    """
    out = subprocess.run([os.path.join(SIM_BIN, "systemctl"), "reboot"], env=BOOT_ENV,
                         capture_output=True, text=True, cwd="/", check=False)
    log("booted (systemctl reboot exited %d)%s" % (out.returncode, (": " + out.stderr.strip()) if out.stderr else ""))
    write_boot_id()
    clean_run()


def clean_run():
    """/run is a tmpfs that a boot empties; keep the mount points."""
    for entry in os.listdir("/run"):
        if entry not in ("gpuops-sim", "sshd"):
            subprocess.run(["rm", "-rf", os.path.join("/run", entry)], check=False)


# ----- power ------------------------------------------------------------------------------------

def power(command, args):
    if command == "shutdown" and "-c" in args:
        return 0  # cancel: nothing is ever pending here
    rebooting = command == "reboot" or (command == "shutdown" and ("-r" in args or "--reboot" in args))
    # The SSH session that ran us hangs up when we are killed with it: ignore that before detaching.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if os.fork():
        print("%s scheduled (simulated test host)" % ("Reboot" if rebooting else "Shutdown"))
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    console = os.open(os.path.join(HOST_DIR, "console.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(console, 1)
    os.dup2(console, 2)
    time.sleep(1)  # let the command's reply reach the caller, like `shutdown -r +0`
    log("%s requested: %s %s" % ("reboot" if rebooting else "poweroff", command, " ".join(args)))
    kill_host_processes()
    if not rebooting or os.path.exists(os.path.join(HOST_DIR, "no-return")):
        log("host is down")
        with open(os.path.join(HOST_DIR, "down"), "w", encoding="utf-8") as handle:
            handle.write(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
        os._exit(0)
    boot()
    log("starting sshd")
    exec_sshd()
    return 0


def kill_until_gone(find_pids, rounds):
    """SIGKILL what find_pids() lists until it lists nothing; returns what is left after `rounds`."""
    for dummy in range(rounds):
        pids = find_pids()
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return find_pids()


def kill_host_processes():
    """SIGKILL every process in this host's network namespace but this one: the power goes off."""
    me = os.getpid()
    own_netns = os.readlink("/proc/self/ns/net")

    def others():
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                if os.readlink("/proc/%s/ns/net" % entry) == own_netns:
                    found.append(int(entry))
            except OSError:
                continue
        return found
    kill_until_gone(others, rounds=20)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="guest.py", description=__doc__.split("\n", maxsplit=1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start_cmd = commands.add_parser("start")
    start_cmd.add_argument("--host-dir", required=True)
    start_cmd.add_argument("--hostname", required=True)
    start_cmd.add_argument("--boot", action="store_true", help="boot the GPUs and run the enabled units first")
    power_cmd = commands.add_parser("power")
    power_cmd.add_argument("name", choices=POWER_COMMANDS)
    power_cmd.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "start":
        start(args.host_dir, args.hostname, args.boot)
        return 0
    return power(args.name, args.args)


if __name__ == "__main__":
    sys.exit(main())
