# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The bounded YAML reader: for any text, data or a ParseError; and the data PyYAML's SafeLoader reads.

Budget: fuzz_profile.py (GPUOPS_HYPOTHESIS_EXAMPLES for a long run).
"""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils import _bounded_yaml as bounded
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ParseError
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.fuzz_profile import FUZZ

# Pieces of YAML that, strung together at random, make text that is nearly a document: flow and block
# collections, anchors and aliases, merge keys, tags, quoting, comments, YAML 1.1 scalars.
TOKENS = ["[", "]", "{", "}", ", ", ": ", ":", "- ", "\n", "  ", "    ", "? ", "&a ", "&b ", "*a", "*b", "<<: ",
          "!!int ", "!!str ", "!!set ", "!!binary ", "!!python/tuple ", "!x ", "! ", "'q'", '"d\\n"', "|\n  t\n",
          "# c\n", "---\n", "...\n", "~", "null", "true", "no", "0x20B010DE", "0o17", "1_000", "1:20", ".inf",
          ".nan", "2001-12-14", "=", "version", "v1", "mig-configs", "devices", "all", "mig-enabled",
          "mig-devices", "device-filter", "1g.5gb", "3g.20gb", "0", "7", "-1", "x" * 50, "\ud800", "\ufeff", "\t",
          "\x85", "\U0001F600"]

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # the parser the bounded reader uses
YAML_SOUP = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)
ANY_TEXT = st.one_of(YAML_SOUP, st.text(max_size=200))

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 64, 2 ** 64),
                    st.floats(allow_nan=False), st.text(max_size=30))
DATA = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)), max_leaves=30)


def comparable(value):
    """NaN equal to itself, so two readings can be compared."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, dict):
        return {comparable(k): comparable(v) for k, v in value.items()}
    return value


@FUZZ
@given(text=ANY_TEXT)
def test_any_text_is_data_or_a_parse_error_and_the_data_is_pyyamls(text):
    try:
        data = bounded.load(text, "fuzz")
    except ParseError as err:
        assert str(err).startswith("fuzz: ") and len(str(err)) < 600
        return
    # What the bounded reader accepts, PyYAML's safe loader on the same parser reads the same (the reverse
    # does not hold: the bounded reader refuses duplicate keys, recursive aliases and collection tags such
    # as !!set).
    assert comparable(data) == comparable(yaml.load(text, Loader=SAFE_LOADER))


@FUZZ
@given(data=DATA, flow=st.sampled_from([None, True, False]))
def test_dumped_data_reads_back_the_same(data, flow):
    text = yaml.safe_dump(data, default_flow_style=flow)
    assert bounded.load(text, "fuzz") == data


@FUZZ
@given(depth=st.integers(1, 3 * bounded.MAX_DEPTH), kind=st.sampled_from(["[%s]", "{k: %s}", "- %s"]))
def test_nesting_is_read_up_to_the_limit_and_refused_beyond(depth, kind):
    if kind == "- %s":
        text = "".join("  " * i + "-\n" for i in range(depth - 1)) + "  " * (depth - 1) + "- 0\n"
    else:
        text = "0"
        for dummy in range(depth):
            text = kind % text
    if depth <= bounded.MAX_DEPTH:
        assert bounded.load(text, "t") is not None
    else:
        with pytest.raises(ParseError, match="nested more than %d deep" % bounded.MAX_DEPTH):
            bounded.load(text, "t")


@FUZZ
@given(levels=st.integers(1, 8), width=st.integers(1, 12))
def test_alias_expansion_is_counted_however_it_is_built(levels, width):
    lists = ["&l0 [%s]" % ", ".join(["x"] * width)]
    lists += ["&l%d [%s]" % (i, ", ".join(["*l%d" % (i - 1)] * width)) for i in range(1, levels)]
    text = "[%s]" % ", ".join(lists)
    # l0 is a list and its strings; l_i a list and `width` copies of l_(i-1), each alias counting all of it.
    sizes = [1 + width]
    for dummy in range(1, levels):
        sizes.append(1 + width * sizes[-1])
    expanded = sum(width * size for size in sizes[:-1])
    if expanded <= bounded.MAX_ALIAS_NODES:
        assert len(bounded.load(text, "t")) == levels
    else:
        with pytest.raises(ParseError, match="aliases that expand to more than %d values" % bounded.MAX_ALIAS_NODES):
            bounded.load(text, "t")
