"""The last edges of hostile input through the controller actions (issue 36): values with a
trailing newline or digits of other scripts are refused as the modules refuse them, facts that
list a GPU twice are refused, what the actions generate is checked by the modules' validation
before it is returned, and mig_node_config_file is read as the modules read config_file."""

import base64
import copy
import os
import types

import pytest
from ansible.errors import AnsibleError

from ansible_collections.gpuops.mig.plugins.action import mig_generate_config, mig_node_preview
from ansible_collections.gpuops.mig.plugins.action.mig_plan import ActionModule as PlanAction
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fleet_plan
from ansible_collections.gpuops.mig.tests.unit.plugins.action.odd_input import (
    assert_refused,
    run_action,
    tagged,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.test__input import no_hang
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import (
    facts,
    node_facts,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.test__fleet_plan_input import (
    FLEET,
    GROUPS,
)

PLAN_REFUSED = "MIG plan refused, nothing planned"
GENERATE_REFUSED = "cannot generate a mig-parted config"


def plan(**args):
    args.setdefault("fleet", FLEET)
    args.setdefault("node_groups", GROUPS)
    return run_action(PlanAction, tagged(args))


def generate(gpus):
    return run_action(mig_generate_config.ActionModule, tagged({"gpus": gpus}))


@pytest.mark.parametrize("demand", [
    {"1g.10gb": " 2"}, {"1g.10gb": "2\n"}, {"1g.10gb": "\u0662"}, {"1g.10gb": "\uff12"},
    [{"profile": "1g.10gb", "count": "2 "}],
])
def test_demand_counts_are_ascii_digits_only(demand):
    assert not plan(demand={"1g.10gb": "2"}).get("failed")
    assert_refused(plan(demand=demand), PLAN_REFUSED, "count must be a non-negative integer")


@pytest.mark.parametrize("prefix", ["gpu\n", "gpu ", "\u0661gpu"])
def test_a_config_label_prefix_with_a_trailing_newline_fails_the_task(prefix):
    assert_refused(plan(demand={"1g.10gb": 1}, config_label_prefix=prefix), PLAN_REFUSED,
                   "config_label_prefix must be 1 to 52 letters")


def test_a_gpu_index_listed_twice_in_the_facts_is_refused():
    fleet = {"a": node_facts([facts(0, "H100-80GB", []), facts(0, "H100-80GB", [])])}
    assert_refused(plan(fleet=fleet, node_groups={}, demand={"1g.10gb": 2}), PLAN_REFUSED,
                   "a gpus[1]: GPU index 0 is listed twice in the node's facts")


def profile_name(name):
    def change(gpu):
        gpu["supported_profiles"][0].update(name=name)
    return change


@pytest.mark.parametrize("change, fragment", [
    (lambda gpu: gpu.update(pci_device_id="0x20B010DE\n"),
     "pci_device_id must be a PCI device ID 0xDDDDVVVV"),
    (profile_name("1g.5gb\n"), "name must be a MIG profile name"),
    (profile_name("\u0661g.5gb"), "name must be a MIG profile name"),
])
def test_facts_with_a_trailing_newline_are_refused_by_both_actions(change, fragment):
    """mig_generate_config used to write a config that mig_config refuses ("unknown MIG profile
    '1g.5gb\\n'"), and mig_plan an entry that matches no GPU."""
    gpu = facts(0, "A100-40GB", mig_enabled=False)
    change(gpu)
    assert_refused(generate([gpu]), GENERATE_REFUSED, fragment)
    fleet = {"a": node_facts([gpu])}
    assert_refused(plan(fleet=fleet, node_groups={}, demand={"1g.5gb": 1}), PLAN_REFUSED, fragment)


def test_a_plan_the_modules_would_refuse_is_caught_in_the_action(monkeypatch):
    """Whatever the planner builds is read back as mig_config reads it before the action returns
    it: here a planner bug that writes one GPU's entry twice."""
    built = fleet_plan._build

    def twice(*args):
        result = built(*args)
        for config in result["mig_parted"].values():
            for entries in config["mig-configs"].values():
                entries.append(copy.deepcopy(entries[0]))
        return result

    assert not plan(demand={"1g.10gb": 2}).get("failed")
    monkeypatch.setattr(fleet_plan, "_build", twice)
    result = plan(demand={"1g.10gb": 2})
    assert_refused(result, PLAN_REFUSED, "is selected by two entries",
                   "the plan for a is one mig_config would refuse, so nothing is planned")
    assert "plan" not in result


def test_a_bad_config_label_from_the_planner_is_caught_in_the_action(monkeypatch):
    built = fleet_plan._build

    def newline(*args):
        result = built(*args)
        for node in result["nodes"].values():
            node["config_label"] += "\n"
        return result

    monkeypatch.setattr(fleet_plan, "_build", newline)
    assert_refused(plan(demand={"1g.10gb": 2}), PLAN_REFUSED, "is not a Kubernetes label value")


def preview_action(find=None, node_modules=None):
    """mig_node_preview, the file lookup finding a path as is (or as ``find`` says), the modules it
    runs on the node answering from ``node_modules`` ({module name: result})."""
    task = types.SimpleNamespace(args={}, async_val=0, check_mode=False,
                                 action="gpuops.mig.mig_node_preview")
    action = mig_node_preview.ActionModule(task, types.SimpleNamespace(_shell=None), None, None,
                                           None, None)
    action._find_needle = find or (lambda kind, needle: needle)
    ran = []

    def execute(name, module_args=None, task_vars=None):
        ran.append((name, module_args))
        return (node_modules or {})[name]

    action._execute_module = execute
    action.ran = ran
    return action


def preview_read(path):
    """mig_node_preview's read of mig_node_config_file on the controller."""
    text, origin = preview_action()._read_file(path, {})
    assert origin is None
    return text


def not_on_the_controller(kind, needle):
    raise AnsibleError("Could not find or access '%s'" % needle)


def test_a_config_file_on_the_node_is_read_there_and_said_so():
    """NVIDIA's host install keeps /etc/nvidia-mig-manager/config.yaml on the GPU node (issue 35):
    not on the controller, it is read on the node, looked at first."""
    path = "/etc/nvidia-mig-manager/config.yaml"
    text = "version: v1\nmig-configs:\n  all-disabled: []\n"
    action = preview_action(not_on_the_controller, {
        "ansible.builtin.stat": {"stat": {"exists": True, "isreg": True, "size": len(text)}},
        "ansible.builtin.slurp": {"content": base64.b64encode(text.encode()).decode()}})
    assert action._read_file(path, {}) == (text, "mig_node_config_file %s on the node" % path)
    assert [name for name, dummy in action.ran] == ["ansible.builtin.stat", "ansible.builtin.slurp"]
    for answer, says in (
            ({"stat": {"exists": False}}, "is neither on the controller (next to the playbook, in "
                                          "the role's files/, or at that path) nor on the node"),
            ({"stat": {"exists": True, "isreg": False}}, "on the node is not a regular file"),
            ({"stat": {"exists": True, "isreg": True, "size": 10 ** 9}}, "more than 1048576 bytes")):
        action = preview_action(not_on_the_controller, {"ansible.builtin.stat": answer})
        with pytest.raises(GpuopsError, match="mig_node_config_file %s" % path) as raised:
            action._read_file(path, {})
        assert says in str(raised.value)
        assert [name for name, dummy in action.ran] == ["ansible.builtin.stat"]   # never opened
    with pytest.raises(GpuopsError, match="mig_node_config_file config.yaml cannot be read"):
        preview_action(not_on_the_controller)._read_file("config.yaml", {})   # relative: no node


def test_mig_node_config_file_is_read_as_the_modules_read_config_file(tmp_path):
    good = tmp_path / "config.yaml"
    good.write_text("version: v1\n")
    assert preview_read(str(good)) == "version: v1\n"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(str(fifo))
    for path, fragment in ((str(fifo), "is a FIFO (named pipe), not a regular file"),
                           ("/dev/zero", "is a character device, not a regular file"),
                           ("/etc/x\x00.yaml", "'/etc/x\\x00.yaml' cannot be read: ")):
        with no_hang(), pytest.raises(GpuopsError) as raised:
            preview_read(path)
        message = str(raised.value)
        assert message.startswith("mig_node_config_file ") and fragment in message
