"""playbooks/site.yml split into slices the way AWX job slicing does it: each slice is its own
ansible-playbook run (here through ansible-runner, as AWX runs jobs) with an inventory that holds
only its hosts, all slices at the same time. See docs/rollout.md, "AWX job slicing"."""

import threading

import ansible_runner
import pytest
import yaml

from test_roles import CONFIG, REPO, STATE, Fleet

pytestmark = pytest.mark.playbook

LAYOUT = [{"gpus": "all", "devices": {"1g.10gb": 7}}]


def run_slices(fleet, tmp_path, slices, extravars):
    """Run site.yml once per slice, concurrently, as AWX runs a sliced job: one workflow job (its
    ID in awx_workflow_job_id) whose slices are jobs of their own. Returns {slice number:
    ansible_runner.Runner}."""
    runners = {}

    def one(number, hosts):
        inventory = {"all": {"children": {"gpu_nodes": {"hosts": dict((h, fleet.hosts[h]) for h in hosts)}}}}
        private = tmp_path / ("slice-%d" % number)
        (private / "inventory").mkdir(parents=True)
        (private / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
        for name in ("group_vars",):   # the inventory's group_vars travel with each slice's inventory
            (private / "inventory" / name).symlink_to(fleet.dir / name)
        runners[number] = ansible_runner.run(
            private_data_dir=str(private), playbook=str(REPO + "/playbooks/site.yml"),
            extravars=dict(extravars, awx_job_id=str(100 + number), awx_workflow_job_id="100"),
            envvars=dict(fleet.env), quiet=True)

    threads = [threading.Thread(target=one, args=(n, hosts)) for n, hosts in enumerate(slices, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return runners


def test_two_slices_at_once_roll_the_fleet_and_deploy_one_device_plugin(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    names = ["gpu-%d" % i for i in range(4)]
    for name in names:
        fleet.add(name, "1xH100-SXM5-80GB", mig_node_layouts=LAYOUT)
    slices = [names[0::2], names[1::2]]     # AWX distributes the inventory's hosts evenly
    extravars = {"gpuops_mig_serial": "1", "mig_node_validate_delay": "1"}

    runners = run_slices(fleet, tmp_path, slices, extravars)
    for number, runner in runners.items():
        assert runner.status == "successful", (number, runner.stdout.read()[-4000:])
        assert runner.stats["failures"] == {}, runner.stats
    for name in names:
        labels = cluster.get("Node", name)["metadata"]["labels"]
        assert labels[STATE] == "success" and labels[CONFIG] == "custom", name
        assert cluster.get("Node", name)["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    # One device plugin release for the cluster, however many slices deployed it.
    assert len(cluster.list("DaemonSet", namespace="nvidia-device-plugin")) >= 1
    releases = [s for s in cluster.list("Secret", namespace="nvidia-device-plugin")
                if s["metadata"].get("labels", {}).get("owner") == "helm"]
    assert {s["metadata"]["labels"]["name"] for s in releases} == {"nvidia-device-plugin"}

    # The slices shared the fleet's lease (one rollout) and left it released.
    assert not cluster.get("Lease", "gpuops-mig-rollout")["spec"].get("holderIdentity")

    # Converged: both slices again, nothing changes.
    again = run_slices(fleet, tmp_path / "again", slices, extravars)
    for runner in again.values():
        assert runner.status == "successful"
        assert not runner.stats["changed"], runner.stats
