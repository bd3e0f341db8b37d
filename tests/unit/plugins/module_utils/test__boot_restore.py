"""_boot_restore's list of engine modules against what the engine's imports say.

The boot-time restore runs a copy of these modules without Ansible; one missing from
ENGINE_MODULES would fail at boot with an ImportError, one too many is dead weight in
every node's restore stamp.
"""

import ast
import importlib

from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore

PACKAGE = boot_restore.PACKAGE


def imported_modules(name):
    """The collection module_utils that module `name` imports (every import statement, nested ones too)."""
    tree = ast.parse(importlib.import_module(name).__loader__.get_source(name))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            if node.module == PACKAGE:
                found.update("%s.%s" % (PACKAGE, alias.name) for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(PACKAGE + "."))
    return found


def transitive_imports(entry):
    found, queue = set(), [entry]
    while queue:
        name = queue.pop()
        if name not in found:
            found.add(name)
            queue.extend(imported_modules(name))
    return found


def test_engine_modules_are_what_the_imports_reach():
    assert sorted(boot_restore.ENGINE_MODULES) == sorted(transitive_imports(boot_restore.ENTRY))


def test_engine_modules_import_nothing_from_ansible():
    # The copy runs at boot with a bare Python: no ansible package, only the engine and pynvml.
    for name in boot_restore.ENGINE_MODULES:
        tree = ast.parse(importlib.import_module(name).__loader__.get_source(name))
        for node in ast.walk(tree):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            assert not [m for m in modules if m == "ansible" or m.startswith("ansible.")], name


def test_engine_sources_are_the_listed_modules():
    sources = boot_restore.engine_sources()
    assert sorted(sources) == sorted(boot_restore.ENGINE_MODULES)
    assert "ENGINE_MODULES" in sources[boot_restore.ENTRY]


def test_with_the_hosts_driver_the_restore_makes_device_nodes_and_the_cdi_spec_current_under_its_root():
    host = boot_restore.desired_of({"driver_root": "auto", "root": ""})
    assert host["device_nodes_root"] == "/" and host["cdi_spec_paths"] == ["/etc/cdi/nvidia.yaml",
                                                                           "/var/run/cdi/nvidia.yaml"]
    test_host = boot_restore.desired_of({"driver_root": "/", "root": "/srv/h1"})
    assert test_host["device_nodes_root"] == "/srv/h1"
    assert test_host["cdi_spec_paths"] == ["/srv/h1/etc/cdi/nvidia.yaml", "/srv/h1/var/run/cdi/nvidia.yaml"]
    # The GPU Operator's driver container owns /dev/nvidia-caps, and its toolkit the CDI spec.
    container = boot_restore.desired_of({"driver_root": "/run/nvidia/driver", "root": ""})
    assert container["device_nodes_root"] is None and container["cdi_spec_paths"] == []
