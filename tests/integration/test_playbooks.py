"""playbooks/site.yml, facts.yml and disable.yml against simulated hosts wired like the demo's
(examples/simulated-fleet) and the real test cluster (tests/support/controlplane), with the real
helm binary."""

import json
import re

import pytest

import gpuops_mig_sim as sim
from test_roles import CONFIG, STATE, Fleet, output
from tests.support.kubeapi import seed

pytestmark = pytest.mark.playbook


def test_canary_failure_stops_the_rollout_then_report_then_disable(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    bad = fleet.add("gpu-bad", "1xH100-SXM5-80GB", mig_node_config_name="all-3g",
                    mig_node_config_file="{{ gpuops_sim_repo }}/examples/simulated-fleet/mig-parted-config.yaml")
    fleet.add("gpu-good", "2xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 4}}])
    sim.add_fault(bad, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    good_before = fleet.digest("gpu-good")

    # Canary first; survey answers as strings.
    survey = {"gpuops_mig_canary": "true", "gpuops_mig_serial": "1", "gpuops_mig_max_fail_percentage": "0",
              "mig_node_validate_delay": "1"}
    site = fleet.run("playbooks/site.yml", survey)
    assert site.recap["gpu-bad"]["failed"] == 1, output(site)
    assert "MIG reconfiguration of gpu-bad failed at 'Apply the MIG geometry'" in site.stdout, output(site)
    # The helm release was deployed once, with the strategy of the inventory.
    plugin = cluster.get("DaemonSet", "nvidia-device-plugin", "nvidia-device-plugin")
    assert {"name": "MIG_STRATEGY", "value": "mixed"} in plugin["spec"]["template"]["spec"]["containers"][0]["env"]
    # The failed canary stays cordoned and marked; the rollout stopped before the next batch.
    node = cluster.get("Node", "gpu-bad")
    assert node["metadata"]["labels"][STATE] == "failed" and node["spec"]["unschedulable"] is True
    assert fleet.digest("gpu-good") == good_before
    node = cluster.get("Node", "gpu-good")
    assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")
    assert "Roll the MIG layout out" in site.stdout and _play_hosts(site.stdout, "Roll the MIG layout out") == {"gpu-bad"}
    # The rollout stopped, and still says where every node stands (the last play never ran).
    assert "PLAY [Summarize the rollout]" not in site.stdout
    rows = [line.strip().strip('",').split() for line in site.stdout.split("Summarize the rollout as it stops")[1].splitlines()
            if line.strip().strip('",').startswith("gpu-")]
    assert ["gpu-bad", "failed", "reconfigure"] == rows[0][:3] and ["gpu-good", "not", "done", "reconfigure"] == rows[1][:4], rows

    # The fleet report: a table and a JSON file.
    report = tmp_path / "report.json"
    facts = fleet.run("playbooks/facts.yml", {"gpuops_mig_report_file": str(report)})
    assert facts.returncode == 0, output(facts)
    assert re.search(r"changed=[1-9]", facts.stdout) is None, facts.stdout   # read-only: no change
    data = json.loads(report.read_text())["hosts"]
    assert [g["mig_mode"]["current"] for g in data["gpu-bad"]["gpus"]] == ["enabled"]
    assert [g["name"] for g in data["gpu-good"]["gpus"]] == ["NVIDIA A30"] * 2
    # Beside the GPUs, the layout the rollout applies and the state it left on the node.
    assert data["gpu-bad"]["declared"] == {"layout": "all-3g", "source": "inventory"}
    assert data["gpu-bad"]["kubernetes"] == {"node": "gpu-bad", "found": True, "mig_config": "all-3g",
                                             "mig_config_state": "failed",
                                             # the gate's condition
                                             "mig_ready": "no (MIGReconfigureFailed)"}
    assert data["gpu-good"]["declared"] == {"layout": "custom", "source": "inventory"}   # mig_node_layouts
    assert data["gpu-good"]["kubernetes"]["mig_config_state"] is None
    table = (tmp_path / "report.txt").read_text().splitlines()
    assert table[0].split() == ["HOST", "GPU", "MODEL", "MIG", "MIG", "DEVICES", "DECLARED", "FROM", "STATE"]
    assert table[1].split()[:3] == ["gpu-bad", "0", "NVIDIA"] and "enabled" in table[1]
    assert table[1].split()[-6:] == ["all-3g", "inventory", "failed,", "MIG-ready", "no",
                                     "(MIGReconfigureFailed)"]
    assert table[2].split()[:2] == ["gpu-good", "0"] and "disabled" in table[2]
    assert table[2].split()[-3:] == ["custom", "inventory", "unset"]
    assert "gpu-good         0    NVIDIA A30" in facts.stdout

    # The failed canary never got the new boot-time restore: it comes only with the geometry, inside the window.
    unit = fleet.dir / "gpu-bad" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service"
    assert not unit.exists() and not (fleet.dir / "gpu-bad" / "etc" / "gpuops-mig" / "desired.json").exists()

    # MIG off on the failed node: the same safe workflow, no boot-time restore left, the cordon
    # the failed run left is lifted.
    sim.clear_faults(bad)
    off = fleet.run("playbooks/disable.yml", {"mig_node_validate_delay": "1"}, limit="gpu-bad")
    assert off.recap["gpu-bad"]["failed"] == 0, output(off)
    assert [g["mig"] for g in sim.load_state(bad)["gpus"]] == [{"current": 0, "pending": 0}]
    assert not unit.exists() and not (fleet.dir / "gpu-bad" / "etc" / "gpuops-mig" / "desired.json").exists()
    node = cluster.get("Node", "gpu-bad")
    assert node["metadata"]["labels"][STATE] == "success" and node["metadata"]["labels"][CONFIG] == "all-disabled"
    assert not node["spec"].get("unschedulable")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"


def _report_rows(table):
    """{host: (declared, from, state)} from the first row of each host in facts.yml's .txt table
    (cells end with two spaces or more; "node label" holds one)."""
    start = table[0].index("DECLARED")
    return dict((line.split()[0], tuple(cell.strip() for cell in line[start:].split("  ") if cell.strip()))
                for line in table[1:] if line[:1].strip())


def test_facts_report_declared_layout_and_state_label(cluster, cluster_env, tmp_path):
    """facts.yml, read-only: per node, the layout the rollout would apply (plan, inventory, node label,
    none) and its nvidia.com/mig.config.state label; the nodes read once; a missing node is shown."""
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-inv", "1xA30-24GB", node_labels={CONFIG: "all-balanced", STATE: "success"},
              mig_node_config_name="all-1g.6gb")
    # The plan names this node's layout and wins over mig_node_config_name, as in the rollout.
    fleet.add("gpu-plan", "1xH100-SXM5-80GB", node_labels={STATE: "pending"}, mig_node_config_name="all-3g")
    fleet.add("gpu-label", "2xA30-24GB", node_labels={CONFIG: "all-2g.12gb"})
    # Found by mig_node_k8s_node_name, not by its inventory name.
    fleet.add("gpu-renamed", "1xA30-24GB", node_labels={STATE: "failed"}, mig_node_k8s_node_name="worker-9")
    cluster.seed(seed.node("worker-9", {CONFIG: "all-4g.24gb", STATE: "rebooting"}))
    fleet.add("gpu-ghost", "1xA30-24GB", mig_node_k8s_node_name="ghost",
              mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 4}}])
    fleet.add("gpu-off", "1xA30-24GB", kubernetes=False, mig_node_config_name="all-disabled")
    # A host whose GPUs cannot be read: still its declaration and its node's state.
    fleet.add("gpu-down", "1xA30-24GB", node_labels={CONFIG: "all-1g.6gb", STATE: "failed"},
              ansible_python_interpreter="/nonexistent/python")
    plan = {"gpuops_mig_plan": {"version": 1, "report": {}, "nodes": {"gpu-plan": {
        "layouts": [{"gpus": "all", "devices": {"1g.10gb": 7}}], "config_label": "gpuops-plan-7x1g", "touched": True}}}}
    before = {name: fleet.digest(name) for name in fleet.hosts}
    labels_before = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cluster.list("Node")}
    fleet.env["ANSIBLE_SHOW_CUSTOM_STATS"] = "1"

    report = tmp_path / "report.json"
    seen = len(cluster.requests)
    facts = fleet.run("playbooks/facts.yml", dict(plan, gpuops_mig_report_file=str(report)))
    assert facts.recap["gpu-down"]["failed"] == 1 and facts.returncode == 2, output(facts)
    node_reads = [
        r for r in cluster.requests[seen:] if r.method == "GET" and r.path == "/api/v1/nodes"
    ]
    assert len(node_reads) == 1, cluster.requests[seen:]

    data = json.loads(report.read_text())["hosts"]
    assert {h: data[h]["declared"] for h in data} == {
        "gpu-down": {"layout": "all-1g.6gb", "source": "node label"},
        "gpu-ghost": {"layout": "custom", "source": "inventory"},
        "gpu-inv": {"layout": "all-1g.6gb", "source": "inventory"},
        "gpu-label": {"layout": "all-2g.12gb", "source": "node label"},
        "gpu-off": {"layout": "all-disabled", "source": "inventory"},
        "gpu-plan": {"layout": "gpuops-plan-7x1g", "source": "plan"},
        "gpu-renamed": {"layout": "all-4g.24gb", "source": "node label"},
    }
    assert data["gpu-inv"]["kubernetes"] == {"node": "gpu-inv", "found": True, "mig_config": "all-balanced",
                                             "mig_config_state": "success"}
    assert data["gpu-renamed"]["kubernetes"]["node"] == "worker-9"
    assert data["gpu-ghost"]["kubernetes"] == {"node": "ghost", "found": False, "mig_config": None,
                                               "mig_config_state": None}
    assert data["gpu-off"]["kubernetes"] is None
    # The keys users read are still there.
    assert data["gpu-down"]["error"].startswith("no facts") and "gpus" not in data["gpu-down"]
    assert data["gpu-label"]["driver"] and [g["index"] for g in data["gpu-label"]["gpus"]] == [0, 1]
    gpu_keys = {"index", "name", "uuid", "pci_bus_id", "mig_capable", "mig_mode", "mig_devices", "gpu_instances"}
    assert set(data["gpu-inv"]["gpus"][0]) >= gpu_keys

    table = (tmp_path / "report.txt").read_text().splitlines()
    assert table[0].split()[-3:] == ["DECLARED", "FROM", "STATE"]
    assert _report_rows(table) == {
        "gpu-down": ("all-1g.6gb", "node label", "failed"),
        "gpu-ghost": ("custom", "inventory", "no node ghost"),
        "gpu-inv": ("all-1g.6gb", "inventory", "success"),
        "gpu-label": ("all-2g.12gb", "node label", "unset"),
        "gpu-off": ("all-disabled", "inventory", "-"),
        "gpu-plan": ("gpuops-plan-7x1g", "plan", "pending"),
        "gpu-renamed": ("all-4g.24gb", "node label", "rebooting"),
    }
    assert [line for line in table if line.startswith("gpu-down")][0].split()[1:3] == ["no", "facts"]
    assert all('"%s"' % line in facts.stdout for line in table), output(facts)   # and on the console
    # The AWX artifact carries the same report.
    stats = facts.stdout.split("CUSTOM STATS:", 1)[1]
    assert '"gpuops_mig_fleet"' in stats and '"mig_config_state": "rebooting"' in stats
    assert '"source": "plan"' in stats
    # Read-only.
    assert {name: fleet.digest(name) for name in fleet.hosts} == before
    assert {
        n["metadata"]["name"]: n["metadata"]["labels"] for n in cluster.list("Node")
    } == labels_before

    # Without Kubernetes: no node read, the node columns say "-", the label declares nothing.
    seen = len(cluster.requests)
    del fleet.hosts["gpu-down"]
    facts = fleet.run("playbooks/facts.yml", {"gpuops_mig_report_file": str(report), "gpuops_mig_kubernetes": False})
    assert facts.returncode == 0, output(facts)
    assert not [r for r in cluster.requests[seen:] if r.path.startswith("/api")]
    data = json.loads(report.read_text())["hosts"]
    assert all(entry["kubernetes"] is None for entry in data.values())
    assert data["gpu-label"]["declared"] == {"layout": None, "source": "none"}
    assert data["gpu-plan"]["declared"] == {"layout": "all-3g", "source": "inventory"}   # no plan given
    rows = _report_rows((tmp_path / "report.txt").read_text().splitlines())
    assert rows["gpu-label"] == ("-", "none", "-") and rows["gpu-inv"] == ("all-1g.6gb", "inventory", "-")
    assert {state for _layout, _source, state in rows.values()} == {"-"}


