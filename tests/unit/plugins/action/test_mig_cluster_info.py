"""gpuops.mig.mig_cluster_info's action: which interpreter counts as the controller's own (the read on the controller), and the
operator view it adds."""

import os
import sys
from unittest import mock

from ansible_collections.gpuops.mig.plugins.action.mig_cluster_info import same_python, with_operator_view


def test_same_python_within_one_directory_only(tmp_path):
    assert same_python(sys.executable, sys.executable)
    alias = os.path.join(os.path.dirname(sys.executable), "python3")
    if os.path.exists(alias):
        assert same_python(alias, sys.executable) == os.path.samefile(alias, sys.executable)
    # A link elsewhere to the same file is another environment (a virtual environment links its base Python).
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    assert not same_python(str(link), sys.executable)
    assert not same_python(str(tmp_path / "missing"), sys.executable)
    assert not same_python(None, sys.executable)


def test_the_operator_view_for_the_cluster_comes_with_the_operator_objects():
    policy = {"metadata": {"name": "cluster-policy", "creationTimestamp": "2026-01-01T00:00:00Z"},
              "spec": {"devicePlugin": {"enabled": False}}}
    read = with_operator_view({"cluster_policies": [policy], "gpu_clusters": [], "daemonsets": []})
    assert read["operator"]["present"] and read["operator"]["name"] == "cluster-policy"
    assert read["operator"]["device_plugin"] is False and read["operator"]["mig_manager"]["on_node"] is False
    bare = with_operator_view({"cluster_policies": []})["operator"]
    assert bare == {"present": False, "dra": mock.ANY, "gpu_cluster": None}
    # Without the operator's objects (operator=false), or failed: nothing to view.
    assert "operator" not in with_operator_view({"nodes": []})
    assert "operator" not in with_operator_view({"failed": True, "cluster_policies": []})
