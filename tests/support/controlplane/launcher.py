"""Starts and stops the test cluster: etcd, kube-apiserver (TLS, RBAC, a service-account issuer,
the default admission plugins, an audit log), kube-controller-manager, kube-scheduler and kwok,
all on 127.0.0.1, from the binaries scripts/control-plane.sh builds.

    with ControlPlane(tmp_dir) as cp:       # or cp = ControlPlane(d).start(); ...; cp.stop()
        subprocess.run(["kubectl", "--kubeconfig", cp.kubeconfig, "get", "nodes"])

Every process runs in its own session and dies with the thread that started it
(PR_SET_PDEATHSIG), so nothing outlives a test run that is killed. Flags follow envtest
(controller-runtime `pkg/internal/testing/controlplane/{etcd,apiserver}.go`) and kubeadm's
static pods; docs/testing-kubernetes.md says what runs and how long a start takes.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import yaml

from . import pki

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
BUILD_SCRIPT = os.path.join(ROOT, "scripts", "control-plane.sh")
MODULES = os.path.dirname(os.path.abspath(__file__))
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
START_TIMEOUT = 90.0  # seconds; a cold start on 2 loaded cores takes about 10

# kwok's stages: nodes Ready with lease heartbeats, bound pods Running, a pod with a
# deletionTimestamp removed (the end of graceful deletion). Not pod-complete, which ends every
# Job's pod at once: the tests' pods run until they say otherwise.
KWOK_STAGES = ("node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-delete")
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # The controllers' own traffic (leases, heartbeats, their list/watch) is noise to a test.
        {
            "level": "None",
            "users": ["system:kube-scheduler", "system:kube-controller-manager", "kwok"],
        },
        {
            "level": "None",
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            "namespaces": ["kube-node-lease", "kube-system"],
        },
        {"level": "None", "verbs": ["watch"]},
        {"level": "Metadata"},
    ],
}


class ControlPlaneError(RuntimeError):
    """The control plane could not be started (the message says which part and why)."""


def pinned_versions() -> dict:
    """The versions the Go modules in this folder pin: {"kubernetes": "v1.37.2", ...}."""
    out = {}
    for name, module in (
        ("kubernetes", "k8s.io/kubernetes"),
        ("etcd", "go.etcd.io/etcd/server/v3"),
        ("kwok", "sigs.k8s.io/kwok"),
    ):
        with open(os.path.join(MODULES, name, "go.mod"), encoding="utf-8") as f:
            found = re.search(rf"^require {re.escape(module)} (v\S+)$", f.read(), re.M)
        out[name] = found.group(1)
    return out


def binaries_dir() -> str:
    """The directory that holds every binary: KUBEBUILDER_ASSETS where it is complete, else the
    build cache. Builds nothing: a missing build is an error that says how to make it."""
    run = subprocess.run(
        ["bash", BUILD_SCRIPT, "--check"], capture_output=True, text=True, check=False
    )
    if run.returncode == 0:
        return run.stdout.strip().splitlines()[-1]
    raise ControlPlaneError(
        "the control plane is not built: run scripts/control-plane.sh (it builds etcd, "
        "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kwok from the "
        "pinned Go modules; about 25 minutes cold, then cached)" + _tail_text(run.stderr)
    )


def _tail_text(text: str, lines: int = 15) -> str:
    text = (text or "").strip()
    return "\n  " + "\n  ".join(text.splitlines()[-lines:]) if text else ""


def _die_with_parent():
    # Runs in the child before exec: SIGKILL it when the thread that started it goes.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int, what: str) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ControlPlaneError(
                f"{what}: port {port} on 127.0.0.1 is taken ({exc.strerror}); "
                "stop what holds it or leave the port to the launcher"
            ) from None


class ControlPlane:
    """One test cluster. `ports` may fix {"etcd", "apiserver"}; others are chosen free."""

    def __init__(
        self,
        workdir: str,
        *,
        bin_dir: str | None = None,
        ports: dict | None = None,
        node_monitor_period: str = "1s",
    ):
        self.workdir = os.path.abspath(workdir)
        self.bin_dir = bin_dir
        self.ports = dict(ports or {})
        self.node_monitor_period = node_monitor_period
        self.versions = pinned_versions()
        self.procs: list = []  # (name, Popen, log path), in start order
        self.kubeconfig = os.path.join(self.workdir, "admin.kubeconfig")  # what tests run as
        self.harness_kubeconfig = os.path.join(self.workdir, "harness.kubeconfig")
        self.audit_log = os.path.join(self.workdir, "audit.log")
        self.timings: dict = {}
        self.pki: dict = {}

    # ----- lifecycle -------------------------------------------------------------------------

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def start(self) -> "ControlPlane":
        began = time.monotonic()
        try:
            self._prepare()
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = round(time.monotonic() - began, 2)
        return self

    def stop(self) -> None:
        """Stops everything started, newest first (also after a failed start); idempotent."""
        while self.procs:
            dummy, proc, dummy_log = self.procs.pop()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # ----- the parts -------------------------------------------------------------------------

    def _prepare(self):
        self.bin_dir = self.bin_dir or binaries_dir()
        for name in BINARIES:
            path = os.path.join(self.bin_dir, name)
            if not os.access(path, os.X_OK):
                raise ControlPlaneError(
                    f"{name} is missing from {self.bin_dir} (or not executable): "
                    "run scripts/control-plane.sh"
                )
        self._check_versions()
        for what in ("etcd", "apiserver"):
            if what in self.ports:
                check_port(self.ports[what], what)
        for what in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            self.ports.setdefault(what, free_port())
        try:
            os.makedirs(self.workdir, exist_ok=True)
            data = os.path.join(self.workdir, "etcd")
            if os.path.exists(data) and not os.path.isdir(data):
                raise OSError(f"{data} exists and is not a directory")
            os.makedirs(data, mode=0o700, exist_ok=True)
            probe = os.path.join(data, ".writable")
            with open(probe, "w", encoding="utf-8"):
                pass
            os.unlink(probe)
        except OSError as exc:
            raise ControlPlaneError(
                f"etcd's data directory under {self.workdir} is unusable: {exc}"
            ) from None
        self.pki = pki.write(os.path.join(self.workdir, "pki"))
        for client in pki.CLIENTS:
            self._write_kubeconfig(
                self._kubeconfig_of(client),
                {
                    "client-certificate": self.pki[f"{client}.crt"],
                    "client-key": self.pki[f"{client}.key"],
                },
                client,
            )
        with open(os.path.join(self.workdir, "audit-policy.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump(AUDIT_POLICY, f)

    def _check_versions(self):
        want = {
            "kube-apiserver": self.versions["kubernetes"],
            "kubectl": self.versions["kubernetes"],
            "etcd": self.versions["etcd"],
        }
        for name, version in want.items():
            args = [os.path.join(self.bin_dir, name)]
            args += ["version", "--client"] if name == "kubectl" else ["--version"]
            out = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
            text = out.stdout + out.stderr
            if version.lstrip("v") not in text:
                raise ControlPlaneError(
                    f"{name} in {self.bin_dir} is not {version} (it says: "
                    f"{text.strip()[:200]!r}); run scripts/control-plane.sh"
                )

    def _spawn(self, name: str, args: list) -> subprocess.Popen:
        log = os.path.join(self.workdir, f"{name}.log")
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [os.path.join(self.bin_dir, args[0])] + args[1:],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.procs.append((name, proc, log))
        return proc

    def _wait(self, name: str, proc, ready, timeout: float = START_TIMEOUT):
        began = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode} while starting; "
                    f"its log ({self._log(name)}) ends:{_tail_text(self._read_log(name))}"
                )
            try:
                if ready():
                    self.timings[name] = round(time.monotonic() - began, 2)
                    return
            except (OSError, ssl.SSLError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() - began > timeout:
                raise ControlPlaneError(
                    f"{name} was not ready within {timeout:.0f} s; its log ends:"
                    f"{_tail_text(self._read_log(name))}"
                )
            time.sleep(0.1)

    def _log(self, name):
        return os.path.join(self.workdir, f"{name}.log")

    def _read_log(self, name):
        try:
            with open(self._log(name), encoding="utf-8", errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def _start_etcd(self):
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        proc = self._spawn(
            "etcd",
            [
                "etcd",
                "--name=test",
                f"--data-dir={self.workdir}/etcd",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--listen-metrics-urls=",
                "--quota-backend-bytes=2147483648",
            ],
        )
        self._wait(
            "etcd",
            proc,
            lambda: json.loads(urllib.request.urlopen(f"{client}/health", timeout=2).read()).get(
                "health"
            )
            == "true",
        )

    def _https(self, port: int, path: str) -> int:
        ctx = ssl.create_default_context(cafile=self.pki["ca.crt"])
        if port != self.ports["apiserver"]:
            ctx = ssl._create_unverified_context()  # pylint: disable=protected-access
        ctx.load_cert_chain(self.pki["admin.crt"], self.pki["admin.key"])
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=ctx, timeout=3
        ) as r:
            return r.status

    def _start_apiserver(self):
        p = self.pki
        port = self.ports["apiserver"]
        proc = self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={p['apiserver.crt']}",
                f"--tls-private-key-file={p['apiserver.key']}",
                f"--client-ca-file={p['ca.crt']}",
                f"--service-account-issuer=https://127.0.0.1:{port}",
                f"--service-account-key-file={p['sa.pub']}",
                f"--service-account-signing-key-file={p['sa.key']}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=1h",
                # the kubernetes Service cannot point at a loopback address (as envtest)
                "--endpoint-reconciler-type=none",
                f"--audit-policy-file={self.workdir}/audit-policy.yaml",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=200",
                f"--cert-dir={self.workdir}/pki",
            ],
        )
        self._wait("kube-apiserver", proc, lambda: self._https(port, "/readyz") == 200)

    def _kubeconfig_of(self, client: str) -> str:
        return os.path.join(self.workdir, f"{client}.kubeconfig")

    def _start_controllers(self):
        def common(client):
            kc = self._kubeconfig_of(client)
            return [
                f"--kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
            ]

        kcm = self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                *common("controller-manager"),
                f"--secure-port={self.ports['controller-manager']}",
                # every default controller: disruption, garbage collector, namespace, ReplicaSet,
                # Deployment, DaemonSet, Job, ResourceClaim, device-taint eviction, node lifecycle
                # (it lifts node.kubernetes.io/not-ready once kwok reports the node Ready)
                "--controllers=*",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={self.pki['sa.key']}",
                f"--root-ca-file={self.pki['ca.crt']}",
                f"--cluster-signing-cert-file={self.pki['ca.crt']}",
                f"--cluster-signing-key-file={self.pki['ca.key']}",
                f"--node-monitor-period={self.node_monitor_period}",
                "--concurrent-gc-syncs=5",
            ],
        )
        sched = self._spawn(
            "kube-scheduler",
            ["kube-scheduler", *common("scheduler"), f"--secure-port={self.ports['scheduler']}"],
        )
        kwok = self._spawn(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={self._kubeconfig_of('kwok')}",
                "--manage-all-nodes=true",
                f"--config={self._stages()}",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.255.0.1",
            ],
        )
        self._wait(
            "kube-controller-manager",
            kcm,
            lambda: self._https(self.ports["controller-manager"], "/healthz") == 200,
        )
        self._wait(
            "kube-scheduler",
            sched,
            lambda: self._https(self.ports["scheduler"], "/healthz") == 200,
        )
        self._wait(
            "kwok",
            kwok,
            lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{self.ports['kwok']}/healthz", timeout=2
            ).status
            == 200,
        )

    def _stages(self) -> str:
        """kwok's stages this cluster runs, written into the work directory."""
        path = os.path.join(self.bin_dir, "kwok-stages.yaml")
        if not os.path.exists(path):
            run = subprocess.run(
                ["bash", BUILD_SCRIPT, "--stages"], capture_output=True, text=True, check=False
            )
            if run.returncode:
                raise ControlPlaneError(
                    "kwok's stage file could not be written:" + _tail_text(run.stderr)
                )
            path = run.stdout.strip()
        with open(path, encoding="utf-8") as f:
            stages = {d["metadata"]["name"]: d for d in yaml.safe_load_all(f) if d}
        missing = [name for name in KWOK_STAGES if name not in stages]
        if missing:
            raise ControlPlaneError(f"kwok's stage file {path} lacks {', '.join(missing)}")
        out = os.path.join(self.workdir, "kwok-stages.yaml")
        with open(out, "w", encoding="utf-8") as f:
            yaml.safe_dump_all([stages[name] for name in KWOK_STAGES], f)
        return out

    # ----- clients ---------------------------------------------------------------------------

    def _write_kubeconfig(self, path: str, user: dict, name: str = "admin") -> str:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": name,
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": self.pki["ca.crt"]},
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f)
        return path

    def token_kubeconfig(self, path: str, token: str, name: str = "serviceaccount") -> str:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        return self._write_kubeconfig(path, {"token": token}, name)
