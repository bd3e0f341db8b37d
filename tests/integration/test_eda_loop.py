"""The demand loop end to end: ansible-rulebook runs the source gpuops.mig.mig_demand and the rulebook
extensions/eda/rulebooks/mig_demand.yml on the real test cluster (kube-scheduler places the pods
a round made room for) and simulated GPU hosts; each demand round is playbooks/demand_round.yml.
Source and rounds run as one ServiceAccount bound to exactly rbac/demand.yml, plan.yml and the
rollout's rules (docs/rbac.md).

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
from test_roles import STATE, Fleet, device_plugin_daemonsets, output, wait_device_plugin_running
from tests.integration.conftest import RBAC, ROLLOUT_RBAC, client_env
from tests.support.kubeapi import allocations, seed
from tests.support.podresources_server import PodResourcesServer, node_source
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


@pytest.fixture
def loop_env(cluster, tmp_path):
    """The loop's identity: a ServiceAccount bound to exactly rbac/demand.yml, plan.yml and the
    rollout's rules, as docs/dynamic.md has the event source and its rounds run."""
    rules = ROLLOUT_RBAC + [os.path.join(RBAC, f) for f in ("plan.yml", "demand.yml")]
    kubeconfig = cluster.service_account_kubeconfig(tmp_path / "loop.kubeconfig", "loop", rules)
    return client_env(kubeconfig, tmp_path, cluster.control_plane.bin_dir)


def assigned(cluster, node):
    """{(namespace, pod): {container: {resource: [device ids]}}} the stand-in kubelet holds, once
    the stand-ins caught up with every stored change."""
    cluster.stand_ins.sync()
    return allocations.assigned(cluster.stand_ins.view, node)


def with_device_plugin(cluster):
    """The device plugin and GFD, running on every GPU node and done labelling them."""
    cluster.seed(*device_plugin_daemonsets())
    wait_device_plugin_running(cluster)


def busy_3g_pair(state):
    """An H100 with MIG on and two 3g.40gb devices, each running a process."""
    sim.create_state(state, "1xH100-SXM5-80GB", seed="gpu-a", mig="enabled", force=True)
    with nvml_on(state) as nvml:
        for start in (0, 4):
            gi = nvml.create_gpu_instance(0, 9, start, 4)
            nvml.create_compute_instance(0, gi, 2, 0)
            sim.add_process(state, 0, pid=4000 + start, gi=gi, ci=0)


def make_fleet(tmp_path, cluster, loop_env):
    """gpu-a: full, both devices busy with running pods. gpu-b: MIG on, no device, no pod."""
    fleet = Fleet(tmp_path, cluster, loop_env)
    busy_3g_pair(fleet.add("gpu-a", "1xH100-SXM5-80GB"))
    sim.create_state(fleet.add("gpu-b", "1xH100-SXM5-80GB"), "1xH100-SXM5-80GB", seed="gpu-b", mig="enabled",
                     force=True)
    with_device_plugin(cluster)
    cluster.seed(seed.pod("running-1", node="gpu-a", limits={MIG_3G: 1}, phase="Running"),
                 seed.pod("running-2", node="gpu-a", limits={MIG_3G: 1}, phase="Running"))
    return fleet


