"""The layer map holds: module_utils is what runs on the managed host, plugin_utils what runs only on the controller.

A module (plugins/modules) is sent to the host with the module_utils it imports, so it cannot import plugin_utils;
code under module_utils that no module reaches runs only on the controller and belongs in plugin_utils. The
README's layer map ("How the pieces fit") names every file of both, each under its own directory.
"""

import ast
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PLUGINS = os.path.join(ROOT, "plugins")
PACKAGE = "ansible_collections.gpuops.mig.plugins"
TARGET_SIDE = ("modules", "module_utils")
CONTROLLER_SIDE = ("action", "callback", "filter", "lookup", "plugin_utils", "test", "inventory", "vars")


def collection_imports(path):
    """{(plugin directory, module name)} that one Python file imports from the collection, at any depth."""
    with open(path) as source:
        tree = ast.parse(source.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE + "."):
            parts = node.module[len(PACKAGE) + 1:].split(".")
            if len(parts) >= 2:
                found.add((parts[0], parts[1]))
            else:
                found.update((parts[0], alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    parts = alias.name[len(PACKAGE) + 1:].split(".")
                    if len(parts) >= 2:
                        found.add((parts[0], parts[1]))
    return found


def python_files(kind):
    directory = os.path.join(PLUGINS, kind)
    if not os.path.isdir(directory):
        return {}
    return dict(((kind, name[:-3]), os.path.join(directory, name))
                for name in sorted(os.listdir(directory)) if name.endswith(".py") and name != "__init__.py")


def import_graph(kinds):
    graph = {}
    for kind in kinds:
        for key, path in python_files(kind).items():
            graph[key] = collection_imports(path)
    return graph


def reached_from_modules():
    graph = import_graph(TARGET_SIDE)
    reached, todo = set(), [key for key in graph if key[0] == "modules"]
    while todo:
        key = todo.pop()
        if key in reached:
            continue
        reached.add(key)
        todo.extend(graph.get(key, ()))
    return reached


@pytest.mark.parametrize("key", sorted(python_files("module_utils")), ids="/".join)
def test_every_module_utils_file_is_imported_by_a_module(key):
    # One imported only by the controller's plugins (or by nobody) is controller-only: plugin_utils.
    assert key in reached_from_modules(), (
        "plugins/module_utils/%s.py is imported by no module (plugins/modules, directly or through other "
        "module_utils); controller-only code lives in plugins/plugin_utils" % key[1])


def test_target_side_code_imports_only_module_utils():
    wrong = sorted("%s/%s imports %s/%s" % (key + imported)
                   for key, imports in import_graph(TARGET_SIDE).items()
                   for imported in imports if imported[0] != "module_utils")
    assert wrong == []


def test_no_action_plugin_imports_another_action_plugin():
    wrong = sorted("action/%s imports action/%s" % (key[1], imported[1])
                   for key, imports in import_graph(("action",)).items()
                   for imported in imports if imported[0] == "action")
    assert wrong == []


def test_controller_side_code_imports_no_module():
    # A module's code is what the host runs; shared logic sits in module_utils or plugin_utils.
    wrong = sorted("%s/%s imports modules/%s" % (key + (imported[1],))
                   for key, imports in import_graph(CONTROLLER_SIDE).items()
                   for imported in imports if imported[0] == "modules")
    assert wrong == []


def readme_layer_map():
    """{directory: [file names listed under it]} from the README's layer map (its first code block after the
    "How the pieces fit" heading)."""
    with open(os.path.join(ROOT, "README.md")) as readme:
        text = readme.read()
    block = text.split("### How the pieces fit", 1)[1].split("```", 2)[1]
    listed, current = {}, None
    for line in block.splitlines():
        heading = re.match(r"^(\S+/)\s", line)
        if heading:
            current = heading.group(1).rstrip("/")
            listed[current] = []
        elif current is not None:
            listed[current].extend(re.findall(r"^\s+(_\w+\.py)\s", line))
    return listed


@pytest.mark.parametrize("kind", ["module_utils", "plugin_utils"])
def test_readme_layer_map_lists_each_file_under_its_directory(kind):
    listed = readme_layer_map()["plugins/" + kind]
    present = sorted(name + ".py" for _kind, name in python_files(kind))
    generated = [name for name in present if name.endswith("_pb2.py")]   # named beside its .proto
    assert sorted(listed) == sorted(set(present) - set(generated))


def test_the_playbooks_read_no_variable_private_to_a_role():
    # A role's __mig_* variables may change with the role; the playbooks read its documented results
    # (mig_node_preview, mig_node_report: docs/rollout.md).
    found = []
    for directory in ("playbooks", os.path.join("playbooks", "tasks")):
        for name in sorted(os.listdir(os.path.join(ROOT, directory))):
            if name.endswith(".yml"):
                with open(os.path.join(ROOT, directory, name)) as playbook:
                    found += ["%s/%s: %s" % (directory, name, variable)
                              for variable in sorted(set(re.findall(r"\b__mig_\w+", playbook.read())))]
    assert found == []
