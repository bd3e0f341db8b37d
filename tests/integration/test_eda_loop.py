"""The demand loop end to end: ansible-rulebook runs the source gpuops.mig.mig_demand and the rulebook
extensions/eda/rulebooks/mig_demand.yml against the Kubernetes API emulator (with its scheduler) and
simulated GPU hosts; each demand round is playbooks/demand_round.yml.

ansible-rulebook needs Java 17: as root the test installs Debian's openjdk-17-jre-headless when `java` is
missing (as tests/testbed/bed.py installs its packages); otherwise it skips and says why, unless
GPUOPS_EDA=1, which makes a missing Java a failure.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import yaml

import gpuops_mig_sim as sim
from test_roles import Fleet, device_plugin_daemonsets, output
from tests.support.kubeapi import seed
from tests.support.simhost import nvml_on

pytestmark = pytest.mark.playbook

BIN = os.path.dirname(os.path.abspath(__import__("sys").executable))
MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
JAVA_PACKAGE = "openjdk-17-jre-headless"


def _java():
    """A java on PATH, installing the Debian package as root when it is missing; else skip (or fail)."""
    if shutil.which("java"):
        return
    strict = os.environ.get("GPUOPS_EDA") == "1"
    why = None
    if os.geteuid() != 0:
        why = "ansible-rulebook needs Java 17 and `java` is missing; install %s (as root) to run this test" \
              % JAVA_PACKAGE
    elif not shutil.which("apt-get"):
        why = "ansible-rulebook needs Java 17, `java` is missing and there is no apt-get to install %s" % JAVA_PACKAGE
    else:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", JAVA_PACKAGE]):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode:
                why = "installing %s failed: %s" % (JAVA_PACKAGE, (done.stderr or done.stdout)[-800:])
                break
        if not why and not shutil.which("java"):
            why = "%s is installed but `java` is not on PATH" % JAVA_PACKAGE
    if why:
        if strict:
            pytest.fail(why + " (GPUOPS_EDA=1)")
        pytest.skip(why)


def busy_3g_pair(state):
    """An H100 with MIG on and two 3g.40gb devices, each running a process."""
    sim.create_state(state, "1xH100-SXM5-80GB", seed="gpu-a", mig="enabled", force=True)
    with nvml_on(state) as nvml:
        for start in (0, 4):
            gi = nvml.create_gpu_instance(0, 9, start, 4)
            nvml.create_compute_instance(0, gi, 2, 0)
            sim.add_process(state, 0, pid=4000 + start, gi=gi, ci=0)


def make_fleet(tmp_path, kube_api, kube_env):
    """gpu-a: full, both devices busy with running pods. gpu-b: MIG on, no device, no pod."""
    fleet = Fleet(tmp_path, kube_api, kube_env)
    busy_3g_pair(fleet.add("gpu-a", "1xH100-SXM5-80GB"))
    sim.create_state(fleet.add("gpu-b", "1xH100-SXM5-80GB"), "1xH100-SXM5-80GB", seed="gpu-b", mig="enabled",
                     force=True)
    kube_api.seed(*device_plugin_daemonsets())
    kube_api.seed(seed.pod("running-1", node="gpu-a", limits={MIG_3G: 1}, phase="Running"),
                  seed.pod("running-2", node="gpu-a", limits={MIG_3G: 1}, phase="Running"))
    return fleet


def inventory_dir(fleet, tmp_path):
    """The inventory as a directory (ansible-rulebook copies a directory whole, group_vars included)."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copy(fleet.inventory(), str(inv / "inventory.yml"))
    shutil.copytree(str(fleet.dir / "group_vars"), str(inv / "group_vars"))
    return str(inv)


def evictions(kube_api):
    """Names of the workload pods evicted or deleted (the device plugin's own pods are restarted on purpose)."""
    seen = []

    def record(event):
        owners = event.obj["metadata"].get("ownerReferences") or []
        if not any(ref.get("kind") == "DaemonSet" for ref in owners):
            seen.append(event.obj["metadata"]["name"])
    kube_api.on("evicted", record, kind="Pod")
    kube_api.on("deleted", record, kind="Pod")
    return seen


def wait_for(predicate, timeout, what, proc=None):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.25)
    raise AssertionError("timed out waiting for %s" % what)