def inventory_dir(fleet, tmp_path):
    """The inventory as a directory (ansible-rulebook copies a directory whole, group_vars included)."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copy(fleet.inventory(), str(inv / "inventory.yml"))
    shutil.copytree(str(fleet.dir / "group_vars"), str(inv / "group_vars"))
    return str(inv)


def evictions(cluster):
    """Names of the workload pods evicted or deleted (the device plugin's own pods are restarted on purpose)."""
    seen = []

    def record(event):
        owners = event.obj["metadata"].get("ownerReferences") or []
        if not any(ref.get("kind") == "DaemonSet" for ref in owners):
            seen.append(event.obj["metadata"]["name"])
    cluster.on("evicted", record, kind="Pod")
    cluster.on("deleted", record, kind="Pod")
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
    """End ansible-rulebook and the rounds it started. ansible-runner starts each ansible-playbook
    in a session of its own, so neither terminating the rulebook nor its process group reaches
    them: they are found by their private data directory, which lies under the test's tmp_path."""
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


def round_lease_released(cluster):
    """The round's Lease is released: kept with no holder, as client-go releases one."""
    lease = cluster.find("Lease", "gpuops-mig-demand-round")
    return lease is not None and not lease["spec"].get("holderIdentity")


def phase(cluster, name):
    return cluster.get("Pod", name)["status"]["phase"]


def test_pending_pods_run_after_one_round_evicting_nothing_a_risky_change_is_held_and_a_lost_api_repeats_nothing(
        cluster, loop_env, fault_proxy, tmp_path):
    _java()
    # The loop reaches the API server through the fault proxy, which can make it go away.
    via_proxy = fault_proxy.kubeconfig_from(loop_env["KUBECONFIG"], tmp_path / "via-proxy")
    env = dict(loop_env, KUBECONFIG=via_proxy, K8S_AUTH_KUBECONFIG=via_proxy)
    fleet = make_fleet(tmp_path, cluster, env)
    gone = evictions(cluster)
    round_dir = tmp_path / "rounds"
    loop_vars = tmp_path / "loop-vars.yml"
    loop_vars.write_text(yaml.safe_dump({
        "gpuops_mig_demand_settle_seconds": 1,
        "gpuops_mig_round_dir": str(round_dir), "gpuops_mig_round_cooldown": 0, "gpuops_mig_round_max_nodes": 2,
        # A round caught by the API outage below may die holding the round's lease: the next one
        # waits it out.
        "gpuops_mig_round_lease_duration": 20, "gpuops_mig_round_lease_wait": 120,
    }))
    log = open(str(tmp_path / "rulebook.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BIN, "ansible-rulebook"), "-i", inventory_dir(fleet, tmp_path), "--rulebook",
         "gpuops.mig.mig_demand", "--vars", str(loop_vars), "-v"],
        env=fleet.env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        # 1. Two pods wait for a profile no node has: one round changes gpu-b (it runs nothing),
        # the pods run.
        cluster.seed(seed.pod("wants-1g-1", limits={MIG_1G: 1}), seed.pod("wants-1g-2", limits={MIG_1G: 1}))
        wait_for(lambda: len(rounds(round_dir)) == 1, 300, "the first round", proc)
        first = rounds(round_dir)[0]
        assert first["applied"] == ["gpu-b"] and first["held"] == [], first
        assert first["event"]["profiles"] == {MIG_1G: 2}
        wait_for(lambda: phase(cluster, "wants-1g-1") == phase(cluster, "wants-1g-2") == "Running", 30,
                 "the pending pods to run")
        assert {cluster.get("Pod", n)["spec"]["nodeName"] for n in ("wants-1g-1", "wants-1g-2")} == {"gpu-b"}
        assert fleet.devices("gpu-a") == {0: {"3g.40gb": 2}}

        # 2. The API goes away mid-watch and comes back: the same demand makes no second round.
        fault_proxy.stop()
        time.sleep(2)
        fault_proxy.start()
        time.sleep(5)
        assert len(rounds(round_dir)) == 1

        # 3. A pod whose device only fits beside gpu-b's running pods: planned, held, not applied.
        before = fleet.devices("gpu-b")
        cluster.seed(seed.pod("wants-3g-1", limits={MIG_3G: 1}),
                     seed.pod("wants-3g-2", limits={MIG_3G: 1}))
        wait_for(lambda: len(rounds(round_dir)) == 2, 300, "the second round", proc)
        second = rounds(round_dir)[1]
        assert second["applied"] == [] and second["held"] == ["gpu-b"], second
        reasons = " ".join(second["nodes"]["gpu-b"]["reasons"])
        assert "default/wants-1g-1" in reasons and "default/wants-1g-2" in reasons
        request = yaml.safe_load((round_dir / "approval-request.yml").read_text())
        assert request["held"] == {"gpu-b": second["nodes"]["gpu-b"]["config_label"]}
        assert fleet.devices("gpu-b") == before == {0: {"1g.10gb": 2}}
        assert phase(cluster, "wants-3g-1") == phase(cluster, "wants-3g-2") == "Pending"
        assert gone == [], "pods were evicted or deleted: %s" % gone
    finally:
        stop_rulebook(proc, tmp_path)
        log.close()
    text = (tmp_path / "rulebook.log").read_text()
    assert len(rounds(round_dir)) == 2, text[-6000:]
    assert "Traceback" not in text, text[-6000:]


def test_a_dry_run_round_changes_nothing_reports_an_unknown_profile_and_a_held_lease_refuses_the_round(
        cluster, loop_env, tmp_path):
    """playbooks/demand_round.yml run by hand: the dry run plans, reports and writes the approval
    request; a round while another holds the round's Lease fails naming it, before it plans
    anything."""
    from test_rollout_lease import foreign_lease

    fleet = make_fleet(tmp_path, cluster, loop_env)
    cluster.seed(seed.pod("wants-1g", limits={MIG_1G: 1}), seed.pod("wants-huge", limits={"nvidia.com/mig-9g.900gb": 1}))
    round_dir = tmp_path / "rounds"
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir),
                                                   "gpuops_mig_round_dry_run": True})
    assert run.returncode == 0, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert last["dry_run"] is True and last["applied"] == [] and last["would_apply"] == ["gpu-b"]
    assert last["nodes"]["gpu-b"]["decision"] == "dry-run"
    assert [u["request"] for u in last["unresolved"]] == ["9g.900gb"]
    assert "gpu-b                dry-run  destroys 0, creates 1" in run.stdout
    assert fleet.devices("gpu-b") == {0: {}} and phase(cluster, "wants-1g") == "Pending"
    state = json.loads((round_dir / "state.json").read_text())
    assert "last_change" not in state and state["unfinished"] == {}
    assert (
        cluster.get("Lease", "gpuops-mig-demand-round")["spec"]["holderIdentity"] == ""
    )  # released

    held = foreign_lease("demand-round")
    cluster.seed(held)
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir)})
    assert run.returncode != 0
    assert "other-run" in run.stdout, output(run)
    assert "TASK [Plan]" not in run.stdout
    assert fleet.devices("gpu-b") == {0: {}}


