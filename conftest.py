# Makes `import ansible_collections.gpuops.mig...` resolve to this checkout when
# pytest runs from the repository root (scripts/setup.sh creates the link), and
# the GPU simulator package (simulator/gpuops_mig_sim) importable by the tests.
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, ".build", "collections"), os.path.join(_HERE, "simulator")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# Test files whose tests must run on one pytest-xdist worker, in turn: the SSH fleet test bed's
# scenarios share one fleet per machine (tests/integration/test_molecule.py).
_ONE_WORKER_FILES = ("tests/integration/test_molecule.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, grouping by file for _ONE_WORKER_FILES. xdist's own loadgroup reads the
    `xdist_group` mark through a node attribute that pytest 9 no longer has, so it spreads the
    group over both workers. The biggest group is handed out first: the bed starts at once, on
    one worker, while the other runs the rest."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class _FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return path if path in _ONE_WORKER_FILES else nodeid

    return _FileGroups(config, log)
