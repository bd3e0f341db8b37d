"""The Hypothesis budget of the property tests that refuse odd input: a fixed, derandomized 100 examples
in CI; GPUOPS_HYPOTHESIS_EXAMPLES=<n> for a longer, random run (e.g. 20000 before a release)."""

import os

from hypothesis import HealthCheck, settings

_ASKED = os.environ.get("GPUOPS_HYPOTHESIS_EXAMPLES")
EXAMPLES = int(_ASKED) if _ASKED else 100

BUDGET = settings(max_examples=EXAMPLES, deadline=None, derandomize=not _ASKED, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