def test_a_round_applies_a_node_whose_running_pods_keep_their_devices_and_they_run_on(cluster, loop_env, tmp_path):
    """gpu-b's kubelet serves its pod map (PodResources): two pods run there on 1g.10gb devices. A
    pod pending for a 3g.40gb that fits beside them makes a round that applies gpu-b, not holds it:
    the plan keeps the two held devices, says the change evicts nobody, and the rollout runs with
    mig_node_drain none. Both pods run on with the same devices; the new pod runs. gpu-a (no pod
    map, both devices busy) is not touched."""
    sock = str(tmp_path / "kubelet.sock")
    fleet = Fleet(tmp_path, cluster, loop_env)
    busy_3g_pair(fleet.add("gpu-a", "1xH100-SXM5-80GB"))
    sim.create_state(fleet.add("gpu-b", "1xH100-SXM5-80GB", pod_resources=sock, mig_node_pod_resources_socket=sock),
                     "1xH100-SXM5-80GB", seed="gpu-b", mig="enabled", force=True)
    with_device_plugin(cluster)
    cluster.seed(seed.pod("running-1", node="gpu-a", limits={MIG_3G: 1}, phase="Running"),
                 seed.pod("running-2", node="gpu-a", limits={MIG_3G: 1}, phase="Running"))
    gone = evictions(cluster)
    round_vars = {"gpuops_mig_round_dir": str(tmp_path / "rounds"), "gpuops_mig_round_cooldown": 0,
                  "gpuops_mig_round_max_nodes": 2, "mig_node_validate_delay": "1"}
    with PodResourcesServer(sock, node_source(cluster.stand_ins.view, "gpu-b")):
        # 1. Two 1g.10gb pods: gpu-b (no pod yet) gets the devices, the pods run and hold them.
        cluster.seed(seed.pod("small-1", limits={MIG_1G: 1}), seed.pod("small-2", limits={MIG_1G: 1}))
        run = fleet.run("playbooks/demand_round.yml", round_vars)
        assert run.returncode == 0, output(run)
        wait_for(lambda: phase(cluster, "small-1") == phase(cluster, "small-2") == "Running", 30, "the 1g pods")
        held = assigned(cluster, "gpu-b")
        assert sorted(held) == [("default", "small-1"), ("default", "small-2")]

        # 2. A 3g.40gb pod: it fits beside the running pods. The round applies gpu-b; nobody is
        # evicted.
        cluster.seed(seed.pod("large", limits={MIG_3G: 1}))
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
        wait_for(lambda: phase(cluster, "large") == "Running", 30, "the 3g pod")
        now = assigned(cluster, "gpu-b")
        for name in ("small-1", "small-2"):
            assert phase(cluster, name) == "Running"
            assert now[("default", name)] == held[("default", name)]
    assert gone == [], "pods were evicted or deleted: %s" % gone


