# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Every checked field of the modules and the controller actions takes its valid values and
refuses the same values with a trailing newline, white space around them, or a digit of another
script (issue 36): a format check matches the whole string and counts are ASCII digits.

Each field is fed through the code that checks it where the input arrives (the config reader,
the GPU selector, the planner's options, the device plugin's sharing, a Kueue Workload, the
generator's facts, the role's waits and round settings, the event sources' options and a pod's
request). A fixed table runs every field with every kind of change; a Hypothesis test then draws
the changes (budget: fuzz_profile.py, GPUOPS_HYPOTHESIS_EXAMPLES for a long run).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.gpuops.mig.plugins.module_utils import _migparted as migparted
from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
from ansible_collections.gpuops.mig.plugins.module_utils._gpu_selection import select_gpus
from ansible_collections.gpuops.mig.plugins.module_utils import _stale_resources as stale
from ansible_collections.gpuops.mig.plugins.plugin_utils import _demand as demand
from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_plan as fleet_plan
from ansible_collections.gpuops.mig.plugins.plugin_utils import _kueue as kueue
from ansible_collections.gpuops.mig.plugins.plugin_utils import _plan_demand as plan_demand
from ansible_collections.gpuops.mig.plugins.plugin_utils import _rounds as rounds
from ansible_collections.gpuops.mig.plugins.plugin_utils import _sharing as sharing
from ansible_collections.gpuops.mig.plugins.plugin_utils import _waits as waits
from ansible_collections.gpuops.mig.plugins.plugin_utils._config_builder import build
from ansible_collections.gpuops.mig.tests.unit.plugins.module_utils.fuzz_profile import FUZZ
from ansible_collections.gpuops.mig.tests.unit.plugins.plugin_utils.fleet_helpers import facts

HOST = [{"index": i, "uuid": "GPU-%08x-aaaa" % i, "pci_device_id": "0x20B010DE",
         "pci_bus_id": "00000000:%02X:00.0" % (7 + 8 * i)} for i in range(3)]


def _mig_devices(name):
    migparted.load_config({"version": "v1", "mig-configs": {"c": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {name: 1}}]}})


def _device_filter(value):
    migparted.load_config({"version": "v1", "mig-configs": {"c": [
        {"devices": "all", "device-filter": value, "mig-enabled": True,
         "mig-devices": {"1g.5gb": 1}}]}})


def _layout_profile(name):
    migparted.entries_from_layouts([{"gpus": [0], "devices": [{"profile": name}]}])


def _layout_filter(value):
    migparted.entries_from_layouts([{"gpus": "all", "device_filter": value, "devices": {}}])


