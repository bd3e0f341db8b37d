"""gpuops.mig.mig_cluster_info on the real test cluster, as the rollout's ServiceAccount
(rbac/rollout.yml and fleet-report.yml), through kubernetes.core's client: one read of what the
rollout decides on, trimmed to what it needs, in the controller's process where the module would
run there, else by the module."""

import sys

import pytest
import yaml

from tests.support.controlplane.cluster import daemonsets_rolled_out
from tests.support.playbook import run_tasks
from tests.support.kubeapi import seed

pytestmark = pytest.mark.playbook

GPU = {"nvidia.com/gpu.present": "true"}


def configmap(name, namespace, data):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def test_without_the_gpu_operator(cluster, cluster_env, tmp_path):
    # The real server keeps managedFields on every Node: the read leaves them out.
    cluster.seed(seed.node("gpu-1", GPU), seed.node("cpu-1"), seed.daemonset("logs"), seed.namespace("mig-configs"),
                 configmap("fleet-mig", "mig-configs", {"config.yaml": "version: v1\n"}))
    results = run_tasks([
        {"name": "plain", "gpuops.mig.mig_cluster_info": {"configmaps": [{"name": "fleet-mig", "namespace": "mig-configs"}]}},
        {"name": "status", "gpuops.mig.mig_cluster_info": {"operator": False, "node_status": True}},
        {"name": "nothing", "gpuops.mig.mig_cluster_info": {"operator": False, "nodes": False}},
    ], cluster_env, tmp_path)
    plain = results["plain"]
    assert plain["changed"] is False
    # No ClusterPolicy CRD: an empty list, not an error. The logs DaemonSet is not NVIDIA's DRA plugin.
    assert plain["cluster_policies"] == [] and plain["daemonsets"] == []
    assert plain["operator_namespace"] == "gpu-operator"
    assert sorted(n["metadata"]["name"] for n in plain["nodes"]) == ["cpu-1", "gpu-1"]
    [node] = [n for n in plain["nodes"] if n["metadata"]["name"] == "gpu-1"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true" and "status" not in node and "managedFields" not in node["metadata"]
    assert list(plain["configmaps"]) == ["mig-configs"]
    assert [c["metadata"]["name"] for c in plain["configmaps"]["mig-configs"]] == ["fleet-mig"]
    assert all("status" in n for n in results["status"]["nodes"])
    # What was not read is left out, not returned empty.
    assert "cluster_policies" not in results["status"] and "daemonsets" not in results["status"]
    assert results["status"]["configmaps"] == {}
    assert "nodes" not in results["nothing"]


def test_with_the_gpu_operator_and_the_dra_driver(cluster, cluster_env, tmp_path):
    cluster.seed(seed.node("gpu-1", GPU), seed.daemonset("logs"), *seed.gpu_operator(), *seed.dra_driver())
    wait_for_operator_config(cluster)
    results = run_tasks([
        # The ConfigMap the ClusterPolicy names is read once a ClusterPolicy is found.
        {"name": "read", "gpuops.mig.mig_cluster_info": {}},
        {"name": "no operator", "gpuops.mig.mig_cluster_info": {"operator": False}},
    ], cluster_env, tmp_path)
    read = results["read"]
    assert [p["metadata"]["name"] for p in read["cluster_policies"]] == ["cluster-policy"]
    assert read["cluster_policies"][0]["status"]["namespace"] == read["operator_namespace"] == "gpu-operator"
    assert [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in read["daemonsets"]] == [
        ("nvidia-dra-driver-gpu", "dra-driver-nvidia-gpu-kubelet-plugin")]
    assert list(read["configmaps"]) == ["gpu-operator"]
    assert [c["metadata"]["name"] for c in read["configmaps"]["gpu-operator"]] == ["default-mig-parted-config"]
    assert read["gpu_clusters"] == []          # no GPUCluster CRD: an empty list, not an error
    # Without the operator's part nothing of it is read, its ConfigMaps included.
    assert "cluster_policies" not in results["no operator"] and results["no operator"]["configmaps"] == {}


def test_configmaps_are_read_by_name_never_listed(cluster, cluster_env, tmp_path):
    """Only the ConfigMaps the rollout names come back: another ConfigMap of the same namespaces (kube-system's
    aws-auth, the operator's own) is neither listed nor returned, whichever way the read goes."""
    cluster.seed(seed.node("gpu-1", GPU), *seed.gpu_operator(config_name=""),
                 configmap("aws-auth", "kube-system", {"mapRoles": "- rolearn: arn:aws:iam::1:role/admin\n"}),
                 configmap("fleet-mig", "kube-system", {"config.yaml": "version: v1\n"}),
                 configmap("gpu-1-mig-config", "gpu-operator", {"config.yaml": "version: v1\n"}),
                 configmap("operator-secrets", "gpu-operator", {"token": "s3cr3t"}))
    wait_for_operator_config(cluster)
    seen = len(cluster.requests)
    read = {"configmaps": [{"name": "fleet-mig", "namespace": "kube-system"}, {"name": "absent", "namespace": ""}],
            "operator_config_nodes": ["gpu-1"]}
    results = run_tasks([
        {"name": "here", "gpuops.mig.mig_cluster_info": read},
        {"name": "module", "gpuops.mig.mig_cluster_info": read, "vars": {"ansible_python_interpreter": module_python(tmp_path)}},
    ], cluster_env, tmp_path)
    for name in ("here", "module"):
        found = results[name]["configmaps"]
        # default-mig-parted-config: the operator writes it from its asset on the chart's default install.
        assert sorted((ns, c["metadata"]["name"]) for ns, cms in found.items() for c in cms) == [
            ("gpu-operator", "default-mig-parted-config"), ("gpu-operator", "gpu-1-mig-config"),
            ("kube-system", "fleet-mig")], name
        assert "aws-auth" not in str(results[name]) and "s3cr3t" not in str(results[name]), name
    configmap_reads = [r for r in cluster.requests[seen:]
                       if "/configmaps" in r.path and r.user.endswith(":rollout")]
    assert configmap_reads and all(r.method == "GET" and not r.path.endswith("/configmaps") for r in configmap_reads), \
        [(r.method, r.path) for r in configmap_reads]


def wait_for_operator_config(cluster):
    """The operator stand-in writes default-mig-parted-config after a watch event, not inside the
    seed's write (a CI run on a loaded machine read before it did): the tests read once it is there."""
    cluster.wait_for(lambda: cluster.find("ConfigMap", "default-mig-parted-config", "gpu-operator"),
                     "the operator's default-mig-parted-config")


def module_python(tmp_path):
    """An interpreter path other than the controller's own, for the same Python: the task then runs the module."""
    wrapper = tmp_path / "python-elsewhere"
    wrapper.write_text("#!/bin/sh\nexec %s \"$@\"\n" % sys.executable)
    wrapper.chmod(0o755)
    return str(wrapper)


def test_read_here_and_by_the_module_alike(cluster, cluster_env, tmp_path):
    cluster.seed(seed.node("gpu-1", GPU), seed.node("cpu-1"), *seed.gpu_operator(), *seed.dra_driver(),
                 seed.namespace("mig-configs"), configmap("fleet-mig", "mig-configs", {"config.yaml": "version: v1\n"}))
    # The two reads compare equal only on a cluster at rest: the operator's ConfigMap and node
    # labels written, the DRA plugin's DaemonSet status final.
    wait_for_operator_config(cluster)
    cluster.wait_for(lambda: daemonsets_rolled_out(cluster, "nvidia-dra-driver-gpu"),
                     "the DRA plugin rolled out")
    cluster.stand_ins.sync()
    # Nothing listens on port 9 of the loopback.
    closed = tmp_path / "closed-kubeconfig"
    config = yaml.safe_load(open(cluster_env["KUBECONFIG"]))
    for entry in config["clusters"]:
        entry["cluster"]["server"] = "https://127.0.0.1:9"
    closed.write_text(yaml.safe_dump(config))
    read = {"configmaps": [{"name": "fleet-mig", "namespace": "mig-configs"}], "node_status": True}
    elsewhere = {"ansible_python_interpreter": module_python(tmp_path)}
    results = run_tasks([
        {"name": "here", "gpuops.mig.mig_cluster_info": read},
        {"name": "module", "gpuops.mig.mig_cluster_info": read, "vars": elsewhere},
        # The task's environment reaches the read done here as it reaches a module.
        {"name": "environment", "gpuops.mig.mig_cluster_info": {"operator": False},
         "environment": {"K8S_AUTH_KUBECONFIG": str(closed)}, "ignore_errors": True},
        {"name": "closed here", "gpuops.mig.mig_cluster_info": {"kubeconfig": str(closed)}, "ignore_errors": True},
        {"name": "closed module", "gpuops.mig.mig_cluster_info": {"kubeconfig": str(closed)}, "vars": elsewhere,
         "ignore_errors": True},
    ], cluster_env, tmp_path)
    here, module = results["here"], results["module"]
    # Only a module run reports its invocation: each task went the way it should.
    assert "invocation" in module and "invocation" not in here
    module.pop("invocation")
    assert here == module
    assert here["changed"] is False and [n["metadata"]["name"] for n in here["nodes"]] == ["cpu-1", "gpu-1"]
    assert sorted(here["configmaps"]) == ["gpu-operator", "mig-configs"]
    for name in ("environment", "closed here", "closed module"):
        assert results[name]["failed"] is True, name
        assert "127.0.0.1" in results[name]["msg"] and "port=9" in results[name]["msg"], results[name]["msg"]
        assert not results[name]["msg"].startswith("Unexpected failure"), results[name]["msg"]


def test_a_gpu_cluster_is_read(cluster, cluster_env, tmp_path):
    """GPU Operator v26.7's DRA stack: a GPUCluster and no ClusterPolicy."""
    cluster.seed(seed.node("gpu-1", GPU), *seed.gpu_cluster())
    read = run_tasks([{"name": "read", "gpuops.mig.mig_cluster_info": {}}], cluster_env, tmp_path)["read"]
    assert [c["metadata"]["name"] for c in read["gpu_clusters"]] == ["gpu-cluster"] and read["cluster_policies"] == []