def stop_rulebook(proc, tmp_path):
    """End ansible-rulebook and the rounds it started. ansible-runner starts each ansible-playbook in a session
    of its own, so neither terminating the rulebook nor its process group reaches them: they are found by
    their private data directory, which lies under the test's tmp_path."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    marker = str(tmp_path).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                if marker not in f.read():
                    continue
            os.kill(int(entry), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def rounds(round_dir):
    folder = round_dir / "rounds"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []


def phase(kube_api, name):
    return kube_api.get("Pod", name)["status"]["phase"]


def test_pending_pods_run_after_one_round_evicting_nothing_a_risky_change_is_held_and_a_lost_api_repeats_nothing(
        kube_api, kube_env, tmp_path):
    _java()
    fleet = make_fleet(tmp_path, kube_api, kube_env)
    gone = evictions(kube_api)
    round_dir = tmp_path / "rounds"
    loop_vars = tmp_path / "loop-vars.yml"
    loop_vars.write_text(yaml.safe_dump({
        "gpuops_mig_demand_settle_seconds": 1,
        "gpuops_mig_round_dir": str(round_dir), "gpuops_mig_round_cooldown": 0, "gpuops_mig_round_max_nodes": 2,
        # A round caught by the API outage below may die holding the round's lease: the next one waits it out.
        "gpuops_mig_round_lease_duration": 20, "gpuops_mig_round_lease_wait": 120,
    }))
    log = open(str(tmp_path / "rulebook.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BIN, "ansible-rulebook"), "-i", inventory_dir(fleet, tmp_path), "--rulebook",
         "gpuops.mig.mig_demand", "--vars", str(loop_vars), "-v"],
        env=fleet.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    port = kube_api.port
    try:
        # 1. Two pods wait for a profile no node has: one round changes gpu-b (it runs nothing), the pods run.
        kube_api.seed(seed.pod("wants-1g-1", limits={MIG_1G: 1}), seed.pod("wants-1g-2", limits={MIG_1G: 1}))
        wait_for(lambda: len(rounds(round_dir)) == 1, 300, "the first round", proc)
        first = rounds(round_dir)[0]
        assert first["applied"] == ["gpu-b"] and first["held"] == [], first
        assert first["event"]["profiles"] == {MIG_1G: 2}
        wait_for(lambda: phase(kube_api, "wants-1g-1") == phase(kube_api, "wants-1g-2") == "Running", 30,
                 "the pending pods to run")
        assert {kube_api.get("Pod", n)["spec"]["nodeName"] for n in ("wants-1g-1", "wants-1g-2")} == {"gpu-b"}
        assert fleet.devices("gpu-a") == {0: {"3g.40gb": 2}}

        # 2. The API goes away mid-watch and comes back: the same demand makes no second round.
        kube_api.stop()
        time.sleep(2)
        kube_api.start(port=port)
        time.sleep(5)
        assert len(rounds(round_dir)) == 1

        # 3. A pod whose device only fits beside gpu-b's running pods: planned, held, not applied.
        before = fleet.devices("gpu-b")
        kube_api.seed(seed.pod("wants-3g", limits={MIG_3G: 1}))
        wait_for(lambda: len(rounds(round_dir)) == 2, 300, "the second round", proc)
        second = rounds(round_dir)[1]
        assert second["applied"] == [] and second["held"] == ["gpu-b"], second
        reasons = " ".join(second["nodes"]["gpu-b"]["reasons"])
        assert "default/wants-1g-1" in reasons and "default/wants-1g-2" in reasons
        request = yaml.safe_load((round_dir / "approval-request.yml").read_text())
        assert request["held"] == {"gpu-b": second["nodes"]["gpu-b"]["config_label"]}
        assert fleet.devices("gpu-b") == before == {0: {"1g.10gb": 2}}
        assert phase(kube_api, "wants-3g") == "Pending"
        assert gone == [], "pods were evicted or deleted: %s" % gone
    finally:
        stop_rulebook(proc, tmp_path)
        log.close()
    text = (tmp_path / "rulebook.log").read_text()
    assert len(rounds(round_dir)) == 2, text[-6000:]
    assert "Traceback" not in text, text[-6000:]


def test_a_dry_run_round_changes_nothing_reports_an_unknown_profile_and_a_held_lease_refuses_the_round(
        kube_api, kube_env, tmp_path):
    """playbooks/demand_round.yml run by hand: the dry run plans, reports and writes the approval request; a
    round while another holds the round's Lease fails naming it, before it plans anything."""
    from test_rollout_lease import foreign_lease

    fleet = make_fleet(tmp_path, kube_api, kube_env)
    kube_api.seed(seed.pod("wants-1g", limits={MIG_1G: 1}), seed.pod("wants-huge", limits={"nvidia.com/mig-9g.900gb": 1}))
    round_dir = tmp_path / "rounds"
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir),
                                                   "gpuops_mig_round_dry_run": True})
    assert run.returncode == 0, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert last["dry_run"] is True and last["applied"] == [] and last["would_apply"] == ["gpu-b"]
    assert last["nodes"]["gpu-b"]["decision"] == "dry-run"
    assert [u["request"] for u in last["unresolved"]] == ["9g.900gb"]
    assert "gpu-b                dry-run  destroys 0, creates 1" in run.stdout
    assert fleet.devices("gpu-b") == {0: {}} and phase(kube_api, "wants-1g") == "Pending"
    state = json.loads((round_dir / "state.json").read_text())
    assert "last_change" not in state and state["unfinished"] == {}
    assert (
        kube_api.get("Lease", "gpuops-mig-demand-round")["spec"]["holderIdentity"] == ""
    )  # released

    held = foreign_lease("demand-round")
    kube_api.seed(held)
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir)})
    assert run.returncode != 0
    assert "other-run" in run.stdout, output(run)
    assert "TASK [Plan]" not in run.stdout
    assert fleet.devices("gpu-b") == {0: {}}


