# Makes `import ansible_collections.gpuops.mig...` resolve to this checkout when
# pytest runs from the repository root (scripts/setup.sh creates the link).
import os
import sys

_COLLECTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".build", "collections")
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
