# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The Hypothesis settings of the input-fuzzing property tests (test__*_properties.py).

In CI: a fixed budget of examples, derandomized, no example database, so a run is reproducible
and short. For a long run that explores new inputs each time, set GPUOPS_HYPOTHESIS_EXAMPLES:

    GPUOPS_HYPOTHESIS_EXAMPLES=20000 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        tests/unit/plugins/module_utils -k properties
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 150
_LONG = os.environ.get("GPUOPS_HYPOTHESIS_EXAMPLES")
_CHECKS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

settings.register_profile("gpuops-fuzz-ci", max_examples=CI_EXAMPLES, deadline=None, derandomize=True,
                          database=None, suppress_health_check=_CHECKS)
settings.register_profile("gpuops-fuzz-long", max_examples=int(_LONG or CI_EXAMPLES), deadline=None,
                          derandomize=False, database=None, suppress_health_check=_CHECKS)

# A decorator for each property test: @FUZZ above @given.
FUZZ = settings.get_profile("gpuops-fuzz-long" if _LONG else "gpuops-fuzz-ci")
