"""plain(): what ansible-core hands an action plugin (tagged values from the playbook's YAML, templated
vars) becomes plain Python that PyYAML, json and the engine's type checks take."""

import datetime
import json

import pytest
import yaml
from ansible.parsing.utils.yaml import from_yaml
from ansible.template import Templar
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.plugin_utils._plain import MAX_DEPTH, describe, plain, require_shapes
from ansible_collections.gpuops.mig.tests.unit.plugins.hypothesis_budget import BUDGET

# The tagged values this is about come with ansible-core 2.19.
TrustedAsTemplate = pytest.importorskip("ansible._internal._datatag._tags").TrustedAsTemplate

PLAYBOOK_YAML = """
gpus:
  - index: 0
    name: NVIDIA A100-SXM4-40GB
    pci_device_id: 0x20B010DE
    mig_capable: true
    ratio: 2.5
    since: 2024-01-01
    at: 2024-01-01 10:00:00
    supported_profiles:
      - {name: 1g.5gb, id: 19, placements: [0, 1, 2]}
"""


def tagged_vars():
    """The vars as a playbook gives them: parsed by Ansible's loader (every value tagged with its origin)."""
    return from_yaml(PLAYBOOK_YAML, file_name="/playbooks/group_vars/all.yml")


def templated(variables, expression):
    """A value as a task argument gets it: a template over vars, rendered by Ansible's Templar."""
    return Templar(variables=variables).template(TrustedAsTemplate().tag(expression))


def exact_types(value):
    """Every type in the value, nested."""
    found = {type(value)}
    if isinstance(value, dict):
        for k, v in value.items():
            found |= exact_types(k) | exact_types(v)
    elif isinstance(value, list):
        for v in value:
            found |= exact_types(v)
    return found


PLAIN_TYPES = {dict, list, str, int, float, bool, type(None), datetime.date, datetime.datetime}


@pytest.mark.parametrize("source", ["loaded", "templated"])
def test_tagged_values_become_plain_ones_that_pyyaml_dumps(source):
    data = tagged_vars()
    if source == "templated":
        data = templated({"fleet": data}, "{{ fleet }}")
    # The precondition of the bug: Ansible's values are subclasses PyYAML's safe dumper refuses.
    assert not exact_types(data) <= PLAIN_TYPES
    with pytest.raises(yaml.representer.RepresenterError):
        yaml.safe_dump(data)

    converted = plain(data)
    assert exact_types(converted) <= PLAIN_TYPES
    assert converted == data
    gpu = converted["gpus"][0]
    assert gpu["pci_device_id"].__class__ is int and gpu["pci_device_id"] == 0x20B010DE
    assert gpu["since"].__class__ is datetime.date and gpu["at"].__class__ is datetime.datetime
    assert yaml.safe_load(yaml.safe_dump(converted)) == converted
    json.dumps(converted, default=str)


def test_a_templated_scalar_and_a_tagged_key_become_plain():
    data = tagged_vars()
    count = templated({"n": data["gpus"][0]["index"]}, "{{ n }}")
    assert plain(count).__class__ is int
    assert all(k.__class__ is str for k in plain(data["gpus"][0]))
    assert plain(("a", ("b",))) == ["a", ["b"]]
    assert plain({("k", 1): {2}}) == {("k", 1): [2]}


def test_objects_and_runaway_nesting_are_refused_naming_where():
    with pytest.raises(RefusedError, match=r"gpus\[0\]\['x'\]: object is not a value a playbook can give"):
        plain([{"x": object()}], "gpus")
    deep = current = []
    for dummy in range(MAX_DEPTH + 5):
        current.append([])
        current = current[0]
    with pytest.raises(RefusedError, match="nested deeper than %d levels" % MAX_DEPTH):
        plain(deep)
    cycle = {}
    cycle["self"] = cycle
    with pytest.raises(RefusedError, match="nested deeper"):
        plain(cycle)


def test_describe_is_short_and_escaped_whatever_the_value():
    text = describe("\x1b[31m\n" + tagged_vars()["gpus"][0]["name"] + "x" * 500)
    assert "\x1b" not in text and "\n" not in text and "\\x1b" in text and len(text) <= 80
    assert describe(templated({"n": 5}, "{{ n }}")) == "5"
    assert len(describe(list(range(10000)))) <= 80
    assert describe(object()).startswith("<object")


@pytest.mark.parametrize("args, message", [
    ({"gpus": 5}, "gpus must be a list of GPU facts, got 5"),
    ({"gpus": "a=1"}, "gpus must be a list of GPU facts, got 'a=1'"),
    ({"gpus": [{}, "abc"]}, "gpus[1] must be a mapping, got 'abc'"),
    ({"hosts": "gpu-a,gpu-b"}, "hosts must be a list of host names, got 'gpu-a,gpu-b'"),
    ({"hosts": ["gpu-a", 7]}, "hosts[1] must be a non-empty string, got 7"),
    ({"hosts": [""]}, "hosts[0] must be a non-empty string, got ''"),
    ({"policy": ["x"]}, "policy must be a mapping, got ['x']"),
])
def test_require_shapes_names_the_option_and_what_it_got(args, message):
    shapes = {"gpus": (list, dict, "a list of GPU facts"), "hosts": (list, str, "a list of host names"),
              "policy": (dict, None, "a mapping")}
    with pytest.raises(RefusedError) as raised:
        require_shapes(args, shapes)
    assert str(raised.value) == message
    require_shapes({"gpus": [{}], "hosts": ["a"], "policy": {}}, shapes)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.dates() | st.binary(max_size=4),
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=20)


@BUDGET
@given(JSONISH)
def test_plain_of_any_value_is_equal_plain_and_idempotent(value):
    converted = plain(value)
    assert exact_types(converted) <= PLAIN_TYPES | {bytes}
    assert plain(converted) == converted
    assert len(describe(value)) <= 80