def test_a_round_plans_for_pending_claims_and_waiting_workloads_as_plan_yml_does(cluster, loop_env, tmp_path):
    """The source's demand includes ResourceClaims and Kueue Workloads; the round it starts plans
    for them too (a dry run: the demand asked is the claim's 1g.10gb and the Workload's 3g.40gb,
    gpu-b would take them)."""
    from test_eda_demand_sources import device_classes, kueue_crd, workload
    from tests.support.kubeapi import kueue

    fleet = make_fleet(tmp_path, cluster, loop_env)
    cluster.seed(*device_classes(), kueue_crd(),
                 seed.resource_claim("wants-1g", namespace="default", profile="1g.10gb"))
    workload(cluster, "train", [kueue.pod_set("main", 1, {MIG_3G: 1})])
    round_dir = tmp_path / "rounds"
    run = fleet.run("playbooks/demand_round.yml", {"gpuops_mig_round_dir": str(round_dir),
                                                   "gpuops_mig_round_dry_run": True})
    assert run.returncode == 0, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert sorted((a["request"], a["requested"]) for a in last["asked"]) == [("1g.10gb", 1), ("3g.40gb", 1)], last
    assert last["would_apply"] == ["gpu-b"] and last["applied"] == []
    assert fleet.devices("gpu-b") == {0: {}}


def round_fleet(tmp_path, cluster, loop_env, *names):
    """Hosts of one H100 each, MIG on, no device, no pod; group_vars/all as the docs say for round
    variables."""
    fleet = Fleet(tmp_path, cluster, loop_env)
    for name in names:
        sim.create_state(fleet.add(name, "1xH100-SXM5-80GB"), "1xH100-SXM5-80GB", seed=name,
                         mig="enabled", force=True)
    with_device_plugin(cluster)
    return fleet


def test_every_documented_round_setting_reaches_the_round(cluster, loop_env, tmp_path):
    """Issue 33: the four settings the rulebook passes arrive as extra vars (text, as
    ansible-rulebook renders them), the others from the inventory's group_vars/all, as
    docs/dynamic.md says; the report shows what the round used. site.yml's batch size is the
    selection's serial: two nodes whose change evicts nobody change together in one batch (with
    an approved node, gpuops_mig_round_serial: test__rounds.py)."""
    fleet = round_fleet(tmp_path, cluster, loop_env, "gpu-b", "gpu-c")
    cluster.seed(seed.namespace("gpu-ops"))
    cluster.seed(seed.pod("big-1", limits={"nvidia.com/mig-7g.80gb": 1}),
                 seed.pod("big-2", limits={"nvidia.com/mig-7g.80gb": 1}))
    (fleet.dir / "group_vars" / "all" / "round.yml").write_text(yaml.safe_dump({
        "gpuops_mig_round_serial": 2, "gpuops_mig_round_lease_duration": 600,
        "gpuops_mig_round_lease_wait": 5, "gpuops_mig_round_lease_namespace": "gpu-ops",
        "gpuops_mig_round_deploy_device_plugin": False}))
    round_dir = tmp_path / "rounds"
    run = fleet.run("playbooks/demand_round.yml", {
        "gpuops_mig_round_dir": str(round_dir), "gpuops_mig_round_max_nodes": "2",
        "gpuops_mig_round_cooldown": "0", "gpuops_mig_round_dry_run": "False",
        "mig_node_validate_delay": "1"})
    assert run.returncode == 0, output(run)
    assert "Batch 1: gpu-b, gpu-c (2 node(s) of the 2 that change)" in run.stdout, output(run)
    assert "Batch 2" not in run.stdout
    last = json.loads((round_dir / "last-round.json").read_text())
    assert last["settings"] == {"max_nodes": 2, "cooldown": 0, "dry_run": False, "serial": 2,
                                "lease_duration": 600, "lease_wait": 5,
                                "lease_namespace": "gpu-ops", "deploy_device_plugin": False}, last
    assert last["applied"] == ["gpu-b", "gpu-c"] and last["failed"] == {}, last


