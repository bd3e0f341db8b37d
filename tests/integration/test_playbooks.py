"""playbooks/site.yml, facts.yml and disable.yml against simulated hosts wired like the demo's
(examples/simulated-fleet) and the Kubernetes API emulator, with the real helm binary."""

import json

import pytest

import gpuops_mig_sim as sim
from test_roles import CONFIG, STATE, Fleet, output

pytestmark = pytest.mark.playbook


def test_canary_failure_stops_the_rollout_then_report_then_disable(kube_api, kube_env, tmp_path):
    fleet = Fleet(tmp_path, kube_api, kube_env)
    bad = fleet.add("gpu-bad", "1xH100-SXM5-80GB", mig_node_config_name="all-3g",
                    mig_node_config_file="{{ gpuops_sim_repo }}/examples/simulated-fleet/mig-parted-config.yaml")
    good = fleet.add("gpu-good", "2xA30-24GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.6gb": 4}}])
    sim.add_fault(bad, "nvmlDeviceCreateGpuInstanceWithPlacement", "INSUFFICIENT_RESOURCES")
    good_before = fleet.digest("gpu-good")

    # Canary first; survey answers as strings.
    survey = {"gpuops_mig_canary": "true", "gpuops_mig_serial": "1", "gpuops_mig_max_fail_percentage": "0",
              "mig_node_drain_retry_delay": "1", "mig_node_validate_delay": "1"}
    site = fleet.run("playbooks/site.yml", survey)
    assert site.recap["gpu-bad"]["failed"] == 1, output(site)
    assert "MIG reconfiguration of gpu-bad failed at 'Apply the MIG geometry'" in site.stdout, output(site)
    # The helm release was deployed once, with the strategy of the inventory.
    plugin = kube_api.get("DaemonSet", "nvidia-device-plugin", "nvidia-device-plugin")
    assert {"name": "MIG_STRATEGY", "value": "mixed"} in plugin["spec"]["template"]["spec"]["containers"][0]["env"]
    # The failed canary stays cordoned and marked; the rollout stopped before the next batch.
    node = kube_api.get("Node", "gpu-bad")
    assert node["metadata"]["labels"][STATE] == "failed" and node["spec"]["unschedulable"] is True
    assert fleet.digest("gpu-good") == good_before
    node = kube_api.get("Node", "gpu-good")
    assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")
    assert "Roll the MIG layout out" in site.stdout and "gpu-good" not in site.stdout.split(
        "PLAY [Roll the MIG layout out")[1].split("PLAY RECAP")[0]

    # The fleet report: a table and a JSON file.
    report = tmp_path / "report.json"
    facts = fleet.run("playbooks/facts.yml", {"gpuops_mig_report_file": str(report)})
    assert facts.returncode == 0, output(facts)
    data = json.loads(report.read_text())["hosts"]
    assert [g["mig_mode"]["current"] for g in data["gpu-bad"]["gpus"]] == ["enabled"]
    assert [g["name"] for g in data["gpu-good"]["gpus"]] == ["NVIDIA A30"] * 2
    table = (tmp_path / "report.txt").read_text().splitlines()
    assert table[0].split() == ["HOST", "GPU", "MODEL", "MIG", "MIG", "DEVICES"]
    assert table[1].split()[:3] == ["gpu-bad", "0", "NVIDIA"] and "enabled" in table[1]
    assert table[2].split()[:2] == ["gpu-good", "0"] and "disabled" in table[2]
    assert "gpu-good         0    NVIDIA A30" in facts.stdout

    # MIG off on the failed node: the same safe workflow, the boot-time restore removed, the cordon
    # the failed run left is lifted.
    sim.clear_faults(bad)
    unit = fleet.dir / "gpu-bad" / "etc" / "systemd" / "system" / "gpuops-mig-restore.service"
    assert unit.exists()
    off = fleet.run("playbooks/disable.yml", {"mig_node_validate_delay": "1"}, limit="gpu-bad")
    assert off.recap["gpu-bad"]["failed"] == 0, output(off)
    assert [g["mig"] for g in sim.load_state(bad)["gpus"]] == [{"current": 0, "pending": 0}]
    assert not unit.exists() and not (fleet.dir / "gpu-bad" / "etc" / "gpuops-mig" / "desired.json").exists()
    node = kube_api.get("Node", "gpu-bad")
    assert node["metadata"]["labels"][STATE] == "success" and node["metadata"]["labels"][CONFIG] == "all-disabled"
    assert not node["spec"].get("unschedulable")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"


def test_a_layout_that_fails_on_a_later_batch_stops_the_rollout_before_any_change(kube_api, kube_env, tmp_path):
    fleet = Fleet(tmp_path, kube_api, kube_env)
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
        node = kube_api.get("Node", name)
        assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable"), name