def test_a_layout_that_fails_on_a_later_batch_stops_the_rollout_before_any_change(
    cluster, cluster_env, tmp_path
):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-first", "1xH100-SXM5-80GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.10gb": 7}}])
    fleet.add("gpu-later", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 5}}])
    before = {name: fleet.digest(name) for name in ("gpu-first", "gpu-later")}

    site = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1"})
    assert site.returncode != 0, output(site)
    # Stopped in the preview, naming the node, the GPU and the entry.
    assert "PLAY [Roll the MIG layout out" not in site.stdout, output(site)
    assert "GPU 0 (NVIDIA A30" in site.stdout and "layouts[0]" in site.stdout, output(site)
    # Nothing changed anywhere: no GPU, no cordon, no label.
    for name in ("gpu-first", "gpu-later"):
        assert fleet.digest(name) == before[name], name
        node = cluster.get("Node", name)
        assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable"), name


def test_a_config_file_that_defines_a_name_twice_is_refused_before_any_change(
    cluster, cluster_env, tmp_path
):
    # Read on the controller, the file reaches the modules as text, parsed strictly: the second
    # 'big' does not silently replace the first.
    config = tmp_path / "mig-parted.yaml"
    config.write_text("version: v1\nmig-configs:\n"
                      "  big:\n    - {devices: all, mig-enabled: true, mig-devices: {7g.80gb: 1}}\n"
                      "  big:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}\n")
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("gpu-dup", "1xH100-SXM5-80GB", mig_node_config_file=str(config), mig_node_config_name="big")
    before = fleet.digest("gpu-dup")

    site = fleet.run("playbooks/site.yml")
    assert site.returncode != 0, output(site)
    assert "found duplicate key 'big'" in site.stdout, output(site)
    assert fleet.digest("gpu-dup") == before
    node = cluster.get("Node", "gpu-dup")
    assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")