def _workload_quantity(quantity):
    container = {"name": "c", "resources": {"requests": {"nvidia.com/mig-1g.10gb": quantity}}}
    workload = {"metadata": {"name": "w", "namespace": "ml"}, "spec": {"podSets": [
        {"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}]}}
    pods, warnings = kueue.pending_pods([workload])
    if not pods:      # a Workload that cannot be read is a warning, and no pod
        raise GpuopsError("; ".join(warnings))


def _gi_profile_name(name):
    gpu = facts(0, "A100-40GB", mig_enabled=False)
    profile = next(p for p in gpu["supported_profiles"] if p["name"] == "1g.5gb")
    profile["name"] = profile["nvml_name"] = name
    build([gpu])


def _stale_count(value):
    if stale._count(value) is None:
        raise GpuopsError("not a quantity")


def _refused_as_gpuops_error(check):
    """``check`` with the ValueError subclasses of the event sources and the round (DemandError,
    RoundError) raised as GpuopsError, as the table wants."""
    def run(value):
        try:
            return check(value)
        except (demand.DemandError, rounds.RoundError) as e:
            raise GpuopsError(str(e))
    return run


def _pod_quantity(quantity):
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "status": {"phase": "Pending"},
           "spec": {"containers": [{"name": "c", "resources": {
               "limits": {"nvidia.com/mig-1g.10gb": quantity}}}]}}
    if not demand.pod_request(pod):       # a quantity that is no count is no request
        raise GpuopsError("no request")


def _label_value(value):
    if not sharing.valid_entry_name(value):
        raise GpuopsError("not a label value")


# field: (how the input is checked, valid values). Each check raises GpuopsError to refuse.
FIELDS = {
    "mig-parted mig-devices profile": (_mig_devices, ["1g.5gb", "3g.20gb", "1c.3g.20gb",
                                                      "1g.10gb+me", "1g.24gb-me"]),
    "mig-parted device-filter": (_device_filter, ["0x20B010DE", "0x20B010DE:0x145F10DE"]),
    "layouts devices profile": (_layout_profile, ["3g.40gb", "1g.10gb+me"]),
    "layouts device_filter": (_layout_filter, ["0x233010DE"]),
    "gpus selector": (lambda v: select_gpus(HOST, [v]),
                      ["1", "all", "GPU-00000001-aaaa", "0x20B010DE", "0000:0F:00.0", "0F:00.0"]),
    "mig_plan demand count": (lambda v: plan_demand._count(v, "demand 1g.10gb"), ["0", "2", "12"]),
    "mig_plan config_label_prefix": (lambda v: fleet_plan._check_options(None, 0, v),
                                     ["gpu", "gpuops-plan1"]),
    "sharing replicas": (lambda v: sharing._replicas(v, "sharing 1g.10gb"), ["2", "10"]),
    "Kueue Workload quantity": (_workload_quantity, ["1", "2"]),
    "mig_facts profile name (generator)": (_gi_profile_name, ["1g.5gb"]),
    "device plugin config name": (_label_value, ["gpuops-mig-a", "x1"]),
    "Node quantity (stale resources)": (_stale_count, ["0", "4"]),
    "role wait seconds (mig_retries)": (lambda v: waits.retries(v, 5), ["300", "0", "2.5"]),
    "round setting (gpuops_mig_round_*)": (_refused_as_gpuops_error(
        lambda v: rounds.settings({"gpuops_mig_round_cooldown": v})), ["0", "300"]),
    "event source seconds (settle_seconds)": (_refused_as_gpuops_error(
        lambda v: demand.check_seconds(v, "settle_seconds")), ["30", "2.5"]),
    "event source watch_timeout_seconds": (_refused_as_gpuops_error(
        lambda v: demand.watch_settings({"watch_timeout_seconds": v})), ["300"]),
    "pod quantity (demand)": (_pod_quantity, ["1", "12"]),
}
# Spaces around a selector are dropped: Ansible splits gpus: "0, 1" into "0" and " 1".
SPACES_DROPPED = ("gpus selector",)
SPACE = ["\n", "\r\n", "\t", "\x0b", "\x0c", "\r", "\u00a0", "\u2028", "\x85", "\u3000"]
UNICODE_DIGITS = ["\u0661", "\u0662", "\uff11", "\uff10", "\u0967", "\u09e8", "\U0001d7ce"]


def accepted(field, value):
    check, _valid = FIELDS[field]
    try:
        check(value)
    except GpuopsError:
        return False
    return True


def with_foreign_digit(value, digit):
    """``value`` with its first ASCII digit replaced by ``digit`` (None when it has no digit)."""
    for i, c in enumerate(value):
        if "0" <= c <= "9":
            return value[:i] + digit + value[i + 1:]
    return None


CASES = [(field, valid) for field, (_check, values) in sorted(FIELDS.items()) for valid in values]


@pytest.mark.parametrize("field, valid", CASES)
def test_valid_values_pass_and_changed_ones_are_refused(field, valid):
    assert accepted(field, valid), (field, valid)
    changed = [valid + "\n", valid + "\r\n", "\t" + valid, valid + "\u00a0"]
    if field not in SPACES_DROPPED:
        changed += [" " + valid, valid + " "]
    else:
        assert accepted(field, " %s " % valid)
    foreign = [with_foreign_digit(valid, d) for d in ("\u0661", "\uff11")]
    changed += [v for v in foreign if v is not None]
    assert [v for v in changed if accepted(field, v)] == [], field


@st.composite
def changed_value(draw):
    field = draw(st.sampled_from(sorted(FIELDS)))
    valid = draw(st.sampled_from(FIELDS[field][1]))
    kind = draw(st.sampled_from(["suffix", "prefix", "digit"]))
    if kind == "digit" and with_foreign_digit(valid, "\u0661") is not None:
        digit = draw(st.sampled_from(UNICODE_DIGITS) | st.characters(categories=["Nd"]).filter(
            lambda c: not "0" <= c <= "9"))
        return field, with_foreign_digit(valid, digit)
    spaces = SPACE + ([] if field in SPACES_DROPPED else [" "])
    space = draw(st.lists(st.sampled_from(spaces), min_size=1, max_size=3).map("".join))
    return field, (valid + space if kind != "prefix" else space + valid)


@FUZZ
@given(changed_value())
def test_any_trailing_newline_white_space_or_foreign_digit_is_refused(case):
    field, value = case
    assert not accepted(field, value), (field, value)
