"""Odd input for the controller-side actions, as ansible-core 2.19 hands it to them.

* tagged(): a value with every str/int/float/list/dict tagged with an Origin, as the playbook loader
  and the templar give them to an action.
* ODD: random nested structures of odd values (negative, huge, fractional, NaN, empty, shell, escape
  sequences, wrong types) for Hypothesis.
* mutated(): a copy of good input with one node replaced by an odd value, or deleted.
* run_action(): the action plugin's run() on given task arguments, without a connection.
"""

from __future__ import annotations

import copy
import types

from ansible.errors import AnsibleActionFail
from hypothesis import strategies as st

try:   # ansible-core 2.19 tags values with where they came from
    from ansible._internal._datatag._tags import Origin
    _tag = Origin(path="/playbooks/site.yml", line_num=7, col_num=5).tag
except ImportError:   # older ones wrap strings as AnsibleUnsafeText
    from ansible.utils.unsafe_proxy import wrap_var as _tag

ODD_TEXT = ["", " ", "0xZZ", "0x20B010DE", "$(reboot)", "`id`", "1g.10gb", "1g.5gb+me", "9g.99gb", "3g.40gb",
            "-1", "7", "seven", "all", "true", "no", "\x1b[31mred", "a\nb", "é", "1e3", "gpu-a", "mixed", "single",
            "nvidia.com/mig-1g.10gb", "nvidia.com/gpu", "x" * 300]
ODD_KEYS = ["profile", "count", "memory_gib", "compute_slices", "nodes", "group", "strict", "spare", "source",
            "whole_gpus", "skip_unreachable", "name", "id", "sm_slices", "memory_slices", "max_count", "placements",
            "index", "mig_capable", "pci_device_id", "supported_profiles", "1g.10gb", "spec", "containers",
            "resources", "limits", "requests", "nodeName", "status", "phase", "metadata"]
ODD_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=9), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD_TEXT), st.text(max_size=6),
)
ODD = st.recursive(
    ODD_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(ODD_KEYS) | st.text(max_size=4),
                                                                inner, max_size=3),
    max_leaves=10)


def tagged(value):
    """The value as Ansible hands it over: every str, int, float, list and dict tagged (bool and None cannot be)."""
    if isinstance(value, dict):
        value = dict((tagged(k), tagged(v)) for k, v in value.items())
    elif isinstance(value, list):
        value = [tagged(v) for v in value]
    return _tag(value)


def paths(value, prefix=()):
    """The path of every node of a nested value (the root is ())."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(paths(item, prefix + (key,)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found.extend(paths(item, prefix + (i,)))
    return found


def mutated(value, path, replacement, delete=False):
    """A copy of value with the node at path replaced (or deleted from its parent)."""
    if not path:
        return replacement
    value = copy.deepcopy(value)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return value


@st.composite
def odd_variant(draw, good):
    """good, with one node replaced by an odd value or deleted."""
    path = draw(st.sampled_from(paths(good)))
    delete = bool(path) and draw(st.booleans())
    return mutated(good, path, None if delete else draw(ODD), delete)


def run_action(action_class, args, task_vars=None):
    """The action's result for these task arguments; AnsibleActionFail (a clean refusal) is returned as a result."""
    task = types.SimpleNamespace(args=args, async_val=0, check_mode=False, action=action_class.__module__)
    connection = types.SimpleNamespace(_shell=types.SimpleNamespace(tmpdir=None))
    action = action_class(task, connection, None, None, None, None)
    try:
        return action.run(task_vars=task_vars or {})
    except AnsibleActionFail as e:
        return {"failed": True, "msg": str(e), "raised": True}


def assert_refused(result, *fragments):
    """A refusal: failed with a message that says what was wrong."""
    assert result.get("failed") is True, result
    assert isinstance(result.get("msg"), str) and result["msg"].strip(), result
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])
