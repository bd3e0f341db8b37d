# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""GPU selectors under any input: the GPUs named, in index order, or a SelectionError with a short message.

Budget: fuzz_profile.py (GPUOPS_HYPOTHESIS_EXAMPLES for a long run).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_selection import (
    explicitly_selected,
    normalize_bus_id,
    select_gpus,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.fuzz_profile import FUZZ

MODELS = ["0x20B010DE", "0x233010DE", "0x233510DE"]

HOST = st.lists(st.sampled_from(MODELS), max_size=8).map(lambda models: [
    {"index": i, "uuid": "GPU-%08x-aaaa" % i, "pci_device_id": model, "pci_bus_id": "00000000:%02X:00.0" % (7 + 8 * i)}
    for i, model in enumerate(models)])

SELECTOR = st.one_of(
    st.sampled_from(["all", "ALL", " all ", "0", "1", "7", "007", "99", "-1", "GPU-00000001-aaaa", "gpu-00000002-AAAA",
                     "GPU-", "GPU-x y", "0x20b010de", "0x233510DE", "0x2335", "07:00.0", "0000:0f:00.0",
                     "00000000:17:00.0", "ff:00.0", "07:00.8", ""]),
    st.text(max_size=40),
    st.text(alphabet="0123456789", min_size=5, max_size=6000),      # huge indexes (int() refuses > 4300 digits)
    st.text(min_size=5000, max_size=6000),
    st.integers(),
    st.integers(0, 9).map(lambda n: 10 ** 5000 + n),
    st.none(), st.booleans(), st.floats(), st.lists(st.integers(), max_size=3))


def refused(call, *args):
    try:
        return call(*args), None
    except GpuopsError as err:
        assert 0 < len(str(err)) < 600, str(err)[:600]
        return None, err


@FUZZ
@given(gpus=HOST, selectors=st.lists(SELECTOR, max_size=4))
def test_any_selectors_name_gpus_or_are_refused(gpus, selectors):
    chosen, err = refused(select_gpus, gpus, selectors)
    named, err_named = refused(explicitly_selected, gpus, selectors)
    assert (err is None) == (err_named is None)          # both read the selectors alike
    if chosen is None:
        return
    indexes = [g["index"] for g in chosen]
    assert indexes == sorted(set(indexes)) and all(g in gpus for g in chosen)
    assert named <= set(indexes)


@FUZZ
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"\A([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")))
def test_a_bus_id_normalises_to_one_form_or_none(text):
    bus = normalize_bus_id(text)
    assert bus is None or (len(bus) == 16 and normalize_bus_id(bus) == bus)
