"""Which interpreter counts as the controller's own, for gpuops.mig.mig_cluster_info's read on the controller."""

import os
import sys

from ansible_collections.gpuops.mig.plugins.action.mig_cluster_info import same_python


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
