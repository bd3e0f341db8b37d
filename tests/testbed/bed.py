# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet test bed: SSH hosts with simulated GPUs in network namespaces, and a Kubernetes API on loopback.

    bed.py setup                 install sshd and nc (apt), build the target venv (idempotent, quick)
    bed.py up                    bring up every host of the inventory and the Kubernetes API
    bed.py reset [HOST...]       reprovision hosts (fresh disks, fresh GPUs); without HOST also a fresh cluster
    bed.py reset --gpu-operator CONFIG
                                 the same, and the cluster also gets the GPU Operator (CRD, ClusterPolicy with
                                 mig.strategy mixed and migManager.config.name mig-layouts, the user's
                                 ConfigMap of that name holding the mig-parted file CONFIG); the
                                 operator and mig-manager stand-ins act on it
    bed.py reset --gpu-operator-default
                                 the GPU Operator as the chart installs it by default: no migManager.config.name, so
                                 mig-manager generates <node>-mig-config from each node's GPUs and the operator
                                 rewrites default-mig-parted-config from its own asset
    bed.py reset --pod-resources also a kubelet PodResources API per GPU node (gRPC on the host's
                                 /var/lib/kubelet/pod-resources/kubelet.sock), answering with the devices the
                                 kubelet's device manager stand-in assigned to the node's pods
    bed.py power-on HOST...      boot hosts that are down (a reboot that never came back, a poweroff)
    bed.py status                hosts and API, one line each
    bed.py down                  remove everything: processes, namespaces, files

Run it as root with the repository's .venv python. The hosts are the `gpu_nodes`
of extensions/molecule/inventory/hosts.yml; docs/testbed.md explains the design.
Nothing is added to the root network namespace: each host only has `lo`, and
Ansible reaches it with `ip netns exec gpuops-NAME nc 127.0.0.1 22`.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
sys.path.insert(0, REPO)

from tests.support.kubeapi import seed  # noqa: E402  (needs REPO on sys.path)
from tests.testbed.guest import HOST_PATH, kill_until_gone  # noqa: E402

BED = "/tmp/gpuops-testbed"  # also written literally in the inventory
INVENTORY = os.path.join(REPO, "extensions", "molecule", "inventory", "hosts.yml")
NETNS_PREFIX = "gpuops-"
GUEST = os.path.join(REPO, "tests", "testbed", "guest.py")
MIG_SIM = os.path.join(REPO, "tools", "mig-sim")
TARGET_VENV = os.path.join(REPO, ".build", "testbed", "target-venv")
# Pinned as in requirements-dev.txt. grpcio and protobuf: the PodResources client (live reconfiguration),
# which a GPU node of a Kubernetes cluster gets (README, docs/install.md).
TARGET_PACKAGES = ("nvidia-ml-py", "PyYAML", "grpcio", "protobuf")
VENV_PYTHON = sys.executable
SSHD = "/usr/sbin/sshd"
APT_PACKAGES = ("openssh-server", "netcat-openbsd")
START_TIMEOUT_S = 240  # the control plane (about 10 s), the seed, and the cluster settling
STOP_TIMEOUT_S = 30

# The cluster around the GPU hosts: a DaemonSet on every GPU node, and a training job whose
# PodDisruptionBudget (minAvailable 2, met by the two pods on the CPU node) lets drains through.
CPU_NODE = "cpu-0"
# reset --gpu-operator-default: the chart's default install (no migManager.config.name).
DEFAULT_INSTALL = "default-install"
GPU_NODE_LABEL = {"nvidia.com/gpu.present": "true"}


def log(message):
    print("bed: %s" % message, file=sys.stderr, flush=True)


def sh(*argv, check=True, quiet=False):
    return subprocess.run(list(argv), check=check, text=True,
                          stdout=subprocess.DEVNULL if quiet else None,
                          stderr=subprocess.DEVNULL if quiet else None)


# ----- inventory ----------------------------------------------------------------------------------

def fleet(inventory=INVENTORY):
    """{name: {"gpus": spec, "host": [mig-sim host options]}} for the gpu_nodes of the inventory."""
    with open(inventory, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    return {name: {"gpus": hv["testbed_gpus"], "host": [str(a) for a in hv.get("testbed_host") or []]}
            for name, hv in hosts.items()}


def host_dir(name):
    return os.path.join(BED, "hosts", name)


def pod_resources_socket(name):
    """The controller's path of the kubelet socket that the host sees at /var/lib/kubelet/pod-resources (guest.py)."""
    return os.path.join(host_dir(name), "pod-resources", "kubelet.sock")


def netns(name):
    return NETNS_PREFIX + name


# ----- setup --------------------------------------------------------------------------------------

def setup():
    if os.geteuid() != 0:
        raise SystemExit("bed: must run as root (network and mount namespaces)")
    if not (os.path.exists(SSHD) and shutil.which("nc")):
        log("installing %s" % " ".join(APT_PACKAGES))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES]
        if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=True)
            subprocess.run(install, env=env, check=True, stdout=subprocess.DEVNULL)
    build_target_venv()


