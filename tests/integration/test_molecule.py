"""The molecule scenarios of the fleet test bed (extensions/molecule, docs/testbed.md), one test each.

The fleet (SSH hosts in network namespaces, the Kubernetes API) is one per machine
and shared by every scenario: the module fixture clears what an earlier run left
(from any checkout), brings it up once with `molecule create -s default`, and
removes it with `molecule destroy -s default` after the last scenario. Molecule's
state (MOLECULE_EPHEMERAL_DIRECTORY) is this run's own. Each test runs
`molecule prepare -s <scenario> --force` (the scenario resets the hosts and the
cluster it uses; with shared state molecule would otherwise skip every prepare
after the first) and then `molecule test -s <scenario> --destroy never` (its
create and prepare are done, so molecule skips them).

They run by default, as root with `ip netns` (CI runs as root); `GPUOPS_TESTBED=0`
skips them, and without root they skip and say why (with `GPUOPS_TESTBED=1` they
fail instead). scripts/test.sh runs them in the main `pytest -n 2 --dist loadgroup`
run: the root conftest.py keeps this file's tests on one worker, in turn, while the
other worker runs the rest, and the lock keeps two runs apart anyway.
The first run on a fresh machine also installs openssh-server and netcat-openbsd
(apt) and builds the hosts' Python environment (pip).
"""

import fcntl
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)
SCENARIOS_DIR = os.path.join(REPO, "extensions", "molecule")
BED_PY = os.path.join(REPO, "tests", "testbed", "bed.py")
LOCK = "/tmp/gpuops-testbed.lock"
TIMEOUT_S = 900
SETUP_TIMEOUT_S = 600

pytestmark = [pytest.mark.playbook, pytest.mark.xdist_group("gpuops-testbed")]


# Scenarios whose workflow a local-connection test also runs end to end (named here), marked
# `bed_full`: scripts/test.sh (CI) leaves them out to keep the suite inside its time, and a run of
# this file without `-m` (docs/testbed.md) runs them all. What only SSH shows stays in CI:
# the rollout, the reboots, the failure drills, AWX's runner, bootstrap and bad input.
ALSO_LOCAL = {
    "live": "test_live_reconfigure.py",
    "operator": "test_gpu_operator.py",
    "operator_default": "test_gpu_operator.py",
    "plan": "test_plan.py",
    "sharing": "test_roles_sharing.py",
}


def scenarios():
    """Every scenario, `default` (the bed itself, checked before any rollout) first."""
    names = sorted(entry for entry in os.listdir(SCENARIOS_DIR)
                   if os.path.isfile(os.path.join(SCENARIOS_DIR, entry, "molecule.yml")))
    return [pytest.param(name, marks=[pytest.mark.bed_full] if name in ALSO_LOCAL else [])
            for name in sorted(names, key=lambda name: name != "default")]


def why_not_runnable():
    if os.geteuid() != 0:
        return "the fleet test bed needs root (network and mount namespaces)"
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode != 0:
        return "the fleet test bed needs `ip netns` (iproute2)"
    if not os.path.exists(os.path.join(BIN, "molecule")):
        return "molecule is not installed next to %s" % sys.executable
    return None


def molecule_env(tmp_dir):
    # The verify step runs its own pytest: keep the outer run's (xdist) settings away from it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        PATH=BIN + os.pathsep + env.get("PATH", ""),
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
        ANSIBLE_LOCAL_TEMP=os.path.join(str(tmp_dir), "ansible-tmp"),
        NO_COLOR="1",
        ANSIBLE_NOCOLOR="1",
        PY_COLORS="0",
    )
    return env


def molecule(args, log_path, env, timeout):
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ molecule %s\n" % " ".join(args))
        log.flush()
        proc = subprocess.run([os.path.join(BIN, "molecule")] + args + ["--no-command-borders"], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    return proc.returncode


def recap_of(output):
    return "\n".join(line for line in output.splitlines() if re.match(r"\s*\S+\s+: actions=", line))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The shared fleet: up once for every scenario of this module, down after the last one."""
    switch = os.environ.get("GPUOPS_TESTBED", "")
    if switch == "0":
        pytest.skip("the SSH fleet test bed is switched off (GPUOPS_TESTBED=0)")
    reason = why_not_runnable()
    if reason:
        if switch == "1":
            pytest.fail("GPUOPS_TESTBED=1, but " + reason)
        pytest.skip(reason + " (GPUOPS_TESTBED=0 silences this)")
    tmp_dir = tmp_path_factory.mktemp("testbed")
    env = molecule_env(tmp_dir)
    env["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_dir / "molecule")
    log_path = tmp_dir / "molecule-fleet.log"
    with open(LOCK, "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fleet per machine, whichever checkout runs it
        try:
            # What an earlier run left (from this checkout or another: the bed and the namespaces
            # are per machine), then a fresh fleet.
            subprocess.run([sys.executable, BED_PY, "down"], cwd=REPO, check=True, timeout=SETUP_TIMEOUT_S,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if molecule(["create", "-s", "default"], log_path, env, SETUP_TIMEOUT_S) != 0:
                pytest.fail("bringing the fleet up failed (log %s):\n%s" % (
                    log_path, log_path.read_text(errors="replace")[-6000:]))
            yield env
        finally:
            molecule(["destroy", "-s", "default"], log_path, env, SETUP_TIMEOUT_S)
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.mark.parametrize("scenario", scenarios())
def test_scenario(scenario, fleet, tmp_path):
    log_path = tmp_path / ("molecule-%s.log" % scenario)
    rc = molecule(["prepare", "-s", scenario, "--force"], log_path, fleet, TIMEOUT_S)
    if rc == 0:
        rc = molecule(["test", "-s", scenario, "--destroy", "never"], log_path, fleet, TIMEOUT_S)
    output = log_path.read_text(errors="replace")
    recap = recap_of(output)
    assert rc == 0, "molecule prepare/test -s %s failed (log %s):\n%s\n...\n%s" % (
        scenario, log_path, recap, output[-6000:])
    assert re.search(r"^\s*%s\s+: actions=\d+ .*failed=0" % re.escape(scenario), recap, re.M), recap