def test_a_tolerated_failure_lets_the_batch_finish_and_one_beyond_it_stops_with_the_summary(
    cluster, cluster_env, tmp_path
):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    bad = fleet.add("gpu-bad", "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"2g.12gb": 2}}])
    for name in ("gpu-a", "gpu-b"):
        fleet.add(name, "1xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 4}}])
    sim.add_fault(bad, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES", sticky=True)
    fast = {"gpuops_mig_serial": "3", "mig_node_validate_delay": "1",
            "gpuops_mig_deploy_device_plugin": "false", "mig_node_validate": "false"}

    # One of three fails, 33 % of the batch: beyond a 20 % tolerance. The other two finish their workflow, the
    # rollout stops (the last play never runs) and the summary says where each node stands.
    site = fleet.run("playbooks/site.yml", dict(fast, gpuops_mig_max_fail_percentage="20"))
    assert site.returncode != 0 and site.recap["gpu-bad"]["failed"] == 1, output(site)
    assert "PLAY [Summarize the rollout]" not in site.stdout
    assert [r[:2] for r in _summary_rows(site.stdout, "Summarize the rollout as it stops")] == [
        ["gpu-a", "changed"], ["gpu-b", "changed"], ["gpu-bad", "failed"]], output(site)

    # gpu-a and gpu-b change again, gpu-bad fails again: 33 % is within a 50 % tolerance, so the rollout goes on
    # to its last play, which prints the summary; nothing is summarized as stopping.
    for name in ("gpu-a", "gpu-b"):
        fleet.hosts[name]["mig_node_layouts"] = [{"gpus": "all", "devices": {"1g.6gb": 2, "2g.12gb": 1}}]
    site = fleet.run("playbooks/site.yml", dict(fast, gpuops_mig_max_fail_percentage="50"))
    assert site.recap["gpu-bad"]["failed"] == 1 and site.recap["gpu-a"]["failed"] == 0, output(site)
    assert "PLAY [Summarize the rollout]" in site.stdout, output(site)
    stop = site.stdout.split("TASK [Summarize the rollout as it stops]")[1].split("TASK [")[0]
    assert "skipping" in stop and "included" not in stop, stop
    assert [r[:2] for r in _summary_rows(site.stdout, "PLAY [Summarize the rollout]")] == [
        ["gpu-a", "changed"], ["gpu-b", "changed"], ["gpu-bad", "failed"]], output(site)

    # Only gpu-bad changes now and fails: its whole batch failed, which ends the playbook whatever the
    # tolerance (Ansible's rule), so the summary comes as it stops.
    site = fleet.run("playbooks/site.yml", dict(fast, gpuops_mig_max_fail_percentage="100"))
    assert site.returncode != 0 and "PLAY [Summarize the rollout]" not in site.stdout, output(site)
    assert [r[:2] for r in _summary_rows(site.stdout, "Summarize the rollout as it stops")] == [
        ["gpu-a", "converged"], ["gpu-b", "converged"], ["gpu-bad", "failed"]], output(site)


def _summary_rows(stdout, after):
    """The summary table's rows (split into cells) printed after the text ``after``."""
    text = stdout.split(after, 1)[1].split("PLAY RECAP", 1)[0]
    return [line.strip().strip('",').split() for line in text.splitlines() if line.strip().strip('",').startswith("gpu-")]


def _play_hosts(stdout, play):
    """The hosts that ran any task in the play whose name starts with ``play``."""
    hosts = set()
    for section in stdout.split("PLAY [")[1:]:
        if section.startswith(play):
            hosts.update(line.split("[", 1)[1].split("]", 1)[0].split(" -> ")[0] for line in section.splitlines()
                         if line.startswith(("ok: [", "changed: [", "fatal: [")))
    return hosts


def test_converged_nodes_never_wait_for_a_batch_and_the_summary_tells(
    cluster, cluster_env, tmp_path
):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    layout = [{"gpus": "all", "devices": {"1g.10gb": 7}}]
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        fleet.add(name, "1xH100-SXM5-80GB", mig_node_layouts=layout)
    first = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                             "mig_node_validate": "false"}, limit="gpu-a")
    assert first.recap["gpu-a"]["failed"] == 0, output(first)
    # gpu-a converged, but its state label went missing: the converged pass puts it back (no batch).
    cluster.patch("Node", "gpu-a", {"metadata": {"labels": {STATE: None}}})

    site = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                            "mig_node_validate": "false"})
    assert all(site.recap[n]["failed"] == 0 for n in ("gpu-a", "gpu-b", "gpu-c")), output(site)
    assert ("2 node(s) to change (gpu-b, gpu-c), 1 already converged." in site.stdout
            or "2 node(s) to change (gpu-c, gpu-b), 1 already converged." in site.stdout), output(site)
    assert _play_hosts(site.stdout, "Roll the MIG layout out") == {"gpu-b", "gpu-c"}
    assert _play_hosts(site.stdout, "Finish the converged nodes") == {"gpu-a"}
    batches = sorted(line.strip().strip('"') for line in site.stdout.splitlines() if '"msg": "Batch ' in line)
    assert [b.split('"Batch ', 1)[1][:1] for b in batches] == ["1", "2"], batches
    assert all("(1 node(s) of the 2 that change)." in b for b in batches), batches
    # The summary: one row per node, created devices counted.
    rows = [line for line in site.stdout.splitlines() if line.strip().strip('",').startswith("gpu-")]
    assert any("gpu-a" in r and "converged" in r for r in rows), rows
    assert any("gpu-b" in r and "changed" in r and " 7 " in r for r in rows), rows

    again = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                             "mig_node_validate": "false"})
    assert all(again.recap[n]["changed"] == 0 and again.recap[n]["failed"] == 0
               for n in ("gpu-a", "gpu-b", "gpu-c")), output(again)
    assert _play_hosts(again.stdout, "Roll the MIG layout out") == set()
    # Nothing to put right on a converged node: its preview was all it cost.
    assert _play_hosts(again.stdout, "Finish the converged nodes") == set()
    assert "0 node(s) to change (none), 3 already converged." in again.stdout
    assert all(
        cluster.get("Node", n)["metadata"]["labels"][STATE] == "success"
        for n in ("gpu-a", "gpu-b", "gpu-c")
    )
    rows = [line for line in again.stdout.splitlines() if line.strip().strip('",').startswith("gpu-")]
    assert sum(1 for r in rows if "converged" in r) == 3, again.stdout[-3000:]