def test_a_round_applies_a_node_whose_running_pods_keep_their_devices_and_they_run_on(kube_api, kube_env, tmp_path):
    """gpu-b's kubelet serves its pod map (PodResources): two pods run there on 1g.10gb devices. A pod pending
    for a 3g.40gb that fits beside them makes a round that applies gpu-b, not holds it: the plan keeps the two
    held devices, says the change evicts nobody, and the rollout runs with mig_node_drain none. Both pods run
    on with the same devices; the new pod runs. gpu-a (no pod map, both devices busy) is not touched."""
    from tests.support.kubeapi import allocations
    from tests.support.podresources_server import PodResourcesServer, node_source

    sock = str(tmp_path / "kubelet.sock")
    fleet = Fleet(tmp_path, kube_api, kube_env)
    busy_3g_pair(fleet.add("gpu-a", "1xH100-SXM5-80GB"))
    sim.create_state(fleet.add("gpu-b", "1xH100-SXM5-80GB", pod_resources=sock, mig_node_pod_resources_socket=sock),
                     "1xH100-SXM5-80GB", seed="gpu-b", mig="enabled", force=True)
    kube_api.seed(*device_plugin_daemonsets())
    kube_api.seed(seed.pod("running-1", node="gpu-a", limits={MIG_3G: 1}, phase="Running"),
                  seed.pod("running-2", node="gpu-a", limits={MIG_3G: 1}, phase="Running"))
    gone = evictions(kube_api)
    round_vars = {"gpuops_mig_round_dir": str(tmp_path / "rounds"), "gpuops_mig_round_cooldown": 0,
                  "gpuops_mig_round_max_nodes": 2, "mig_node_validate_delay": "1", "mig_node_drain_retry_delay": "1"}
    with PodResourcesServer(sock, node_source(kube_api, "gpu-b")):
        # 1. Two 1g.10gb pods: gpu-b (no pod yet) gets the devices, the pods run and hold them.
        kube_api.seed(seed.pod("small-1", limits={MIG_1G: 1}), seed.pod("small-2", limits={MIG_1G: 1}))
        run = fleet.run("playbooks/demand_round.yml", round_vars)
        assert run.returncode == 0, output(run)
        wait_for(lambda: phase(kube_api, "small-1") == phase(kube_api, "small-2") == "Running", 30, "the 1g pods")
        allocations.sync(kube_api)
        held = allocations.assigned(kube_api, "gpu-b")
        assert sorted(held) == [("default", "small-1"), ("default", "small-2")]

        # 2. A 3g.40gb pod: it fits beside the running pods. The round applies gpu-b; nobody is evicted.
        kube_api.seed(seed.pod("large", limits={MIG_3G: 1}))
        run = fleet.run("playbooks/demand_round.yml", round_vars)
        assert run.returncode == 0, output(run)
        last = json.loads((tmp_path / "rounds" / "last-round.json").read_text())
        assert last["applied"] == ["gpu-b"] and last["held"] == [], last
        decision = last["nodes"]["gpu-b"]
        assert decision["evicts"] == [] and decision["drain"] == "none" and decision["reasons"] == []
        plan = json.loads((tmp_path / "rounds" / "plan.json").read_text())
        assert plan["nodes"]["gpu-b"]["evicted_pods"] == []
        assert plan["nodes"]["gpu-a"]["pod_map_unknown"].startswith("the kubelet's PodResources socket")
        assert fleet.devices("gpu-b") == {0: {"1g.10gb": 2, "3g.40gb": 1}}
        assert fleet.devices("gpu-a") == {0: {"3g.40gb": 2}}
        wait_for(lambda: phase(kube_api, "large") == "Running", 30, "the 3g pod")
        allocations.sync(kube_api)
        now = allocations.assigned(kube_api, "gpu-b")
        for name in ("small-1", "small-2"):
            assert phase(kube_api, name) == "Running"
            assert now[("default", name)] == held[("default", name)]
    assert gone == [], "pods were evicted or deleted: %s" % gone


def test_a_round_plans_for_pending_claims_and_waiting_workloads_as_plan_yml_does(kube_api, kube_env, tmp_path):
    """The source's demand includes ResourceClaims and Kueue Workloads; the round it starts plans for them too
    (a dry run: the demand asked is the claim's 1g.10gb and the Workload's 3g.40gb, gpu-b would take them)."""
    from tests.support.kubeapi import kueue

    fleet = make_fleet(tmp_path, kube_api, kube_env)
    kube_api.seed(seed.resource_claim("wants-1g", namespace="ml", profile="1g.10gb"), kueue.crd(),
                  kueue.workload("train", [kueue.pod_set("main", 1, {MIG_3G: 1})], namespace="ml"))
    round_dir = tmp_path / "rounds"
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir),
                                                   "gpuops_mig_round_dry_run": True})
    assert run.returncode == 0, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert sorted((a["request"], a["requested"]) for a in last["asked"]) == [("1g.10gb", 1), ("3g.40gb", 1)], last
    assert last["would_apply"] == ["gpu-b"] and last["applied"] == []
    assert fleet.devices("gpu-b") == {0: {}}
