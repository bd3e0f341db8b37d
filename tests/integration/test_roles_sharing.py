"""mig_node with the device plugin's time-slicing (mig_node_sharing): the config entry and the
node label follow the layout inside the cordoned window, validation expects devices x replicas,
bad input changes nothing. On the real test cluster (its DaemonSet controller runs the plugin's
pods; the NVIDIA stand-ins advertise)."""

import os
import re
import subprocess

import gpuops_mig_sim as sim
import pytest
import yaml

from test_roles import REPO, Fleet, output
from tests.support.kubeapi import seed

pytestmark = pytest.mark.playbook

NS = "nvidia-device-plugin"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
PLAYBOOK = "tests/integration/playbooks/mig_node.yml"
FAST = {"mig_node_validate_timeout": 30, "mig_node_validate_delay": 1, "mig_node_drain_timeout": 30}


def plugin_daemonsets():
    """The chart's plugin and GFD (strategy mixed), reading their configs from the ConfigMap plugin-configs."""
    out = []
    for name in ("nvidia-device-plugin", "nvidia-device-plugin-gpu-feature-discovery"):
        ds = seed.daemonset(name, namespace=NS, labels={"app.kubernetes.io/name": name},
                            env={"MIG_STRATEGY": "mixed", "DEFAULT_CONFIG": "default"})
        ds["spec"]["template"]["spec"]["volumes"] = [{"name": "available-configs",
                                                      "configMap": {"name": "plugin-configs"}}]
        out.append(ds)
    return out


@pytest.fixture
def fleet(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    fleet.add("ts-1", "1xH100-SXM5-80GB", mig_node_layouts=[{"gpus": "all", "devices": {"1g.10gb": 4}}],
              mig_node_sharing={"1g.10gb": {"strategy": "time-slicing", "replicas": 4}},
              mig_node_device_plugin_config_map=NS + "/plugin-configs",
              mig_node_persist=False)
    cluster.seed(seed.namespace(NS), {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": "plugin-configs", "namespace": NS},
                                      "data": {"default": "version: v1\n"}}, *plugin_daemonsets())
    return fleet


def labelled_while_cordoned(cluster):
    """The node's (cordoned, config label) each time the config label changes."""
    seen = []

    def record(event):
        labels = event.obj["metadata"].get("labels") or {}
        entry = (bool((event.obj.get("spec") or {}).get("unschedulable")), labels.get(CONFIG_LABEL))
        if entry[1] and (not seen or seen[-1][1] != entry[1]):
            seen.append(entry)
    cluster.on("modified", record, kind="Node")
    return seen


def test_time_sliced_node_changes_layout_and_validates(fleet, cluster):
    seen = labelled_while_cordoned(cluster)
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["ts-1"]["failed"] == 0, output(proc)
    node = cluster.get("Node", "ts-1")
    entry = node["metadata"]["labels"][CONFIG_LABEL]
    assert entry.startswith("gpuops-mig-") and seen == [(True, entry)]     # set inside the cordoned window
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "16"
    assert node["metadata"]["labels"]["nvidia.com/mig-1g.10gb.replicas"] == "4"
    data = cluster.get("ConfigMap", "plugin-configs", NS)["data"]
    assert data["default"] == "version: v1\n"                              # other entries are kept
    assert yaml.safe_load(data[entry])["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/mig-1g.10gb", "replicas": 4}]

    # A new layout with its own sharing: renamed, twice; the label follows in the new window.
    fleet.hosts["ts-1"].update(mig_node_layouts=[{"gpus": "all", "devices": {"1g.10gb": 2, "3g.40gb": 1}}],
                               mig_node_sharing={"1g.10gb": {"replicas": 2, "rename": True}, "3g.40gb": "none"})
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["ts-1"]["failed"] == 0, output(proc)
    node = cluster.get("Node", "ts-1")
    second = node["metadata"]["labels"][CONFIG_LABEL]
    assert second != entry and seen == [(True, entry), (True, second)]
    # mig-1g.10gb, which the kubelet kept at 0, is gone from the Node's status after validation.
    for field in ("capacity", "allocatable"):
        assert {k: v for k, v in node["status"][field].items() if k.startswith("nvidia.com/mig-")} == {
            "nvidia.com/mig-1g.10gb.shared": "4", "nvidia.com/mig-3g.40gb": "1"}
    assert re.search(r"TASK \[gpuops.mig.mig_node : Remove the MIG resources the node no longer has from its status\] "
                     r"\**\nchanged:", proc.stdout), output(proc)
    assert not node["spec"].get("unschedulable")

    # The same again: converged, nothing written.
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["ts-1"]["changed"] == 0, output(proc)