def test_a_node_that_converged_after_the_preview_is_not_drained_in_its_batch(
    cluster, cluster_env, tmp_path
):
    """The batches decide again: a node previewed as changing whose GPUs reached the layout meanwhile
    (someone applied it by hand) is finished without cordon, drain or GPU change."""
    import threading
    from tests.support.simhost import nvml_on
    from test_roles import node_history

    fleet = Fleet(tmp_path, cluster, cluster_env)
    layout = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
    first = fleet.add("gpu-1", "1xH100-SXM5-80GB", mig_node_layouts=layout)
    second = fleet.add("gpu-2", "1xH100-SXM5-80GB", mig_node_layouts=layout)
    history = node_history(cluster)
    done = threading.Event()

    def apply_by_hand(event):   # when gpu-1's batch starts (it is cordoned), gpu-2 gets the layout by hand
        if event.obj["metadata"]["name"] != "gpu-1" or not (event.obj.get("spec") or {}).get("unschedulable"):
            return
        if done.is_set():
            return
        done.set()
        with nvml_on(second) as nvml:
            nvml.set_mig_mode(0, 1)
            for start in (0, 4):
                gi = nvml.create_gpu_instance(0, 9, start, 4)
                nvml.create_compute_instance(0, gi, 2, 0)
    cluster.on("modified", apply_by_hand, kind="Node")
    before = fleet.digest("gpu-2")

    site = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                            "mig_node_validate": "false"})
    assert site.recap["gpu-1"]["failed"] == 0 and site.recap["gpu-2"]["failed"] == 0, output(site)
    assert done.is_set() and fleet.digest("gpu-2") != before
    assert "2 node(s) to change" in site.stdout, output(site)
    assert "gpu-2: layout 'custom' is already in place" in site.stdout, output(site)
    assert not any(cordoned for _state, cordoned, _dcgm in history.get("gpu-2", [])), history
    assert cluster.get("Node", "gpu-2")["metadata"]["labels"][STATE] == "success"
    assert first
