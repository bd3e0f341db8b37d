# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The bounded YAML reader, case by case, on libyaml's parser and on PyYAML's own."""

from __future__ import annotations

import datetime
import os

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.module_utils import _bounded_yaml as bounded
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError, ParseError, excerpt

NVIDIA_DEFAULT = os.path.join(os.path.dirname(__file__), "..", "modules", "fixtures",
                              "mig-parted-config-default-v0.15.0.yaml")


@pytest.fixture(params=["libyaml", "pure-python"])
def parser(request, monkeypatch):
    """Both parsers PyYAML may have: with libyaml (CSafeLoader) and without."""
    if request.param == "pure-python":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    elif not hasattr(yaml, "CSafeLoader"):
        pytest.skip("PyYAML here has no libyaml")
    return request.param


@pytest.mark.parametrize("text, data", [
    ("a: 1\nb: [x, 'y', \"z\"]\nc: {d: ~, e: true, f: no, g: 0x20B010DE, h: 1.5, i: 2001-12-14}\n",
     {"a": 1, "b": ["x", "y", "z"], "c": {"d": None, "e": True, "f": False, "g": 0x20B010DE, "h": 1.5,
                                          "i": datetime.date(2001, 12, 14)}}),
    ("base: &b {mig-enabled: true}\nc:\n  <<: *b\n  devices: all\n",
     {"base": {"mig-enabled": True}, "c": {"mig-enabled": True, "devices": "all"}}),
    ("x: &x {a: 1}\ny: &y {b: 2}\nz:\n  <<: [*x, *y]\n", {"x": {"a": 1}, "y": {"b": 2}, "z": {"b": 2, "a": 1}}),
    ("a: &n 3\nb: *n\nc: !!str 4\nd: !!int '5'\ne: ! 6\nf: !!binary aGk=\n",
     {"a": 3, "b": 3, "c": "4", "d": 5, "e": 6, "f": b"hi"}),
    ("- &l [1, 2]\n- *l\n", [[1, 2], [1, 2]]),
    ("|\n  text\n", "text\n"),
    ("", None),
    ("# only a comment\n", None),
])
def test_reads_what_pyyamls_safe_loader_reads(parser, text, data):
    assert bounded.load(text, "t") == data == yaml.safe_load(text)


def test_nvidias_default_config_reads_as_pyyaml_reads_it(parser):
    with open(NVIDIA_DEFAULT) as f:
        text = f.read()
    assert bounded.load(text, "t") == yaml.safe_load(text)


@pytest.mark.parametrize("text, message", [
    ("a: 1\nb: 2\na: 3\n", "t: not valid YAML: line 3: found duplicate key 'a'"),
    ("x: &x {a: 1}\nc:\n  <<: *x\n  a: 2\n", "t: not valid YAML: line 3: found duplicate key 'a' (also from <<)"),
    ("x: &x {a: 1}\ny: &y {a: 2}\nc:\n  <<: [*x, *y]\n", "t: not valid YAML: line 4: found duplicate key 'a' (from <<)"),
    ("c:\n  <<: 1\n", "t: not valid YAML: line 2: << needs a mapping or a list of mappings to merge"),
    ("a: &a [1, *a]\n", "t: not valid YAML: line 1: the alias *a is inside the node it names"),
    ("a: *nowhere\n", "t: not valid YAML: line 1: the alias *nowhere names no anchor before it"),
    ("a: !!set {x, y}\n", "t: not valid YAML: line 1: the tag 'tag:yaml.org,2002:set' is not allowed on a mapping"),
    ("a: !!python/object:os.system {}\n", "the tag 'tag:yaml.org,2002:python/object:os.system' is not allowed"),
    ("a: !!python/name:os.system ''\n", "could not determine a constructor for the tag"),
    ("a: !!int 'abc'\n", "t: not valid YAML: line 1: 'abc' cannot be read as tag:yaml.org,2002:int"),
    ("a: <<\n", "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'"),
    ("? [1]\n: 2\n", "t: not valid YAML: line 1: a key that is a list; keys must be scalars"),
    ("--- 1\n--- 2\n", "t: not valid YAML: line 2: a second YAML document; a config is one document"),
    ("a: [1\n", "t: not valid YAML: "),
    ("a: \x00\n", "t: not valid YAML: "),
    ("a: \ud800\n", "t: not valid "),
])
def test_refuses_with_the_line(parser, text, message):
    with pytest.raises(ParseError) as err:
        bounded.load(text, "t")
    assert message in str(err.value)
    assert isinstance(err.value, ConfigError)


@pytest.mark.parametrize("text, message", [
    ("[" * 30000 + "]" * 30000, "t: line 1: collections nested more than 32 deep"),
    ("".join("  " * i + "k:\n" for i in range(40)), "t: line 33: collections nested more than 32 deep"),
    ("a: '%s'\n" % ("x" * 4097), "t: line 1: a value of 4097 characters, more than the 4096 allowed: 'xxx"),
    ("a: &a [" + ", ".join(["x"] * 100) + "]\nb: [" + ", ".join(["*a"] * 100) + "]\n",
     "t: line 2: aliases that expand to more than 10000 values (at *a)"),
    ("a: &a {k: v}\nb: [" + ", ".join(["{<<: *a}"] * 6000) + "]\n",
     "aliases that expand to more than 10000 values (at *a)"),
    ("#" * (1024 * 1024 + 1), "t: 1048577 characters of text, more than the 1048576 a config may have"),
])
def test_refuses_past_the_limits(parser, text, message):
    with pytest.raises(ParseError) as err:
        bounded.load(text, "t")
    assert message in str(err.value)
    assert len(str(err.value)) < 300


def test_at_the_limits_it_reads(parser):
    nested = []
    for dummy in range(31):
        nested = [nested]
    assert bounded.load("[" * 32 + "]" * 32, "t") == nested
    assert bounded.load("a: '%s'\n" % ("x" * 4096), "t") == {"a": "x" * 4096}
    text = "a: &a [" + ", ".join(["x"] * 99) + "]\nb: [" + ", ".join(["*a"] * 100) + "]\n"   # 100 x 100 values
    assert len(bounded.load(text, "t")["b"]) == 100


@pytest.mark.parametrize("value, text", [
    ("short", "'short'"),
    ("x" * 100, "'" + "x" * 60 + "'..."),
    ("\x1b[31mred\n", "'\\x1b[31mred\\n'"),
    pytest.param(10 ** 5000, "<int of 16610 bits>", id="int-of-5001-digits"),
    (list(range(100)), "[0, 1, 2, 3, ...]"),
    ({"k": {"k": {"k": {"k": {"k": 1}}}}}, "{'k': {'k': {'k': {...}}}}"),
    (3, "3"),
])
def test_excerpt_is_short_and_escaped(value, text):
    assert excerpt(value) == text


def test_excerpt_of_a_recursive_list_ends():
    value = []
    value.append(value)
    assert excerpt(value) == "[[[[...]]]]"