def test_a_bad_round_setting_fails_before_the_lease_naming_the_variable(cluster, loop_env,
                                                                        tmp_path):
    """Bad input (issue 33): a negative cooldown from group_vars, a max_nodes that is no number
    from the rulebook: the round stops at once naming the variable; no lease, no plan, no files."""
    fleet = round_fleet(tmp_path, cluster, loop_env, "gpu-b")
    cluster.seed(seed.pod("wants-1g", limits={MIG_1G: 1}))
    (fleet.dir / "group_vars" / "all" / "round.yml").write_text(
        yaml.safe_dump({"gpuops_mig_round_cooldown": -60}))
    round_dir = tmp_path / "rounds"
    for extra, named in (({}, "gpuops_mig_round_cooldown must not be negative, got -60"),
                         ({"gpuops_mig_round_cooldown": "0", "gpuops_mig_round_max_nodes": "two"},
                          "gpuops_mig_round_max_nodes must be a whole number")):
        run = fleet.run("playbooks/demand_round.yml",
                        dict(extra, gpuops_mig_round_dir=str(round_dir)))
        assert run.returncode != 0
        assert named in run.stdout, output(run)
        assert "TASK [Take the round's lease" not in run.stdout and "TASK [Plan]" not in run.stdout
        assert cluster.find("Lease", "gpuops-mig-demand-round") is None and not round_dir.exists()


def test_a_round_whose_node_fails_releases_its_lease_reports_and_leaves_only_that_node_unfinished(
        cluster, loop_env, tmp_path):
    """Issue 33: gpu-c's change fails (NVML refuses the new GPU instance); gpu-b, in the same
    batch, is changed. The round still closes: its lease released, its report written with gpu-c
    failed, only gpu-c unfinished; then it fails naming gpu-c. The next round does not plan the
    demand onto gpu-c. With the default guardrails (max_nodes 1, cooldown 300 s): both changes
    evict nobody, so both nodes change in one round and no cooldown starts."""
    fleet = round_fleet(tmp_path, cluster, loop_env, "gpu-b", "gpu-c")
    cluster.seed(seed.pod("big-1", limits={"nvidia.com/mig-7g.80gb": 1}),
                 seed.pod("big-2", limits={"nvidia.com/mig-7g.80gb": 1}))
    sim.add_fault(fleet.state_path("gpu-c"), "nvmlDeviceCreateGpuInstanceWithPlacement",
                  "INSUFFICIENT_RESOURCES", sticky=True)
    round_dir = tmp_path / "rounds"
    round_vars = {"gpuops_mig_round_dir": str(round_dir), "mig_node_validate_delay": "1"}
    run = fleet.run("playbooks/demand_round.yml", round_vars)
    assert run.returncode != 0
    assert "1 node(s) failed in round" in run.stdout, output(run)
    assert "Batch 1: gpu-b, gpu-c (2 node(s) of the 2 that change)" in run.stdout, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert last["applied"] == ["gpu-b"] and sorted(last["failed"]) == ["gpu-c"], last
    assert last["settings"]["max_nodes"] == 1 and last["settings"]["cooldown"] == 300
    state = json.loads((round_dir / "state.json").read_text())
    # Both changes evict nobody: no cooldown starts (it spaces out approved changes only).
    assert sorted(state["unfinished"]) == ["gpu-c"] and "last_change" not in state
    assert round_lease_released(cluster)
    assert fleet.devices("gpu-b") == {0: {"7g.80gb": 1}}

    # The pod still waiting is not planned onto gpu-c (held), so nothing is planned: gpu-c is not
    # chosen.
    run = fleet.run("playbooks/demand_round.yml", dict(round_vars, gpuops_mig_round_dry_run=True))
    assert run.returncode == 0, output(run)
    last = json.loads((round_dir / "last-round.json").read_text())
    assert "gpu-c" not in last["planned"] and last["would_apply"] == [], last


