# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Plain Python values from what Ansible hands an action plugin, once, where the arguments come in.

ansible-core 2.19 gives an action its arguments as tagged subclasses of str, int, float, list, dict,
date... (the tag carries where the value came from); older versions wrap strings as AnsibleUnsafeText.
They compare like the plain values, but PyYAML's safe_dump, json with a strict encoder, hashing for a
cache key and ``type(x) is int`` checks do not take them. Converting the arguments once keeps the
engine's code (module_utils, plain Python) free of Ansible's types. ``describe`` says in a message
what a wrong value was, short and escaped (no control characters from the input reach the console).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Set
from typing import Any

from ansible_collections.gpuops.mig.plugins.plugin_utils import _config_builder as builder
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError

__all__ = ["plain", "describe", "require_shapes", "MAX_DEPTH"]

# Deeper than any real argument; stops a self-referencing structure (YAML anchors) as well.
MAX_DEPTH = 64


def plain(value: Any, where: str = "the arguments") -> Any:
    """``value`` with every tagged or wrapped str/int/float/list/dict/... replaced by the plain type.

    Tuples and sets become lists, as they would through JSON. Raises RefusedError naming ``where`` for a
    value no playbook can hold (an arbitrary object) or a structure nested deeper than MAX_DEPTH."""
    return _plain(value, where, (), 0)


def _plain(value, where, path, depth):
    if value is None or isinstance(value, bool):   # bool cannot be subclassed
        return value
    # The unbound methods give the exact built-in type whatever a subclass does with __str__ or __int__.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, (datetime.date, datetime.time)):   # datetime is a date
        return _date(value)
    if depth >= MAX_DEPTH:
        raise RefusedError("%s%s: nested deeper than %d levels" % (where, _path_text(path), MAX_DEPTH))
    if isinstance(value, Mapping):
        return dict((_key(k, where, path, depth), _plain(v, where, path + (k,), depth + 1)) for k, v in value.items())
    if isinstance(value, (list, tuple, Set)):
        return [_plain(v, where, path + (i,), depth + 1) for i, v in enumerate(value)]
    raise RefusedError("%s%s: %s is not a value a playbook can give (a string, number, boolean, list or mapping)"
                       % (where, _path_text(path), type(value).__name__))


_DATES = (datetime.datetime, datetime.date, datetime.time)


def _date(value):
    for kind in _DATES:   # datetime first: it is a date too
        if isinstance(value, kind):
            return kind.fromisoformat(value.isoformat())
    raise AssertionError("not a date or time: %r" % (value,))   # pragma: no cover - callers check


def _key(key, where, path, depth):
    converted = _plain(key, where, path, depth + 1)
    if isinstance(converted, list):   # a tuple key (possible from Python callers only) stays hashable
        return tuple(converted)
    return converted


def _path_text(path):
    return "".join("[%s]" % builder.describe(p) for p in path)


def describe(value: Any) -> str:
    """A value (tagged or not) for a message: its repr, escaped and short."""
    try:
        value = plain(value, "the value")
    except RefusedError:
        pass
    return builder.describe(value)


_ELEMENT_NAMES = {str: "a non-empty string", dict: "a mapping", list: "a list"}


def require_shapes(args: Mapping[str, Any], shapes: Mapping[str, tuple[type, type | None, str]]) -> None:
    """Refuse, naming the option and what it got, an argument that is not the shape Ansible's own
    argument checks would otherwise bend it into (a string split at commas into a list, "a=1" made
    a mapping, 5 made ["5"]).

    shapes: {option: (list or dict, element type or None, 'what it must be' for the message)}."""
    for name, (container, element, wanted) in shapes.items():
        value = args.get(name)
        if value is None:
            continue
        if not isinstance(value, Mapping if container is dict else list):
            raise RefusedError("%s must be %s, got %s" % (name, wanted, describe(value)))
        if element is None:
            continue
        items = value.items() if container is dict else enumerate(value)
        for key, item in items:
            if not isinstance(item, Mapping if element is dict else element) or (element is str and not item):
                raise RefusedError("%s[%s] must be %s, got %s"
                                   % (name, builder.describe(key), _ELEMENT_NAMES[element], describe(item)))
