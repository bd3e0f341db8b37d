"""The device plugin and GFD stand-ins under the plugin's per-node config (tests/support/kubeapi
sharing.py, deviceplugin.py), as NVIDIA/k8s-device-plugin v0.20.0 behaves: time-slicing replicas,
renameByDefault, failRequestsGreaterThanOne, the config label and its fallbacks, and the crash loop
of MPS over MIG devices, against simulated GPU hosts (gpuops_mig_sim), on the real test cluster:
kube-controller-manager's DaemonSet controller runs the plugin's and GFD's pods, kwok starts them,
and each change is waited for until the stand-ins have published what it leads to."""

import pytest
import yaml

import gpuops_mig_sim as sim
from tests.support.kubeapi import migmanager, seed, sharing

from test_standins_operator import running_pod, settled

GPU = {"nvidia.com/gpu.present": "true"}
NS = "nvidia"
PLUGIN = "nvidia-device-plugin"
GFD = "nvidia-device-plugin-gpu-feature-discovery"
TIMEOUT = 60  # seconds; a slow 2-core CI machine runs the controllers, kwok and the stand-ins


def config(time_slicing=None, mps=None):
    entry = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    if time_slicing:
        entry["sharing"] = {"timeSlicing": time_slicing}
    if mps:
        entry["sharing"] = {"mps": mps}
    return yaml.safe_dump(entry)


TS4 = {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 4}]}
CONFIGS = {
    "default": config(),
    "ts4": config(TS4),
    "ts4-renamed": config(dict(TS4, renameByDefault=True)),
    "ts4-strict": config(dict(TS4, failRequestsGreaterThanOne=True)),
    "mps": config(mps={"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}),
}


def layout(path, devices):
    """A simulated A100 40GB with MIG on and `devices` ({profile: count}), made by the
    collection's mig-parted engine."""
    sim.create_state(path, "1xA100-SXM4-40GB")
    parted = {"version": "v1", "mig-configs": {"layout": [
        {"devices": "all", "mig-enabled": True, "mig-devices": devices}]}}
    status, output = migmanager.apply_config(path, parted, "layout")
    assert status == 0, output
    return path


@pytest.fixture
def host(tmp_path):
    return layout(str(tmp_path / "gpu-1.json"), {"3g.20gb": 1, "1g.5gb": 2})


@pytest.fixture
def idle(cluster):
    """Lets the stand-ins finish before the cluster is reset."""
    yield lambda: settled(cluster, None)
    settled(cluster, None)


def daemons(strategy="mixed"):
    out = []
    for name in (PLUGIN, GFD):
        ds = seed.daemonset(name, namespace=NS, labels={"app.kubernetes.io/name": name},
                            env={"MIG_STRATEGY": strategy}, node_selector=GPU)
        ds["spec"]["template"]["spec"]["volumes"] = [{"name": "available-configs",
                                                      "configMap": {"name": "plugin-configs"}}]
        out.append(ds)
    return out


def plugin_configs():
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "plugin-configs", "namespace": NS}, "data": CONFIGS}


def started(cluster, name, old=None):
    """The one pod of DaemonSet `name` once kwok has started it (Running, or crash-looping as
    the plugin's stand-in marks it), a new one when `old` (a uid) is given."""
    return running_pod(cluster, NS, "app.kubernetes.io/name=" + name, old, name + " pod")


def restart(cluster):
    """Deletes the plugin's and GFD's pods (gracefully: kwok ends them) and waits until their
    DaemonSets run new ones and the stand-ins have published what these read."""
    old = {name: started(cluster, name) for name in (PLUGIN, GFD)}
    for pod in old.values():
        cluster.delete("Pod", pod["metadata"]["name"], NS)
    for name, pod in old.items():
        started(cluster, name, pod["metadata"]["uid"])
    settled(cluster, None)


def select(cluster, entry):
    cluster.patch("Node", "gpu-1", {"metadata": {"labels": {sharing.CONFIG_LABEL: entry}}})
    restart(cluster)


def advertised(cluster):
    node = cluster.get("Node", "gpu-1")
    # Without the zeros the kubelet keeps for what the plugin advertised before (deviceplugin.py).
    return ({k: v for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
             if k.startswith("nvidia.com/") and v != "0"},
            node["metadata"].get("labels") or {})


def wait_advertised(cluster, resources, labels=None):
    """(resources, labels) of gpu-1 once its resources are `resources` and its labels have the
    values of `labels` (None: absent): the stand-ins write them after a watch, not in the write."""
    labels = labels or {}

    def done():
        have, node_labels = advertised(cluster)
        return have == resources and all(node_labels.get(k) == v for k, v in labels.items())
    cluster.stand_ins.sync()
    cluster.wait_for(done, f"gpu-1 to advertise {resources} with the labels {labels}",
                     timeout=TIMEOUT)
    return advertised(cluster)


def crash_loop(cluster):
    """The waiting state of the plugin's container once the stand-in made it crash-loop."""
    def waiting():
        pod = started(cluster, PLUGIN)
        statuses = pod["status"].get("containerStatuses") or [{}]
        return (statuses[0].get("state") or {}).get("waiting")
    cluster.stand_ins.sync()
    return cluster.wait_for(waiting, "the plugin's container to crash-loop", timeout=TIMEOUT)


