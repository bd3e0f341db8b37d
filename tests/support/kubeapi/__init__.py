"""A Kubernetes API emulator on loopback for the integration tests.

    from tests.support.kubeapi import KubeAPI, seed

    with KubeAPI() as api:                      # serves http://127.0.0.1:<free port>
        api.seed(seed.node("gpu-1", {"nvidia.com/gpu.present": "true"}))
        api.write_kubeconfig(tmp_path / "kubeconfig")
        ...                                     # run ansible-playbook / helm / kubectl against it

What it emulates and what it does not: docs/testing-kubernetes.md.
"""

from . import seed
from .cluster import Cluster, Event
from .errors import ApiError
from .server import KubeAPI

__all__ = ["ApiError", "Cluster", "Event", "KubeAPI", "seed"]
