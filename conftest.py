# Makes `import ansible_collections.gpuops.mig...` resolve to this checkout when
# pytest runs from the repository root (scripts/setup.sh creates the link), and
# the GPU simulator package (simulator/gpuops_mig_sim) importable by the tests.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, ".build", "collections"), os.path.join(_HERE, "simulator")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
