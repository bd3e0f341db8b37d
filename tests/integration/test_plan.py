"""playbooks/plan.yml against simulated hosts and pending pods, ResourceClaims and Kueue
Workloads, on the real test cluster: the scheduler leaves the pods Pending until a node
advertises what they ask for and then runs them."""

import json
import os

import pytest
import yaml

import gpuops_mig_sim as sim
from test_roles import Fleet, output
from tests.integration.conftest import RBAC, ROLLOUT_RBAC, client_env
from tests.support.kubeapi import kueue, seed
from tests.support.simhost import nvml_on

pytestmark = pytest.mark.playbook


@pytest.fixture
def planner_env(cluster, tmp_path):
    """A ServiceAccount bound to exactly rbac/plan.yml and the rollout's rules (docs/rbac.md)."""
    rules = ROLLOUT_RBAC + [os.path.join(RBAC, "plan.yml")]
    kubeconfig = cluster.service_account_kubeconfig(tmp_path / "planner.kubeconfig", "planner",
                                                    rules)
    return client_env(kubeconfig, tmp_path, cluster.control_plane.bin_dir)


def busy_3g(state):
    """An H100 with MIG on and a busy 3g.40gb at slices 4-7 (made through pynvml, as any client would)."""
    with nvml_on(state) as nvml:
        gi = nvml.create_gpu_instance(0, 9, 4, 4)
        nvml.create_compute_instance(0, gi, 2, 0)
    sim.add_process(state, 0, pid=4242, gi=gi, ci=0)


def make_fleet(tmp_path, cluster, env):
    fleet = Fleet(tmp_path, cluster, env)
    a = fleet.add("gpu-a", "1xH100-SXM5-80GB")
    sim.create_state(a, "1xH100-SXM5-80GB", seed="gpu-a", mig="enabled", force=True)
    busy_3g(a)
    fleet.add("gpu-b", "1xA30-24GB")
    return fleet


def test_plan_from_pending_pods_writes_plan_table_and_vars(cluster, planner_env, tmp_path):
    fleet = make_fleet(tmp_path, cluster, planner_env)
    cluster.seed(
        seed.pod("train-1", limits={"nvidia.com/mig-1g.10gb": 2}, phase="Pending"),
        seed.pod("infer-1", limits={"nvidia.com/mig-1g.6gb": 1}, phase="Pending"),
        seed.pod("huge-1", limits={"nvidia.com/mig-7g.999gb": 1}, phase="Pending"),
        seed.pod("running-1", node="gpu-a", limits={"nvidia.com/mig-3g.40gb": 1}, phase="Running"),
    )
    before = {name: fleet.digest(name) for name in ("gpu-a", "gpu-b")}
    plan_file = tmp_path / "out" / "plan.json"
    vars_file = tmp_path / "out" / "plan-vars.yml"
    plan_file.parent.mkdir()
    run = fleet.run("playbooks/plan.yml", {"gpuops_mig_plan_file": str(plan_file),
                                           "gpuops_mig_plan_vars_file": str(vars_file)})
    assert run.returncode == 0, output(run)

    plan = json.loads(plan_file.read_text())
    a, b = plan["nodes"]["gpu-a"], plan["nodes"]["gpu-b"]
    assert a["layouts"] == [{"gpus": [0], "mig_enabled": True, "devices": {"1g.10gb": 2, "3g.40gb": 1}}]
    assert b["layouts"] == [{"gpus": [0], "mig_enabled": True, "devices": {"1g.6gb": 1}}]
    report = plan["report"]
    assert report["nodes_touched"] == ["gpu-a", "gpu-b"] and report["devices_destroyed"] == 0
    assert [d["pids"] for d in report["busy_devices_kept"]] == [[4242]]
    # The pod asking for a profile no GPU offers is reported, with its name.
    assert report["unresolved"][0]["request"] == "7g.999gb"
    assert report["unresolved"][0]["sources"] == ["default/huge-1"]
    assert report["demand_met"] is False and report["unmet_devices"] == 1

    # The vars file: exactly the contract site.yml reads.
    data = yaml.safe_load(vars_file.read_text())
    assert set(data) == {"gpuops_mig_plan"}
    assert set(data["gpuops_mig_plan"]) == {"version", "nodes", "report"}
    assert data["gpuops_mig_plan"]["version"] == 1
    for node in ("gpu-a", "gpu-b"):
        entry = data["gpuops_mig_plan"]["nodes"][node]
        assert set(entry) == {"layouts", "config_label", "touched"} and entry["touched"] is True
        assert entry["layouts"] == plan["nodes"][node]["layouts"]

    # A table for people, on the console and beside the JSON.
    table = (tmp_path / "out" / "plan.txt").read_text()
    assert table.splitlines()[0].split()[:4] == ["NODE", "GPU", "MODEL", "ACTION"]
    assert "7g.999gb" in table and "7g.999gb" in run.stdout
    # Planning changed no GPU.
    assert {name: fleet.digest(name) for name in ("gpu-a", "gpu-b")} == before


