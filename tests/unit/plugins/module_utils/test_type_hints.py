"""The engine's public functions carry type hints (issue 23): every parameter and the return of each public
function and method of these modules, resolvable to real types here. The hints are strings on the managed
hosts' Pythons (from __future__ import annotations), so 3.8's syntax is all they need there."""

import importlib
import inspect
import typing

import pytest

TYPED = ("_migparted", "_host_mode", "_host_layout", "_bounded_yaml", "_errors", "_common", "_lease", "_k8s_objects")
PACKAGE = "ansible_collections.gpuops.mig.plugins.module_utils."


def public_functions(module):
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                    yield "%s.%s" % (name, attr), member


def missing_hints(function):
    hints = typing.get_type_hints(function)     # raises where a hint names nothing
    params = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
    return [p for p in params if p not in hints] + ([] if "return" in hints else ["return"])


@pytest.mark.parametrize("name", TYPED)
def test_public_functions_are_typed(name):
    module = importlib.import_module(PACKAGE + name)
    untyped = dict((qualified, missing) for qualified, function in public_functions(module)
                   for missing in [missing_hints(function)] if missing)
    assert untyped == {}


def test_an_untyped_function_is_found():
    def untyped(a, b: int = 0):
        return a
    assert missing_hints(untyped) == ["a", "return"]