@pytest.mark.parametrize("hostvars, message", [
    ({"mig_node_sharing": {"2g.20gb": {"replicas": 4}}},
     "ts-1: mig_node_sharing shares 2g.20gb, which the layout from mig_node_layouts does not create"),
    ({"mig_node_sharing": {"1g.10gb": {"strategy": "mps", "replicas": 2}}},
     "ts-1: mig_node_sharing, profile 1g.10gb: MPS cannot share MIG devices"),
    ({"mig_node_sharing": {"1g.10gb": {"replicas": 0}}}, "replicas must be a whole number of 2 or more"),
    ({"mig_node_sharing": {}, "mig_node_device_plugin_config_name": "ts8"},
     "ts-1: entry 'ts8' of the device plugin's ConfigMap nvidia-device-plugin/plugin-configs does not exist"),
])
def test_bad_sharing_changes_nothing(fleet, cluster, hostvars, message):
    before = fleet.digest("ts-1")
    fleet.hosts["ts-1"].update(hostvars)
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["ts-1"]["failed"] == 1 and message in " ".join(proc.stdout.split()), output(proc)
    assert fleet.digest("ts-1") == before
    node = cluster.get("Node", "ts-1")
    assert CONFIG_LABEL not in node["metadata"]["labels"] and not node["spec"].get("unschedulable")
    assert cluster.get("ConfigMap", "plugin-configs", NS)["data"] == {"default": "version: v1\n"}


def cdi_names(path):
    return sorted(d["name"] for d in yaml.safe_load(open(path))["devices"])


def test_the_cdi_spec_lists_the_new_mig_devices(cluster, cluster_env, tmp_path):
    fleet = Fleet(tmp_path, cluster, cluster_env)
    state = fleet.add("cdi-1", "1xA100-SXM4-40GB", mig_node_layouts=[{"gpus": "all", "devices": {"3g.20gb": 2}}],
                      mig_node_persist=False, mig_node_validate=False, mig_node_device_plugin_restart=False)
    # Under the host's root (mig_node_persist_root), the second of the default paths: the first
    # is absent.
    spec = fleet.dir / "cdi-1" / "var" / "run" / "cdi" / "nvidia.yaml"
    spec.parent.mkdir(parents=True)
    env = dict(fleet.env, GPUOPS_MIG_SIMULATE=state)
    subprocess.run([os.path.join(REPO, "simulator", "bin", "nvidia-ctk"), "cdi", "generate", "--output=%s" % spec],
                   env=env, check=True)
    assert cdi_names(spec) == sorted(["0", sim.load_state(state)["gpus"][0]["uuid"], "all"])   # no MIG device yet
    assert not (fleet.dir / "cdi-1" / "etc" / "cdi" / "nvidia.yaml").exists()

    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["cdi-1"]["failed"] == 0, output(proc)
    names = cdi_names(spec)
    assert [n for n in names if ":" in n] == ["0:0", "0:1"]                  # exactly the two new MIG devices
    assert len([n for n in names if n.startswith("MIG-")]) == 2
    assert sorted(p.name for p in spec.parent.iterdir()) == ["nvidia.yaml"]  # nothing left beside the spec
    assert "Regenerate the host's CDI spec for the new MIG devices" in proc.stdout
    assert_device_nodes_current(fleet.dir / "cdi-1", state, spec)

    # Another layout: the nodes of the instances that went are removed, the new ones created.
    fleet.hosts["cdi-1"]["mig_node_layouts"] = [{"gpus": "all", "devices": {"7g.40gb": 1}}]
    proc = fleet.run(PLAYBOOK, FAST)
    assert proc.recap["cdi-1"]["failed"] == 0, output(proc)
    assert [n for n in cdi_names(spec) if ":" in n] == ["0:0"]
    assert assert_device_nodes_current(fleet.dir / "cdi-1", state, spec) == 1
    assert re.search(r"TASK \[gpuops.mig.mig_node : Make /dev/nvidia-caps current for the new MIG devices\] \**\n"
                     r"changed:", proc.stdout), output(proc)


def assert_device_nodes_current(root, state, spec):
    """<root>/dev/nvidia-caps holds exactly the capability nodes of the GPU's instances (and mig/config, monitor),
    and every one the CDI spec names; returns the number of GPU instances."""
    if os.geteuid() != 0:       # no driver /proc without root (test_roles.Fleet): nothing to check
        return len(sim.load_state(state)["gpus"][0]["gpu_instances"])
    gis = sim.load_state(state)["gpus"][0]["gpu_instances"]
    minors = [1, 2] + [m for gi in gis for m in (3 + 9 * gi["id"], 3 + 9 * gi["id"] + 1 + gi["compute_instances"][0]["id"])]
    directory = root / "dev" / "nvidia-caps"
    found = dict((p.name, os.minor(p.lstat().st_rdev)) for p in directory.iterdir())
    assert found == dict(("nvidia-cap%d" % m, m) for m in minors)
    named = [n["path"] for d in yaml.safe_load(spec.read_text())["devices"]
             for n in d["containerEdits"]["deviceNodes"] if "nvidia-caps" in n["path"]]
    assert named and all(os.path.basename(path) in found for path in named)
    return len(gis)