def test_bad_input_and_an_unreachable_node_write_nothing(cluster, planner_env, tmp_path):
    fleet = make_fleet(tmp_path, cluster, planner_env)
    vars_file = tmp_path / "plan-vars.yml"
    run = fleet.run("playbooks/plan.yml", {"gpuops_mig_plan_demand": {"1g.10gb": -1},
                                           "gpuops_mig_plan_file": str(tmp_path / "plan.json"),
                                           "gpuops_mig_plan_vars_file": str(vars_file)})
    assert run.returncode != 0
    assert "MIG plan refused, nothing planned" in run.stdout and "got -1" in run.stdout, output(run)
    assert not vars_file.exists()

    fleet.hosts["gpu-down"] = {"ansible_python_interpreter": "/nonexistent/python"}
    run = fleet.run("playbooks/plan.yml", {"gpuops_mig_plan_demand": {"1g.10gb": 1},
                                           "gpuops_mig_plan_file": str(tmp_path / "plan.json"),
                                           "gpuops_mig_plan_vars_file": str(vars_file)})
    assert run.returncode != 0
    assert "no MIG facts from gpu-down" in run.stdout, output(run)
    assert not vars_file.exists()


def test_site_applies_the_plan_and_the_pending_pods_then_fit(cluster, planner_env, tmp_path):
    fleet = make_fleet(tmp_path, cluster, planner_env)
    cluster.seed(
        seed.pod("train-1", limits={"nvidia.com/mig-1g.10gb": 2}, phase="Pending"),
        seed.pod("infer-1", limits={"nvidia.com/mig-1g.6gb": 1}, phase="Pending"),
    )
    vars_file = tmp_path / "plan-vars.yml"
    run = fleet.run("playbooks/plan.yml", {"gpuops_mig_plan_file": str(tmp_path / "plan.json"),
                                           "gpuops_mig_plan_vars_file": str(vars_file)})
    assert run.returncode == 0, output(run)
    plan = yaml.safe_load(vars_file.read_text())
    site = fleet.run("playbooks/site.yml", dict(plan, mig_node_validate_delay="1"))
    assert site.returncode == 0, output(site)
    allocatable = {n: cluster.get("Node", n)["status"]["allocatable"] for n in ("gpu-a", "gpu-b")}
    assert int(allocatable["gpu-a"].get("nvidia.com/mig-1g.10gb", 0)) >= 2, allocatable
    assert int(allocatable["gpu-b"].get("nvidia.com/mig-1g.6gb", 0)) >= 1, allocatable
    assert int(allocatable["gpu-a"].get("nvidia.com/mig-3g.40gb", 0)) == 1   # the busy device was kept
    label = plan["gpuops_mig_plan"]["nodes"]["gpu-a"]["config_label"]
    assert cluster.get("Node", "gpu-a")["metadata"]["labels"]["nvidia.com/mig.config"] == label
    # The real scheduler now places the pods that waited, where the plan made their devices.
    for pod, node in (("train-1", "gpu-a"), ("infer-1", "gpu-b")):
        cluster.wait_for(lambda p=pod: (cluster.get("Pod", p).get("status") or {}).get("phase")
                         == "Running", "pod %s Running" % pod, timeout=60)
        assert cluster.get("Pod", pod)["spec"]["nodeName"] == node
    again = fleet.run("playbooks/site.yml", plan)
    assert all(again.recap[n]["changed"] == 0 for n in ("gpu-a", "gpu-b")), output(again)

    # facts.yml given the same plan names, per node, the layout the rollout applied and the state it left.
    report = tmp_path / "report.json"
    facts = fleet.run("playbooks/facts.yml", dict(plan, gpuops_mig_report_file=str(report)))
    assert facts.returncode == 0, output(facts)
    hosts = json.loads(report.read_text())["hosts"]
    assert "gpu-a" in plan["gpuops_mig_plan"]["nodes"]
    for name, planned in plan["gpuops_mig_plan"]["nodes"].items():
        assert hosts[name]["declared"] == {"layout": planned["config_label"], "source": "plan"}, name
        labels = cluster.get("Node", name)["metadata"]["labels"]
        assert hosts[name]["kubernetes"]["mig_config"] == labels["nvidia.com/mig.config"] == planned["config_label"]
        assert hosts[name]["kubernetes"]["mig_config_state"] == labels["nvidia.com/mig.config.state"] == "success"