def target_pins():
    """The versions requirements-dev.txt pins for the packages a GPU host needs."""
    pins = {}
    with open(os.path.join(REPO, "requirements-dev.txt"), encoding="utf-8") as handle:
        for line in handle:
            line = line.split("#")[0].strip()
            name = line.split("==")[0].strip()
            if name in TARGET_PACKAGES:
                pins[name] = line
    return [pins.get(name, name) for name in TARGET_PACKAGES]


def build_target_venv():
    """A GPU host's interpreter: the system python3 with only nvidia-ml-py and PyYAML added, and the
    GPU simulator on its path (a .pth file: what docs/simulator.md tells users to do for a test host)."""
    pins = target_pins()
    stamp = os.path.join(TARGET_VENV, ".gpuops-testbed")
    if os.path.exists(stamp) and open(stamp, encoding="utf-8").read() == " ".join(pins):
        point_at_simulator()
        return
    log("building the target venv %s (%s)" % (TARGET_VENV, " ".join(pins)))
    shutil.rmtree(TARGET_VENV, ignore_errors=True)
    sh("/usr/bin/python3", "-m", "venv", "--without-pip", TARGET_VENV)
    sh(VENV_PYTHON, "-m", "pip", "--python", os.path.join(TARGET_VENV, "bin", "python"),
       "install", "-q", "--disable-pip-version-check", *pins)
    point_at_simulator()
    with open(stamp, "w", encoding="utf-8") as handle:
        handle.write(" ".join(pins))


