"""The emulator's device plugin and GFD under the plugin's per-node config (tests/support/kubeapi/sharing.py),
as NVIDIA/k8s-device-plugin v0.20.0 behaves: time-slicing replicas, renameByDefault,
failRequestsGreaterThanOne, the config label and its fallbacks, and the crash loop of MPS over MIG devices."""

import pytest
import yaml

from tests.integration.test_kubeapi import CI_1C, CI_3C, GI_1G, GI_3G, GPU, simulated_host
from tests.support.kubeapi import seed
from tests.support.kubeapi import sharing

NS = "nvidia"
PLUGIN = "nvidia-device-plugin"
GFD = "nvidia-device-plugin-gpu-feature-discovery"


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


def daemons(strategy="mixed"):
    out = []
    for name in (PLUGIN, GFD):
        ds = seed.daemonset(name, namespace=NS, labels={"app.kubernetes.io/name": name},
                            env={"MIG_STRATEGY": strategy}, node_selector=GPU)
        ds["spec"]["template"]["spec"]["volumes"] = [{"name": "available-configs",
                                                      "configMap": {"name": "plugin-configs"}}]
        out.append(ds)
    return out


def restart(api):
    for name in (PLUGIN, GFD):
        pod, = api.list("Pod", NS, label_selector="app.kubernetes.io/name=" + name)
        api.delete("Pod", pod["metadata"]["name"], NS)


def select(api, entry):
    api.patch("Node", "gpu-1", {"metadata": {"labels": {sharing.CONFIG_LABEL: entry}}})
    restart(api)


def advertised(api):
    node = api.get("Node", "gpu-1")
    # Without the zeros the kubelet keeps for what the plugin advertised before (deviceplugin.py).
    return ({k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/") and v != "0"},
            node["metadata"]["labels"])


def plugin_pod(api):
    pod, = api.list("Pod", NS, label_selector="app.kubernetes.io/name=" + PLUGIN)
    return pod


@pytest.fixture
def cluster(kube_api, tmp_path):
    layout = {0: [(GI_3G, CI_3C), (GI_1G, CI_1C), (GI_1G, CI_1C)]}
    host = simulated_host(tmp_path / "gpu-1.json", "1xA100-SXM4-40GB", layout)
    kube_api.seed(seed.namespace(NS), seed.node("gpu-1", GPU, nvml_state=host),
                  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plugin-configs", "namespace": NS},
                   "data": CONFIGS}, *daemons())
    return kube_api


def test_time_slicing_follows_the_node_label(cluster):
    # No label, no DEFAULT_CONFIG: the "named" fallback picks the entry called default.
    resources, labels = advertised(cluster)
    assert resources == {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "2"}
    assert "nvidia.com/mig-1g.5gb.replicas" not in labels

    select(cluster, "ts4")
    resources, labels = advertised(cluster)
    assert resources == {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "8"}
    assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
    assert labels["nvidia.com/mig-1g.5gb.replicas"] == "4"
    assert labels["nvidia.com/mig-1g.5gb.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert "nvidia.com/mig-3g.20gb.replicas" not in labels

    select(cluster, "ts4-renamed")
    resources, labels = advertised(cluster)
    assert resources == {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb.shared": "8"}
    assert labels["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"

    select(cluster, "default")
    resources, labels = advertised(cluster)
    assert resources == {"nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-1g.5gb": "2"}
    assert "nvidia.com/mig-1g.5gb.replicas" not in labels      # GFD's stale sharing labels are gone


def test_a_missing_entry_stops_the_plugin(cluster):
    select(cluster, "nope")
    resources, dummy = advertised(cluster)
    assert resources == {}
    status = plugin_pod(cluster)["status"]
    assert status["containerStatuses"][0]["state"]["waiting"]["message"] == "specified config nope does not exist"


@pytest.mark.parametrize("strategy, message", [
    ("mixed", "using --mig-strategy=mixed is not supported with MPS"),
    ("single", "sharing using MPS is not supported for MIG devices"),
])
def test_mps_over_mig_crash_loops(kube_api, tmp_path, strategy, message):
    host = simulated_host(tmp_path / "gpu-1.json", "1xA100-SXM4-40GB", {0: [(GI_1G, CI_1C)] * 2})
    kube_api.seed(seed.namespace(NS), seed.node("gpu-1", dict(GPU, **{sharing.CONFIG_LABEL: "mps"}),
                                                nvml_state=host),
                  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plugin-configs", "namespace": NS},
                   "data": CONFIGS}, *daemons(strategy))
    resources, dummy = advertised(kube_api)
    assert resources == {}
    state = plugin_pod(kube_api)["status"]["containerStatuses"][0]["state"]["waiting"]
    assert state["reason"] == "CrashLoopBackOff" and message in state["message"]
    ds = kube_api.get("DaemonSet", PLUGIN, NS)["status"]
    assert (ds["desiredNumberScheduled"], ds["numberReady"]) == (1, 0)


def test_fail_requests_greater_than_one(cluster):
    select(cluster, "ts4-strict")
    for name, count in (("two", 2), ("one", 1)):
        pod = seed.pod(name, node="gpu-1")
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": count}}
        pod.pop("status", None)
        cluster.create(pod)
    two = cluster.get("Pod", "two", "default")["status"]
    assert (two["phase"], two["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert "maximum request size for shared resources is 1; found 2" in two["message"]
    assert cluster.get("Pod", "one", "default")["status"].get("phase") != "Failed"


@pytest.mark.parametrize("text, error", [
    ("version: v2\n", "unknown version: v2"),
    (config({"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 1}]}), "number of replicas must be >= 2"),
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


def test_the_operators_device_plugin_reads_devicePlugin_config(kube_api, tmp_path):
    host = simulated_host(tmp_path / "gpu-1.json", "1xA100-SXM4-40GB", {0: [(GI_1G, CI_1C)] * 3})
    objs = seed.gpu_operator(mig_strategy="mixed")
    policy = next(o for o in objs if o["kind"] == "ClusterPolicy")
    policy["spec"]["devicePlugin"]["config"] = {"name": "dp-configs", "default": "default"}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dp-configs", "namespace": "gpu-operator"},
                 "data": CONFIGS}
    objs.insert(-1, configmap)
    kube_api.seed(*objs)
    kube_api.seed(seed.node("gpu-1", dict(GPU, **{sharing.CONFIG_LABEL: "ts4-renamed"}), nvml_state=host))
    allocatable = kube_api.get("Node", "gpu-1")["status"]["allocatable"]
    assert allocatable["nvidia.com/mig-1g.5gb.shared"] == "12"
    ds = kube_api.get("DaemonSet", "nvidia-device-plugin-daemonset", "gpu-operator")
    env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DEFAULT_CONFIG", "value": "default"} in env
