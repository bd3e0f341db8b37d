"""Acting on a simulated GPU host from a test, through the collection's NVML adapter (pynvml beneath)."""

import contextlib
import os

from ansible_collections.gpuops.mig.plugins.module_utils._nvml import SIMULATE_ENV, Nvml


@contextlib.contextmanager
def nvml_on(state):
    """An NVML session on the simulated host ``state`` (the environment is put back afterwards)."""
    old = os.environ.get(SIMULATE_ENV)
    os.environ[SIMULATE_ENV] = str(state)
    try:
        with Nvml() as nvml:
            yield nvml
    finally:
        if old is None:
            del os.environ[SIMULATE_ENV]
        else:
            os.environ[SIMULATE_ENV] = old