def point_at_simulator():
    """simulator/ of this checkout on the target venv's path (the checkout may have moved since the build)."""
    site = subprocess.run([os.path.join(TARGET_VENV, "bin", "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "gpuops_mig_sim.pth"), "w", encoding="utf-8") as handle:
        handle.write(os.path.join(REPO, "simulator") + "\n")


# ----- hosts --------------------------------------------------------------------------------------

def make_keys():
    for key in ("id_ed25519", "ssh_host_ed25519_key"):
        path = os.path.join(BED, key)
        if not os.path.exists(path):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuops-testbed", "-f", path)
    shutil.copyfile(os.path.join(BED, "id_ed25519.pub"), os.path.join(BED, "authorized_keys"))
    os.chmod(os.path.join(BED, "authorized_keys"), 0o600)
    link = os.path.join(BED, "venv")
    if not os.path.islink(link):
        os.symlink(TARGET_VENV, link)


SSHD_CONFIG = """\
# gpuops test bed host {name}: sshd in network namespace {netns}, loopback only
Port 22
ListenAddress 127.0.0.1
HostKey {bed}/ssh_host_ed25519_key
PidFile /run/gpuops-sim/sshd.pid
AuthorizedKeysFile {bed}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxSessions 50
MaxStartups 100:30:200
SetEnv GPUOPS_MIG_SIMULATE=/run/gpuops-sim/state.json SYSTEMD_UNIT_PATH=/etc/systemd/system PATH={path}
Subsystem sftp internal-sftp
"""


def provision(name, spec):
    """A fresh host: new directory (empty disks), new simulated GPUs, quirks from the inventory."""
    hdir = host_dir(name)
    shutil.rmtree(hdir, ignore_errors=True)
    os.makedirs(os.path.join(hdir, "pod-resources"))
    state = os.path.join(hdir, "state.json")
    sh(VENV_PYTHON, MIG_SIM, "create", state, "--gpus", spec["gpus"], "--seed", name, quiet=True)
    if spec["host"]:
        sh(VENV_PYTHON, MIG_SIM, "host", state, *spec["host"], quiet=True)
    with open(os.path.join(hdir, "sshd_config"), "w", encoding="utf-8") as handle:
        handle.write(SSHD_CONFIG.format(name=name, netns=netns(name), bed=BED, path=HOST_PATH))
    if not os.path.exists(os.path.join("/run/netns", netns(name))):
        sh("ip", "netns", "add", netns(name))
        sh("ip", "-n", netns(name), "link", "set", "lo", "up")


def start_host(name, boot=False):
    """Start the host's namespaces and sshd (through guest.py start); returns without waiting."""
    hdir = host_dir(name)
    for stale in ("sshd.pid", "down"):
        if os.path.exists(os.path.join(hdir, stale)):
            os.unlink(os.path.join(hdir, stale))
    console = open(os.path.join(hdir, "console.log"), "a", encoding="utf-8")
    argv = ["ip", "netns", "exec", netns(name), "unshare", "--uts", "--mount", "--propagation", "private",
            "/usr/bin/python3", GUEST, "start", "--host-dir", hdir, "--hostname", name]
    subprocess.Popen(argv + (["--boot"] if boot else []), stdin=subprocess.DEVNULL, stdout=console,
                     stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
    console.close()


def host_pids(name):
    if not os.path.exists(os.path.join("/run/netns", netns(name))):
        return []
    out = subprocess.run(["ip", "netns", "pids", netns(name)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def stop_host(name):
    """Power off: kill every process of the host (its namespaces die with them)."""
    left = kill_until_gone(lambda: host_pids(name), rounds=50)
    if left:
        raise SystemExit("bed: processes of %s do not die: %s" % (name, left))


def sshd_listening(name):
    pidfile = os.path.join(host_dir(name), "sshd.pid")
    if not os.path.exists(pidfile):  # sshd writes it once it listens
        return False
    probe = subprocess.run(["ip", "netns", "exec", netns(name), "nc", "-z", "-w", "1", "127.0.0.1", "22"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return probe.returncode == 0


def wait_listening(names):
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = set(names)
    while waiting and time.monotonic() < deadline:
        waiting = {n for n in waiting if not sshd_listening(n)}
        if waiting:
            time.sleep(0.05)
    if waiting:
        details = "; ".join("%s: %s" % (n, tail(os.path.join(host_dir(n), "console.log"))) for n in sorted(waiting))
        raise SystemExit("bed: sshd did not come up on %s" % details)


def tail(path, lines=5):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return " | ".join(handle.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def reprovision(names, specs):
    for name in names:
        stop_host(name)
        provision(name, specs[name])
        start_host(name)
    wait_listening(names)


# ----- Kubernetes API -----------------------------------------------------------------------------

def cluster_seed(specs, gpu_operator=None, pod_resources=False):
    """Nodes for the GPU hosts (linked to their simulated GPUs) and a CPU node, pods on them:
    a DaemonSet on the GPU nodes, a ReplicaSet-owned training pod per GPU node with a PDB.
    With gpu_operator (a mig-parted config file, or DEFAULT_INSTALL), also the GPU Operator (seed.gpu_operator).
    With pod_resources, each GPU node's pods get devices and the node a PodResources server (allocations.py)."""
    objs = [seed.namespace("gpu-monitoring"), seed.namespace("ml")]
    objs.append(seed.node(CPU_NODE))
    for name in specs:
        objs.append(seed.node(name, dict(GPU_NODE_LABEL), nvml_state=os.path.join(host_dir(name), "state.json"),
                              pod_resources=pod_resources_socket(name) if pod_resources else None))
    objs.append(seed.daemonset("dcgm-exporter", namespace="gpu-monitoring", node_selector=dict(GPU_NODE_LABEL),
                               labels={"app": "dcgm-exporter"}))
    train = {"app": "train"}
    for node in list(specs) + [CPU_NODE, CPU_NODE]:
        index = sum(1 for o in objs if o["kind"] == "Pod")
        objs.append(seed.pod("train-7c9d-%d" % index, node=node, namespace="ml", labels=train,
                             owner=("ReplicaSet", "train-7c9d")))
    objs.append(seed.pdb("train", train, namespace="ml", min_available=2))
    if gpu_operator == DEFAULT_INSTALL:
        objs.extend(seed.gpu_operator(mig_strategy="mixed"))
    elif gpu_operator:
        # The simulated mig-manager is a stand-in in the test cluster's process, on the
        # controller: it reaches each host's GPUs through the nodes' kubeapi.test/nvml-state
        # (the host directories, controller paths).
        with open(gpu_operator, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
        objs.extend(seed.gpu_operator(mig_strategy="mixed", config_name="mig-layouts", config=config))
    return objs


def kube_info():
    try:
        with open(os.path.join(BED, "cluster.json"), encoding="utf-8") as handle:
            return json.load(handle)
    except OSError:
        return None


def stop_kube():
    info = kube_info()
    if info:
        try:
            os.kill(info["pid"], signal.SIGTERM)
            for dummy in range(STOP_TIMEOUT_S * 20):
                os.kill(info["pid"], 0)
                time.sleep(0.05)
            os.kill(info["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.unlink(os.path.join(BED, "cluster.json"))
    shutil.rmtree(os.path.join(BED, "cluster"), ignore_errors=True)


def start_kube(specs, gpu_operator=None, pod_resources=False):
    """A fresh test cluster (tests/support/controlplane: the real control plane and the NVIDIA
    stand-ins) seeded with cluster_seed. BED/kubeconfig is the admin's, for the scenarios' own
    steps; BED/collection.kubeconfig a ServiceAccount bound to the rules of rbac/ only, which the
    inventory gives the collection."""
    stop_kube()
    seed_file = os.path.join(BED, "kube-seed.yaml")
    with open(seed_file, "w", encoding="utf-8") as handle:
        yaml.safe_dump_all(cluster_seed(specs, gpu_operator, pod_resources), handle, sort_keys=False)
    out_path = os.path.join(BED, "cluster.out")
    log_path = os.path.join(BED, "cluster.log")
    with open(out_path, "w", encoding="utf-8") as out, open(log_path, "a") as err:
        proc = subprocess.Popen([VENV_PYTHON, "-m", "tests.support.controlplane",
                                 "--dir", os.path.join(BED, "cluster"), "--seed", seed_file,
                                 "--rbac-kubeconfig", os.path.join(BED, "collection.kubeconfig")],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(out_path, encoding="utf-8") as handle:
            line = handle.readline()
        if line.endswith("\n"):
            ready = json.loads(line)
            shutil.copyfile(ready["kubeconfig"], os.path.join(BED, "kubeconfig"))
            with open(os.path.join(BED, "cluster.json"), "w", encoding="utf-8") as handle:
                json.dump(dict(ready, pid=proc.pid), handle)
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("bed: the test cluster did not start: %s" % tail(log_path))


# ----- commands -----------------------------------------------------------------------------------

def up(specs):
    setup()
    down(specs, quiet=True)
    os.makedirs(os.path.join(BED, "hosts"), exist_ok=True)
    make_keys()
    for name, spec in specs.items():
        provision(name, spec)
        start_host(name)
    start_kube(specs)
    wait_listening(list(specs))
    log("up: %d hosts, Kubernetes API %s" % (len(specs), kube_info()["url"]))


def reset(specs, names, gpu_operator=None, pod_resources=False):
    for name in names:
        if name not in specs:
            raise SystemExit("bed: no host %r in %s" % (name, INVENTORY))
    if (gpu_operator or pod_resources) and names:
        raise SystemExit("bed: --gpu-operator and --pod-resources seed a fresh cluster: reset every host (no HOST)")
    reprovision(names or list(specs), specs)
    if not names:
        start_kube(specs, gpu_operator, pod_resources)


def power_on(specs, names):
    started = []
    for name in names:
        if sshd_listening(name):
            continue
        stop_host(name)  # leftovers of a half-finished boot
        start_host(name, boot=True)
        started.append(name)
    wait_listening(started)


def down(specs, quiet=False):
    stop_kube()
    names = set(specs)
    if os.path.isdir(os.path.join(BED, "hosts")):  # also hosts dropped from the inventory since `up`
        names |= set(os.listdir(os.path.join(BED, "hosts")))
    for name in sorted(names):
        stop_host(name)
        if os.path.exists(os.path.join("/run/netns", netns(name))):
            sh("ip", "netns", "del", netns(name))
    shutil.rmtree(BED, ignore_errors=True)
    if not quiet:
        log("down")


def status(specs):
    info = kube_info()
    print("kubernetes %s" % (info["url"] if info else "down"))
    for name in specs:
        print("%-10s %s" % (name, "up" if sshd_listening(name) else "down"))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="bed.py", description=__doc__.split("\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--inventory", default=INVENTORY, help="inventory with the gpu_nodes (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup")
    commands.add_parser("up")
    reset_cmd = commands.add_parser("reset")
    reset_cmd.add_argument("hosts", nargs="*")
    operator = reset_cmd.add_mutually_exclusive_group()
    operator.add_argument("--gpu-operator", metavar="CONFIG",
                          help="also seed the GPU Operator, its mig-parted ConfigMap from this file")
    operator.add_argument("--gpu-operator-default", action="store_true",
                          help="also seed the GPU Operator as the chart installs it (no migManager.config.name)")
    reset_cmd.add_argument("--pod-resources", action="store_true",
                           help="a kubelet PodResources server per GPU node, fed from the "
                                "stand-ins' device assignments")
    commands.add_parser("power-on").add_argument("hosts", nargs="+")
    commands.add_parser("status")
    commands.add_parser("down")
    args = parser.parse_args(argv)
    specs = fleet(args.inventory)
    if args.command == "setup":
        setup()
    elif args.command == "up":
        up(specs)
    elif args.command == "reset":
        operator = DEFAULT_INSTALL if args.gpu_operator_default else (
            args.gpu_operator and os.path.abspath(args.gpu_operator))
        reset(specs, args.hosts, operator, args.pod_resources)
    elif args.command == "power-on":
        power_on(specs, args.hosts)
    elif args.command == "status":
        status(specs)
    else:
        down(specs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
