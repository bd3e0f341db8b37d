"""gpuops.mig.mig_generate_config's action: GPU facts as a playbook gives them (tagged by ansible-core 2.19)
give a config the modules apply; odd facts are refused with a message, never a traceback or a bad config."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.action.mig_generate_config import ActionModule
from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import build
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError
from ansible_collections.gpuops.mig.tests.unit.plugins.action.odd_input import (
    ODD,
    assert_refused,
    odd_variant,
    run_action,
    tagged,
)
from ansible_collections.gpuops.mig.tests.unit.plugins.hypothesis_budget import BUDGET
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts

GPUS = [facts(0, "A100-40GB", mig_enabled=False), facts(1, "H100-80GB", []), facts(0, "A30", [])]


def test_tagged_gpus_from_a_playbook_give_a_config_that_parses():
    result = run_action(ActionModule, tagged({"gpus": GPUS}))
    assert not result.get("failed"), result
    assert result["config"] == yaml.safe_load(result["content"])
    parsed = migparted.load_config(result["content"])
    assert parsed.names == sorted(result["config_names"]) and "all-balanced" in parsed.names
    assert [m["pci_device_id"] for m in result["models"]] == ["0x20B010DE", "0x233010DE", "0x20B710DE"]


def test_facts_from_the_hosts_hostvars():
    hostvars = tagged({"gpu-a": {"ansible_facts": {"gpuops_mig": {"gpus": GPUS[:1]}}},
                       "gpu-b": {"ansible_facts": {"gpuops_mig": {"gpus": GPUS[1:]}}}})
    result = run_action(ActionModule, {}, {"hostvars": hostvars, "ansible_play_hosts_all": ["gpu-a", "gpu-b"]})
    assert not result.get("failed"), result
    assert len(result["models"]) == 3
    result = run_action(ActionModule, {"hosts": ["gpu-a", "gpu-c"]}, {"hostvars": hostvars})
    assert_refused(result, "no MIG facts from gpu-c")
    hostvars["gpu-a"]["ansible_facts"]["gpuops_mig"]["gpus"] = "none"
    assert_refused(run_action(ActionModule, {"hosts": ["gpu-a"]}, {"hostvars": hostvars}),
                   "the gpuops_mig facts of gpu-a have no list of gpus")


@pytest.mark.parametrize("args, fragment", [
    ({"gpus": 5}, "gpus must be a list of GPU facts (ansible_facts.gpuops_mig.gpus of gpuops.mig.mig_facts), got 5"),
    ({"gpus": "index=0"}, "gpus must be a list of GPU facts"),
    ({"gpus": [GPUS[0], "abc"]}, "gpus[1] must be a mapping, got 'abc'"),
    ({"hosts": "gpu-a"}, "hosts must be a list of inventory host names, got 'gpu-a'"),
])
def test_a_scalar_for_a_list_is_refused_naming_the_option(args, fragment):
    assert_refused(run_action(ActionModule, tagged(args)), "cannot generate a mig-parted config", fragment)


def profile_set(key, value, index=0):
    def change(gpu):
        gpu["supported_profiles"][index][key] = value
    return change


@pytest.mark.parametrize("change, fragment", [
    (profile_set("max_count", -1), "supported_profiles[0] (1g.5gb): max_count must be an integer from 1 to 64, got -1"),
    (profile_set("max_count", 1.5), "max_count must be an integer from 1 to 64, got 1.5"),
    (profile_set("max_count", 10 ** 12), "max_count must be an integer from 1 to 64, got 1000000000000"),
    (profile_set("max_count", "seven"), "max_count must be an integer from 1 to 64, got 'seven'"),
    (profile_set("name", "$(reboot)"), "name must be a MIG profile name such as 3g.40gb or 1g.10gb+me, got '$(reboot)'"),
    (profile_set("name", "9g.99gb"), "9g.99gb names 9 SM slices, but its sm_slices is 1"),
    (profile_set("name", "1g.10gb"), "GPU geometry names two GPU instance profiles '1g.10gb'"),
    (profile_set("sm_slices", 0), "sm_slices must be an integer from 1 to 64, got 0"),
    (profile_set("placements", [0, 99]), "placements must be a list of memory-slice offsets (0 to 63), got [0, 99]"),
    (profile_set("id", 20), "do not describe a GPU: GPU geometry lists GPU instance profile ID 20 twice"),
    # Well-formed facts that still contradict each other: the parser's check of the config refuses them.
    (profile_set("placements", [7]), "would refuse, so none is generated: the generated config: config 'all-1g.5gb'"),
    (profile_set("placements", [7]), "no placement can hold 1g.5gb x7 on this GPU model"),
    (lambda gpu: gpu.update(supported_profiles="bad"), "GPU 0: supported_profiles must be a list of MIG profiles"),
    (lambda gpu: gpu["supported_profiles"].append(5), "supported_profiles[7] must be a mapping"),
    (lambda gpu: gpu.update(pci_device_id="0xZZ"), "pci_device_id must be a PCI device ID 0xDDDDVVVV"),
    (lambda gpu: gpu.update(pci_device_id=""), "GPU 0 has no pci_device_id"),
    (lambda gpu: gpu.update(index=-1), "index must be a non-negative integer, got -1"),
    (lambda gpu: gpu.update(mig_capable="yes"), "mig_capable must be true or false, got 'yes'"),
    (lambda gpu: gpu.update(name=["x"]), "name must be a string, got ['x']"),
])
def test_odd_facts_are_refused_naming_the_gpu_and_field(change, fragment):
    gpu = facts(0, "A100-40GB", mig_enabled=False)
    change(gpu)
    with pytest.raises(ConfigError) as raised:
        build([gpu])
    assert fragment in str(raised.value)
    assert_refused(run_action(ActionModule, tagged({"gpus": [gpu]})), "cannot generate a mig-parted config", fragment)


def test_a_config_the_modules_would_refuse_is_never_handed_out():
    # Two profiles whose config names collide (+ becomes .): two entries would claim every GPU of the model.
    gpu = facts(0, "A100-40GB", mig_enabled=False)
    me = next(p for p in gpu["supported_profiles"] if p["name"] == "1g.5gb+me")
    gpu["supported_profiles"].append(dict(me, id=30, name="1g.5gb+me.all"))
    gpu["supported_profiles"].append(dict(me, id=31, name="1g.5gb+me+all"))
    with pytest.raises(ConfigError, match="the facts give a config that mig_config would refuse, so none is "
                                          "generated: GPU 0 .* is selected by two entries: the generated config: config 'all-1g.5gb.me.all'"):
        build([gpu])


def assert_config_or_refusal(outcome):
    """Either a config that the modules' parser takes and every GPU model it names can hold, or a refusal."""
    if outcome.get("failed"):
        # Ansible's own argument check (an unknown option, 5 for a list...) raises AnsibleActionFail.
        assert_refused(outcome, *(() if outcome.get("raised") else ("cannot generate a mig-parted config",)))
        return
    parsed = migparted.load_config(outcome["content"])
    assert yaml.safe_load(outcome["content"]) == outcome["config"]
    assert parsed.names == sorted(outcome["config_names"])


@BUDGET
@given(st.one_of(odd_variant({"gpus": GPUS}), st.fixed_dictionaries({"gpus": ODD}), ODD), st.booleans())
def test_any_input_gives_a_config_or_a_refusal(args, as_tagged):
    if as_tagged:
        args = tagged(args)
    if not isinstance(args, dict):
        args = {"gpus": args}
    assert_config_or_refusal(run_action(ActionModule, args))


@BUDGET
@given(st.data())
def test_any_odd_gpu_fact_gives_a_config_or_a_refusal(data):
    gpus = data.draw(odd_variant(GPUS))
    try:
        built = build(gpus)
    except ConfigError as e:
        assert str(e)
        return
    migparted.load_config(built["content"])