def test_pending_resource_claims_of_the_dra_driver_are_demand(cluster, planner_env, tmp_path):
    """NVIDIA's DRA driver: a pending ResourceClaim of the DeviceClass mig.nvidia.com, its
    profile in the CEL selector, asks for MIG devices as a pending pod does (it may have no pod
    yet, so the scheduler leaves it unallocated)."""
    fleet = Fleet(tmp_path, cluster, planner_env)
    fleet.add("gpu-a", "1xH100-SXM5-80GB")
    cluster.seed(*seed.dra_driver(), seed.resource_claim("train", count=3, profile="2g.20gb"))
    plan_file = tmp_path / "plan.json"
    run = fleet.run("playbooks/plan.yml", {
        "gpuops_mig_plan_file": str(plan_file),
        "gpuops_mig_plan_vars_file": str(tmp_path / "plan-vars.yml")})
    assert run.returncode == 0, output(run)
    plan = json.loads(plan_file.read_text())
    assert plan["nodes"]["gpu-a"]["layouts"] == [
        {"gpus": [0], "mig_enabled": True, "devices": {"2g.20gb": 3}}]


def test_kueue_workloads_waiting_for_admission_are_demand(cluster, planner_env, tmp_path):
    """Kueue holds a job back without pods until its Workload is admitted: a waiting Workload's
    pod sets are demand (count x the template's requests). An admitted one has its pods, which
    are counted once, as pods; a Workload that cannot be read is named in a warning and left
    out. The Workloads are Kueue's real CRD's, owned by suspended Jobs as Kueue makes them."""
    from test_eda_demand_sources import kueue_crd, workload

    fleet = Fleet(tmp_path, cluster, planner_env)
    fleet.add("gpu-a", "1xH100-SXM5-80GB")
    plan_file = tmp_path / "plan.json"
    files = {"gpuops_mig_plan_file": str(plan_file),
             "gpuops_mig_plan_vars_file": str(tmp_path / "plan-vars.yml")}
    cluster.seed(kueue_crd())
    workload(cluster, "train", [kueue.pod_set("main", 3, {"nvidia.com/mig-1g.10gb": 1})])
    workload(cluster, "infer", [kueue.pod_set("main", 1, {"nvidia.com/mig-2g.20gb": 1})],
             admitted=True)
    workload(cluster, "broken", [kueue.pod_set("main", 2, {"nvidia.com/mig-1g.10gb": "half"})])
    # The admitted job's pod, still pending (what Kueue's job controller has it make).
    cluster.seed(seed.pod("infer-main-0", limits={"nvidia.com/mig-2g.20gb": 1}, phase="Pending"))
    run = fleet.run("playbooks/plan.yml", files)
    assert run.returncode == 0, output(run)
    plan = json.loads(plan_file.read_text())
    assert plan["nodes"]["gpu-a"]["layouts"] == [
        {"gpus": [0], "mig_enabled": True, "devices": {"1g.10gb": 3, "2g.20gb": 1}}]
    demand = dict((row["request"], row["requested"]) for row in plan["report"]["demand"])
    assert demand == {"1g.10gb": 3, "2g.20gb": 1}, plan["report"]["demand"]
    assert "Kueue Workload default/job-broken skipped" in run.stdout, output(run)
    assert "'half'" in run.stdout, output(run)
    table = (tmp_path / "plan.txt").read_text()
    assert "Workload default/job-train (pod set main x3)" in json.dumps(plan["report"])
    assert "job-broken" in table

    # Without Kueue (no CRD) there are no Workloads: the same plan from the pod alone, no error.
    cluster.delete("CustomResourceDefinition", kueue.CRD)
    cluster.wait_for(lambda: cluster.find("CustomResourceDefinition", kueue.CRD) is None,
                     "Kueue's CRD to be deleted")
    run = fleet.run("playbooks/plan.yml", files)
    assert run.returncode == 0, output(run)
    layouts = json.loads(plan_file.read_text())["nodes"]["gpu-a"]["layouts"]
    assert layouts[0]["devices"] == {"2g.20gb": 1}