def test_time_slicing_follows_the_node_label(cluster, host, idle):
    cluster.seed(seed.namespace(NS), seed.node("gpu-1", GPU, nvml_state=host), plugin_configs(),
                 *daemons())
    idle()
    # No label, no DEFAULT_CONFIG: the "named" fallback picks the entry called default.
    wait_advertised(cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "2"},
                    {"nvidia.com/mig-1g.5gb.count": "2", "nvidia.com/mig-1g.5gb.replicas": None})

    select(cluster, "ts4")
    dummy, labels = wait_advertised(
        cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "8"},
        {"nvidia.com/mig-1g.5gb.replicas": "4"})
    assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert "nvidia.com/mig-3g.20gb.replicas" not in labels

    select(cluster, "ts4-renamed")
    wait_advertised(cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb.shared": "8"},
                    {"nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"})

    select(cluster, "default")
    # GFD's stale sharing labels are gone.
    wait_advertised(cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "2"},
                    {"nvidia.com/mig-1g.5gb.replicas": None,
                     "nvidia.com/mig-1g.5gb.sharing-strategy": None})


def test_a_missing_entry_stops_the_plugin(cluster, host, idle):
    cluster.seed(seed.namespace(NS), seed.node("gpu-1", GPU, nvml_state=host), plugin_configs(),
                 *daemons())
    idle()
    wait_advertised(cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "2"})
    select(cluster, "nope")
    assert crash_loop(cluster)["message"] == "specified config nope does not exist"
    wait_advertised(cluster, {})


@pytest.mark.parametrize("strategy, message", [
    ("mixed", "using --mig-strategy=mixed is not supported with MPS"),
    ("single", "sharing using MPS is not supported for MIG devices"),
])
def test_mps_over_mig_crash_loops(cluster, tmp_path, idle, strategy, message):
    host = layout(str(tmp_path / "gpu-1.json"), {"1g.5gb": 2})
    cluster.seed(seed.namespace(NS), plugin_configs(),
                 seed.node("gpu-1", dict(GPU, **{sharing.CONFIG_LABEL: "mps"}), nvml_state=host),
                 *daemons(strategy))
    idle()
    state = crash_loop(cluster)
    assert state["reason"] == "CrashLoopBackOff" and message in state["message"]
    assert advertised(cluster)[0] == {}

    def counts():
        status = cluster.get("DaemonSet", PLUGIN, NS).get("status") or {}
        return (status.get("desiredNumberScheduled"), status.get("numberReady") or 0)
    cluster.wait_for(lambda: counts() == (1, 0), "the plugin's DaemonSet: 1 desired, 0 ready",
                     timeout=TIMEOUT)


def test_fail_requests_greater_than_one(cluster, host, idle):
    cluster.seed(seed.namespace(NS), seed.node("gpu-1", GPU, nvml_state=host), plugin_configs(),
                 *daemons())
    idle()
    select(cluster, "ts4-strict")
    wait_advertised(cluster, {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "8"})
    for name, count in (("two", 2), ("one", 1)):
        pod = seed.pod(name, node="gpu-1")
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": count}}
        pod.pop("status", None)
        cluster.create(pod)

    def phase(name):
        return (cluster.get("Pod", name, "default").get("status") or {}).get("phase")
    cluster.stand_ins.sync()
    cluster.wait_for(lambda: phase("two") == "Failed", "pod two to fail at admission",
                     timeout=TIMEOUT)
    two = cluster.get("Pod", "two", "default")["status"]
    assert two["reason"] == "UnexpectedAdmissionError"
    assert "maximum request size for shared resources is 1; found 2" in two["message"]
    cluster.wait_for(lambda: phase("one") == "Running", "pod one Running", timeout=TIMEOUT)
    idle()
    assert phase("one") == "Running"


@pytest.mark.parametrize("text, error", [
    ("version: v2\n", "unknown version: v2"),
    (config({"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 1}]}),
     "number of replicas must be >= 2"),
    (config({"renameByDefault": True}), "no resources specified"),
])
def test_configs_the_plugin_refuses(text, error):
    with pytest.raises(sharing.ConfigError, match=error):
        sharing.parse(text)


def test_entry_selection_as_config_manager():
    files = {"a": "", "b": ""}
    assert sharing.select_entry(files, "b", "a", ["named"]) == "b"
    assert sharing.select_entry(files, "", "a", ["named"]) == "a"
    assert sharing.select_entry({"only": ""}, "", "", ["named", "single"]) == "only"
    assert sharing.select_entry(files, "", "", ["named", "empty"]) == ""
    with pytest.raises(sharing.ConfigError, match="all fallbacks failed"):
        sharing.select_entry(files, "", "", ["named", "single"])


def test_the_operators_device_plugin_reads_devicePlugin_config(cluster, tmp_path, idle):
    host = layout(str(tmp_path / "gpu-1.json"), {"1g.5gb": 3})
    # Without mig-manager: it would apply migManager.config.default (all-disabled) to the
    # MIG-capable node and take the layout away.
    objs = seed.gpu_operator(mig_strategy="mixed", mig_manager=False)
    policy = next(o for o in objs if o["kind"] == "ClusterPolicy")
    policy["spec"]["devicePlugin"]["config"] = {"name": "dp-configs", "default": "default"}
    objs.insert(-1, {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "dp-configs", "namespace": "gpu-operator"},
                     "data": CONFIGS})
    cluster.seed(*objs)
    cluster.seed(seed.node("gpu-1", dict(GPU, **{sharing.CONFIG_LABEL: "ts4-renamed"}),
                           nvml_state=host))
    idle()
    wait_advertised(cluster, {"nvidia.com/mig-1g.5gb.shared": "12"})
    ds = cluster.get("DaemonSet", "nvidia-device-plugin-daemonset", "gpu-operator")
    env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DEFAULT_CONFIG", "value": "default"} in env
