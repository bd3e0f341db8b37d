"""Run the emulator as a standalone server (for molecule or ssh test beds):

    python -m tests.support.kubeapi --port 0 --seed seed.yaml --kubeconfig out/kubeconfig

Seed files hold ordinary manifests (several YAML documents or `kind: List`);
missing namespaces are created. Link a node to a simulated GPU host with the
annotation `kubeapi.test/nvml-state: /path/to/state.json`; a linked node that also has
`kubeapi.test/pod-resources: /path/to/kubelet.sock` gets its pods' devices assigned and a
PodResources gRPC server on that socket (tests/support/podresources_server.py). Once seeded, one
JSON line {"url", "port", "kubeconfig"} goes to stdout; SIGTERM or SIGINT stops
the server.
"""

import argparse
import json
import os
import signal
import sys

from .allocations import POD_RESOURCES_ANNOTATION
from .errors import ApiError
from .seed import load_manifests
from .server import KubeAPI


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.kubeapi",
                                     description="Kubernetes API emulator for the gpuops.mig tests.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default %(default)s)")
    parser.add_argument("--seed", action="append", default=[], metavar="FILE", help="manifests to load; repeatable")
    parser.add_argument("--kubeconfig", metavar="PATH", help="write a kubeconfig for the server here")
    parser.add_argument("--version", default="v1.31.0", help="gitVersion that /version reports (default %(default)s)")
    args = parser.parse_args(argv)

    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before the server thread starts, so it inherits
    api = KubeAPI(version=args.version).start(args.host, args.port)
    kubelets = []
    try:
        for path in args.seed:
            api.seed(*load_manifests(path))
        kubelets = pod_resources_servers(api)
        kubeconfig = None
        if args.kubeconfig:
            os.makedirs(os.path.dirname(os.path.abspath(args.kubeconfig)), exist_ok=True)
            kubeconfig = api.write_kubeconfig(args.kubeconfig)
        print(json.dumps({"url": api.url, "port": api.port, "kubeconfig": kubeconfig}), flush=True)
        signal.sigwait(stop_signals)
    except (ApiError, KeyError, OSError) as exc:
        print(f"kubeapi: {exc}", file=sys.stderr)
        return 1
    finally:
        for server in kubelets:
            server.stop()
        api.stop()
    return 0


def pod_resources_servers(api) -> list:
    """A started PodResources server for each node annotated with its socket path."""
    servers = []
    for node in api.list("Node"):
        path = (node["metadata"].get("annotations") or {}).get(POD_RESOURCES_ANNOTATION)
        if path:
            from tests.support.podresources_server import PodResourcesServer, node_source
            servers.append(PodResourcesServer(path, node_source(api, node["metadata"]["name"])).start())
    return servers


if __name__ == "__main__":
    sys.exit(main())