def test_a_config_file_that_defines_a_name_twice_is_refused_before_any_change(kube_api, kube_env, tmp_path):
    # Read on the controller, the file reaches the modules as text, parsed strictly: the second
    # 'big' does not silently replace the first.
    config = tmp_path / "mig-parted.yaml"
    config.write_text("version: v1\nmig-configs:\n"
                      "  big:\n    - {devices: all, mig-enabled: true, mig-devices: {7g.80gb: 1}}\n"
                      "  big:\n    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}\n")
    fleet = Fleet(tmp_path, kube_api, kube_env)
    fleet.add("gpu-dup", "1xH100-SXM5-80GB", mig_node_config_file=str(config), mig_node_config_name="big")
    before = fleet.digest("gpu-dup")

    site = fleet.run("playbooks/site.yml")
    assert site.returncode != 0, output(site)
    assert "found duplicate key 'big'" in site.stdout, output(site)
    assert fleet.digest("gpu-dup") == before
    node = kube_api.get("Node", "gpu-dup")
    assert STATE not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")


def _play_hosts(stdout, play):
    """The hosts that ran any task in the play whose name starts with ``play``."""
    hosts = set()
    for section in stdout.split("PLAY [")[1:]:
        if section.startswith(play):
            hosts.update(line.split("[", 1)[1].split("]", 1)[0].split(" -> ")[0] for line in section.splitlines()
                         if line.startswith(("ok: [", "changed: [", "fatal: [")))
    return hosts


def test_converged_nodes_never_wait_for_a_batch_and_the_summary_tells(kube_api, kube_env, tmp_path):
    fleet = Fleet(tmp_path, kube_api, kube_env)
    layout = [{"gpus": "all", "devices": {"1g.10gb": 7}}]
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        fleet.add(name, "1xH100-SXM5-80GB", mig_node_layouts=layout)
    first = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                             "mig_node_validate": "false"}, limit="gpu-a")
    assert first.recap["gpu-a"]["failed"] == 0, output(first)
    # gpu-a converged, but its state label went missing: the converged pass puts it back (no batch).
    kube_api.patch("Node", "gpu-a", {"metadata": {"labels": {STATE: None}}})

    site = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                            "mig_node_validate": "false"})
    assert all(site.recap[n]["failed"] == 0 for n in ("gpu-a", "gpu-b", "gpu-c")), output(site)
    assert ("2 node(s) to change (gpu-b, gpu-c), 1 already converged." in site.stdout
            or "2 node(s) to change (gpu-c, gpu-b), 1 already converged." in site.stdout), output(site)
    assert _play_hosts(site.stdout, "Roll the MIG layout out") == {"gpu-b", "gpu-c"}
    assert _play_hosts(site.stdout, "Finish the converged nodes") == {"gpu-a"}
    batches = sorted(line.strip().strip('"') for line in site.stdout.splitlines() if '"msg": "Batch ' in line)
    assert [b.split('"Batch ', 1)[1][:1] for b in batches] == ["1", "2"], batches
    assert all("(1 of 2 node(s) to change)." in b for b in batches), batches
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
    assert all(kube_api.get("Node", n)["metadata"]["labels"][STATE] == "success" for n in ("gpu-a", "gpu-b", "gpu-c"))
    rows = [line for line in again.stdout.splitlines() if line.strip().strip('",').startswith("gpu-")]
    assert sum(1 for r in rows if "converged" in r) == 3, again.stdout[-3000:]


def test_a_node_that_converged_after_the_preview_is_not_drained_in_its_batch(kube_api, kube_env, tmp_path):
    """The batches decide again: a node previewed as changing whose GPUs reached the layout meanwhile
    (someone applied it by hand) is finished without cordon, drain or GPU change."""
    import threading
    from tests.support.simhost import nvml_on
    from test_roles import node_history

    fleet = Fleet(tmp_path, kube_api, kube_env)
    layout = [{"gpus": "all", "devices": {"3g.40gb": 2}}]
    first = fleet.add("gpu-1", "1xH100-SXM5-80GB", mig_node_layouts=layout)
    second = fleet.add("gpu-2", "1xH100-SXM5-80GB", mig_node_layouts=layout)
    history = node_history(kube_api)
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
    kube_api.on("modified", apply_by_hand, kind="Node")
    before = fleet.digest("gpu-2")

    site = fleet.run("playbooks/site.yml", {"gpuops_mig_serial": "1", "gpuops_mig_deploy_device_plugin": "false",
                                            "mig_node_validate": "false"})
    assert site.recap["gpu-1"]["failed"] == 0 and site.recap["gpu-2"]["failed"] == 0, output(site)
    assert done.is_set() and fleet.digest("gpu-2") != before
    assert "2 node(s) to change" in site.stdout, output(site)
    assert "gpu-2: layout 'custom' is already in place" in site.stdout, output(site)
    assert not any(cordoned for _state, cordoned, _dcgm in history.get("gpu-2", [])), history
    assert kube_api.get("Node", "gpu-2")["metadata"]["labels"][STATE] == "success"
    assert first