def test_a_pod_bound_after_the_plan_to_a_device_it_destroys_defers_the_node_to_the_next_round(
        cluster, loop_env, tmp_path):
    """Issue 33, item 4: gpu-b (pod map served) has one free 1g.10gb device, at placement 0; two
    pods pending for a 3g.40gb each make the round plan gpu-b as two 3g.40gb, destroying it. When
    the rollout cordons gpu-b, a pod bound to it just before holds that 1g.10gb (the kubelet's map
    says so from then on). mig_config refuses before any change; the node is not labelled failed
    but put back as it was (uncordoned, its labels as before), the round reports it deferred
    naming the pod, and the next round plans gpu-b around that pod (one 3g.40gb at 4, beside it)
    and applies it: one pending pod runs, the late pod keeps its device."""
    sock = str(tmp_path / "kubelet.sock")
    fleet = Fleet(tmp_path, cluster, loop_env)
    state = fleet.add("gpu-b", "1xH100-SXM5-80GB", pod_resources=sock,
                      mig_node_pod_resources_socket=sock)
    sim.create_state(state, "1xH100-SXM5-80GB", seed="gpu-b", mig="enabled", force=True)
    with nvml_on(state) as nvml:
        nvml.create_compute_instance(0, nvml.create_gpu_instance(0, 19, 0, 1), 0, 0)
        first = [gi for gi in nvml.layout(0) if gi["placement"]["start"] == 0][0]
        device = first["compute_instances"][0]["mig_device_uuid"]
    with_device_plugin(cluster)
    labels_before = dict(cluster.get("Node", "gpu-b")["metadata"].get("labels") or {})
    gone = evictions(cluster)
    late = []
    kubelet = node_source(cluster.stand_ins.view, "gpu-b")

    def pod_map():    # the kubelet's answer, with the late pod on the 1g.10gb at 0 once bound
        answer = [p for p in kubelet() if p["name"] != "late"]
        if late:
            answer.append({"namespace": "default", "name": "late", "containers": [
                {"name": "main", "devices": [{"resource_name": MIG_1G, "device_ids": [device]}]}]})
        return answer

    def bind_late(event):    # the rollout cordons gpu-b: the late pod was bound just before
        if event.obj["metadata"]["name"] != "gpu-b" or late:
            return
        if not (event.obj.get("spec") or {}).get("unschedulable"):
            return
        late.append(seed.pod("late", node="gpu-b", phase="Running"))
        cluster.seed(late[0])
    unhook = cluster.on("modified", bind_late, kind="Node")
    round_dir = tmp_path / "rounds"
    round_vars = {"gpuops_mig_round_dir": str(round_dir), "gpuops_mig_round_cooldown": 0,
                  "mig_node_validate_delay": "1"}
    with PodResourcesServer(sock, pod_map):
        cluster.seed(seed.pod("wants-3g-1", limits={MIG_3G: 1}),
                     seed.pod("wants-3g-2", limits={MIG_3G: 1}))
        run = fleet.run("playbooks/demand_round.yml", round_vars)
        unhook()
        assert late, output(run)
        assert run.returncode == 0, output(run)
        last = json.loads((round_dir / "last-round.json").read_text())
        assert last["applied"] == [] and last["failed"] == {}, output(run)
        assert list(last["deferred"]) == ["gpu-b"], last
        assert last["deferred"]["gpu-b"]["pods"] == ["default/late"], last
        assert "gpu-b                deferred" in run.stdout, output(run)
        assert "1 deferred (gpu-b): planned again next round" in run.stdout, output(run)
        node = cluster.get("Node", "gpu-b")
        assert node["metadata"].get("labels") == labels_before, node["metadata"]
        assert not (node.get("spec") or {}).get("unschedulable")
        assert json.loads((round_dir / "state.json").read_text())["unfinished"] == {}
        assert round_lease_released(cluster)
        assert fleet.devices("gpu-b") == {0: {"1g.10gb": 1}}

        # The next round plans gpu-b with the late pod in its map: one 3g.40gb goes beside it.
        run = fleet.run("playbooks/demand_round.yml", round_vars)
        assert run.returncode == 0, output(run)
        last = json.loads((round_dir / "last-round.json").read_text())
        assert last["applied"] == ["gpu-b"] and last["deferred"] == {}, last
        assert fleet.devices("gpu-b") == {0: {"1g.10gb": 1, "3g.40gb": 1}}
        with nvml_on(state) as nvml:
            assert device in [ci["mig_device_uuid"] for gi in nvml.layout(0)
                              for ci in gi["compute_instances"]]
        assert cluster.get("Node", "gpu-b")["metadata"]["labels"][STATE] == "success"
        wait_for(lambda: "Running" in [phase(cluster, n) for n in ("wants-3g-1", "wants-3g-2")],
                 30, "a 3g pod")
        assert phase(cluster, "late") == "Running"
    assert gone == [], "pods were evicted or deleted: %s" % gone
