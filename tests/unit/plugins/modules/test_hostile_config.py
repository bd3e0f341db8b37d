"""Hostile config text through the real modules: a short failure, at once, and nothing changed on the GPUs.

Before the limits of _bounded_yaml, these ended in a MemoryError after a minute of building an error
message (a "billion laughs" of aliases), a RecursionError traceback (deep nesting) or a crashed module
process with no result at all (30,000 nested "[", in libyaml's C composer).
"""

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _bounded_yaml
from ansible_collections.gpuops.mig.plugins.modules import mig_config, mig_mode, mig_node_info

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def laughs(levels=9, width=9):
    """A flow list whose last item is width**levels strings, in about 300 bytes of aliases."""
    lists = ["&l0 [%s]" % ", ".join(["lol"] * width)]
    lists += ["&l%d [%s]" % (i, ", ".join(["*l%d" % (i - 1)] * width)) for i in range(1, levels)]
    return "[%s, *l%d]" % (", ".join(lists), levels - 1)


def config_text(devices="all", device_filter=None, count="1"):
    entry = "{devices: %s, mig-enabled: true, mig-devices: {1g.5gb: %s}%s}" % (
        devices, count, "" if device_filter is None else ", device-filter: %s" % device_filter)
    return "version: v1\nmig-configs:\n  c:\n    - %s\n" % entry


NESTED_10000 = "[" * 10000 + "0" + "]" * 10000
NESTED_30000 = "[" * 30000 + "0" + "]" * 30000
MAPPINGS_5000 = "{a: " * 5000 + "0" + "}" * 5000

DEPTH = "collections nested more than %d deep" % _bounded_yaml.MAX_DEPTH
ALIASES = "aliases that expand to more than %d values" % _bounded_yaml.MAX_ALIAS_NODES

HOSTILE = [
    pytest.param(config_text(devices=laughs()), ALIASES, id="billion-laughs-in-devices"),
    pytest.param(config_text(device_filter=laughs()), ALIASES, id="billion-laughs-in-device-filter"),
    pytest.param(config_text(count=laughs()), ALIASES, id="billion-laughs-in-a-count"),
    pytest.param(config_text(devices=NESTED_10000), DEPTH, id="10000-nested-lists"),
    pytest.param(config_text(devices=MAPPINGS_5000), DEPTH, id="5000-nested-mappings"),
    pytest.param("version: v1\nmig-configs: {c: [{devices: '%s'}]}\n" % ("x" * 5000),
                 "a value of 5000 characters, more than the %d allowed: 'xxxx" % _bounded_yaml.MAX_SCALAR_CHARS,
                 id="long-scalar"),
    pytest.param("# padding\n" * 110000, "characters of text, more than the %d" % _bounded_yaml.MAX_CHARS,
                 id="over-1MiB"),
]


def check_refused(result, expected, state, digest, file_digest):
    assert result["failed"] is True, result
    assert expected in result["msg"], result["msg"]
    assert len(result["msg"]) < 400, result["msg"]     # a short excerpt, never the expanded value
    assert "RecursionError" not in result.get("exception", "") and "MemoryError" not in result.get("exception", "")
    assert file_digest(state) == digest


@pytest.mark.parametrize("module", [mig_config, mig_mode, mig_node_info], ids=lambda m: m.__name__.split(".")[-1])
@pytest.mark.parametrize("text, expected", HOSTILE)
def test_hostile_config_text_is_refused_and_changes_nothing(module, text, expected, sim_host, run_module,
                                                            file_digest):
    state = sim_host("1xA100-SXM4-40GB", mig="disabled")
    digest = file_digest(state)
    check_refused(run_module(module, {"config": text}), "mig-parted config: ", state, digest, file_digest)
    check_refused(run_module(module, {"config": text}), expected, state, digest, file_digest)


@pytest.mark.parametrize("text, expected", HOSTILE[:1] + HOSTILE[3:4])
def test_hostile_config_file_is_refused_and_changes_nothing(text, expected, sim_host, run_module, file_digest,
                                                            tmp_path):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    digest = file_digest(state)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = run_module(mig_config, {"config_file": str(path)})
    check_refused(result, "%s: line " % path, state, digest, file_digest)
    check_refused(result, expected, state, digest, file_digest)


def test_a_config_file_that_is_not_text_or_too_big_is_refused(sim_host, run_module, file_digest, tmp_path):
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    digest = file_digest(state)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"version: v1\n\xff\xfe\x00")
    check_refused(run_module(mig_config, {"config_file": str(binary)}), "binary.yaml: not UTF-8 text",
                  state, digest, file_digest)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (_bounded_yaml.MAX_CHARS + 1))
    check_refused(run_module(mig_config, {"config_file": str(big)}),
                  "big.yaml: %d bytes, more than the %d it may have"
                  % (_bounded_yaml.MAX_CHARS + 1, _bounded_yaml.MAX_CHARS),
                  state, digest, file_digest)


RUNNER = r"""
import json, sys
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpuops.mig.plugins.modules import %s as module
with patch_module_args(json.loads(sys.argv[1])):
    module.main()
"""


@pytest.mark.parametrize("module", ["mig_config", "mig_mode"])
def test_30000_nested_lists_in_a_module_process_end_with_a_result(module, sim_host, file_digest):
    """In its own process, as Ansible runs a module (here, not in pytest's: libyaml's C composer overflowed
    the C stack on this, and a crash must not take the test run with it)."""
    state = sim_host("1xA100-SXM4-40GB", mig="enabled")
    digest = file_digest(state)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, ".build", "collections"),
                                                       os.path.join(REPO, "simulator")]))
    proc = subprocess.run([sys.executable, "-c", RUNNER % module,
                           json.dumps({"config": config_text(devices=NESTED_30000)})],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    result = json.loads(proc.stdout)
    assert result["failed"] is True and DEPTH in result["msg"], result["msg"]
    assert file_digest(state) == digest
