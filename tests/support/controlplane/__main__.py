"""Run the test cluster as a standalone process (the test bed, the demo, a person trying it):

    python -m tests.support.controlplane --dir DIR --seed seed.yaml [--rbac-kubeconfig PATH]

Starts the control plane under DIR (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) and the NVIDIA stand-ins, creates what the seed files hold (ordinary
manifests; tests.support.kubeapi.seed writes them), and waits until the cluster has settled:
every bound pod running, the stand-ins caught up, a GPU Operator's operands running and
mig-manager idle. A node annotated with a PodResources socket (seed.node(pod_resources=...))
gets a kubelet PodResources gRPC server there. DIR/kubeconfig is the admin's (the harness);
--rbac-kubeconfig writes one for a ServiceAccount bound to every ClusterRole of rbac/ and
nothing else, the identity the collection runs as. Then one JSON line {"url", "kubeconfig",
"rbac_kubeconfig"} goes to stdout; SIGTERM or SIGINT stops everything.
"""

import argparse
import glob
import json
import os
import signal
import sys

from tests.support.kubeapi import migmanager
from tests.support.kubeapi.allocations import POD_RESOURCES_ANNOTATION
from tests.support.kubeapi.seed import load_manifests

from .client import ApiError
from .cluster import daemonsets_rolled_out, running
from .launcher import ROOT, ControlPlaneError

SETTLE_TIMEOUT = 120.0


def settle(cluster) -> None:
    """Waits for what a freshly seeded cluster does by itself to be done."""
    namespaces = {ds["metadata"]["namespace"] for ds in cluster.list("DaemonSet")
                  if ds["metadata"]["namespace"] != "kube-system"}
    for namespace in sorted(namespaces):
        cluster.wait_for(lambda ns=namespace: daemonsets_rolled_out(cluster, ns),
                         f"the DaemonSets of {namespace} to run", timeout=SETTLE_TIMEOUT)
    cluster.stand_ins.sync(timeout=SETTLE_TIMEOUT)
    if cluster.find("CustomResourceDefinition", "clusterpolicies.nvidia.com"):
        migmanager.wait_idle(cluster)
        cluster.stand_ins.sync(timeout=SETTLE_TIMEOUT)


def pod_resources_servers(cluster) -> list:
    """A started PodResources server for each node annotated with its socket path."""
    # pylint: disable=import-outside-toplevel
    from tests.support.podresources_server import PodResourcesServer, node_source

    servers = []
    for node in cluster.list("Node"):
        path = (node["metadata"].get("annotations") or {}).get(POD_RESOURCES_ANNOTATION)
        if path:
            source = node_source(cluster.stand_ins.view, node["metadata"]["name"])
            servers.append(PodResourcesServer(path, source).start())
    return servers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.controlplane",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", required=True, help="working directory (data, certificates, logs)")
    parser.add_argument("--seed", action="append", default=[], metavar="FILE",
                        help="manifests to create; repeatable")
    parser.add_argument("--rbac-kubeconfig", metavar="PATH",
                        help="write a kubeconfig bound to the ClusterRoles of rbac/ here")
    args = parser.parse_args(argv)

    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # the threads started below inherit it
    os.makedirs(args.dir, exist_ok=True)
    servers = []
    try:
        with running(args.dir) as cluster:
            for path in args.seed:
                cluster.seed(*load_manifests(path))
            settle(cluster)
            servers = pod_resources_servers(cluster)
            rbac = None
            if args.rbac_kubeconfig:
                manifests = sorted(glob.glob(os.path.join(ROOT, "rbac", "*.yml")))
                rbac = cluster.service_account_kubeconfig(args.rbac_kubeconfig, "gpuops-mig",
                                                          manifests)
            print(json.dumps({"url": cluster.control_plane.url,
                              "kubeconfig": cluster.control_plane.kubeconfig,
                              "rbac_kubeconfig": rbac}), flush=True)
            signal.sigwait(stop_signals)
    except (ApiError, AssertionError, ControlPlaneError, OSError) as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in servers:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
