"""The rollout's per-node report and fleet summary (plugins/plugin_utils/_rollout_report.py)."""

import os

import jinja2
import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.plugin_utils import _rollout_report as r

SITE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "playbooks", "site.yml")
CONVERGED = {"path": "converged"}
RECONFIGURE = {"path": "reconfigure"}


def test_node_report_counts_devices_modes_and_reboots():
    mode = {"gpus": [{"changed": True}, {"changed": False}]}
    geometry = {"gpus": [{"plan": {"destroyed_devices": 2, "created_devices": 7}}, {"plan": None}]}
    row = r.node_report(RECONFIGURE, mode, geometry, rebooted=True)
    assert row == {"outcome": "changed", "path": "reconfigure", "mode_changes": 1, "destroyed": 2, "created": 7,
                   "evicted": None, "evicted_pods": [], "reboots": 1, "seconds": None}
    assert r.node_report(CONVERGED)["outcome"] == "converged"
    assert r.node_report(RECONFIGURE, outcome="failed")["outcome"] == "failed"


def test_evicted_pods_are_counted_and_named_under_the_table():
    evicted = [{"pod": "ml/a", "reasons": [{"reason": "device destroyed", "gpu": 0}, {"reason": "device destroyed"}]},
               {"pod": "ml/b", "reasons": [{"reason": "GPU mode change"}]}]
    row = r.node_report(RECONFIGURE, evicted=evicted)
    assert row["evicted"] == 2 and row["evicted_pods"][0] == {"pod": "ml/a", "reasons": ["device destroyed"]}
    assert r.node_report(RECONFIGURE, evicted=[])["evicted"] == 0
    out = r.fleet_summary({"gpu-1": row, "gpu-2": r.node_report(RECONFIGURE, evicted=[])}, ["gpu-1", "gpu-2"])
    assert out["table"][1].split()[6] == "2" and out["table"][2].split()[6] == "0"
    assert out["table"][-1] == "gpu-1 evicted ml/a (device destroyed), ml/b (GPU mode change)"


def test_after_a_failed_drain_only_pods_seen_gone_count_as_evicted():
    evicted = [
        {"pod": "ml/a", "reasons": [{"reason": "device destroyed"}]},
        {"pod": "ml/b", "reasons": [{"reason": "GPU mode change"}]},
    ]
    still = [{"metadata": {"namespace": "ml", "name": "b"}}]
    row = r.node_report(RECONFIGURE, outcome="failed", evicted=evicted, left=still)
    assert row["evicted"] == 1 and [e["pod"] for e in row["evicted_pods"]] == ["ml/a"]
    assert row["not_evicted"] == ["ml/b"]
    # The drain itself failed (no check ran): none of them is known to be gone.
    unchecked = r.node_report(RECONFIGURE, outcome="failed", evicted=evicted)
    assert unchecked["evicted"] == 0 and unchecked["not_evicted"] == ["ml/a", "ml/b"]
    out = r.fleet_summary({"gpu-1": unchecked}, ["gpu-1"])
    assert (
        out["table"][-1]
        == "gpu-1: not evicted, still on the node (the drain did not finish): ml/a, ml/b"
    )
    assert r.node_report(RECONFIGURE, evicted=evicted, left=[])["evicted"] == 2  # all gone


def test_seconds_since_a_start():
    assert r.node_report(CONVERGED, started="2020-01-01T00:00:00+00:00")["seconds"] > 0
    assert r.node_report(CONVERGED, started="not a time")["seconds"] is None


def test_summary_converged_by_preview_alone_and_nodes_not_reached():
    reports = {"gpu-1": r.node_report(RECONFIGURE, outcome="failed"), "gpu-2": {}}
    decisions = {"gpu-2": CONVERGED, "gpu-3": RECONFIGURE}
    out = r.fleet_summary(reports, ["gpu-3", "gpu-2", "gpu-1", "gpu-4"], decisions)
    assert [(row["node"], row["outcome"], row["path"]) for row in out["nodes"]] == [
        ("gpu-1", "failed", "reconfigure"), ("gpu-2", "converged", "converged"),
        ("gpu-3", "not done", "reconfigure"), ("gpu-4", "not done", None)]
    assert out["totals"] == {"failed": 1, "converged": 1, "not done": 2}
    assert out["table"][0].split() == ["node", "outcome", "path", "mode", "changes", "destroyed", "created", "evicted",
                                       "reboots", "seconds"]
    assert out["table"][3].split()[:4] == ["gpu-3", "not", "done", "reconfigure"]
    assert r.fleet_summary({}, [])["table"] == [r.table([])[0]]


@pytest.mark.parametrize("failed, size, tolerance, stops", [
    (0, 3, 0, False),
    (1, 3, 0, True),        # no failure tolerated (the default)
    (1, 3, 20, True),       # 33 % beyond 20 %
    (1, 3, 50, False),      # 33 % within 50 %
    (1, 2, 50, False),      # exactly the tolerance: Ansible stops only beyond it
    (1, 1, 100, True),      # the whole batch failed: the playbook ends whatever the tolerance
    ("2", "4", "49.5", True),   # survey answers arrive as strings
    (1, 3, None, True),     # no tolerance set
    (1, 3, "", True),
])
def test_site_yml_summarizes_as_ansible_stops_a_batch(failed, size, tolerance, stops):
    """site.yml's condition for the summary as the rollout stops, evaluated as Jinja."""
    with open(SITE) as f:
        plays = yaml.safe_load(f)
    task = [t for play in plays for t in play.get("tasks") or ()
            if t.get("name") == "Summarize the rollout as it stops, and release the fleet"][0]
    env = jinja2.Environment()
    tolerance_vars = {"gpuops_mig_max_fail_percentage": tolerance}
    template = task["vars"]["__tolerance"]
    names = {"__failed": failed, "__size": size,
             "__tolerance": env.from_string(template).render(tolerance_vars)}
    assert env.compile_expression(task["when"])(**names) is stops


def test_preview_failure_stop_or_skip():
    from ansible_collections.gpuops.mig.plugins.plugin_utils._rollout_report import preview_failure
    skipped = preview_failure("gpu-1: busy.\n  Stop them", "skip")
    assert skipped["skip"] is True and skipped["reason"] == "gpu-1: busy. Stop them"
    assert preview_failure("x", "stop")["skip"] is False
    assert preview_failure("x", None)["skip"] is False and preview_failure("x", " SKIP ")["skip"] is True
    with pytest.raises(ValueError, match="gpuops_mig_preview_failure must be stop or skip, not 'skp'"):
        preview_failure("x", "skp")


def test_a_failed_preview_names_the_node_the_step_and_the_other_choice():
    from ansible_collections.gpuops.mig.plugins.plugin_utils._rollout_report import preview_failure
    stop = preview_failure("System has not been booted with systemd.\n", "stop", "sim-01",
                           "List the running services")
    assert stop["message"] == (
        "sim-01: its preview failed at 'List the running services': System has not been booted"
        " with systemd. No node was changed: the rollout stops here. To roll out the other nodes"
        " and leave the nodes whose preview fails as they are, set gpuops_mig_preview_failure: skip.")
    skip = preview_failure("", "skip", "sim-02")
    assert skip["message"] == ("sim-02: its preview failed: no message. It is left as it is; the"
                               " other nodes go on.")
    assert skip["reason"] == "the preview failed"


def test_skipped_nodes_are_listed_with_the_reason():
    from ansible_collections.gpuops.mig.plugins.plugin_utils._rollout_report import fleet_summary, preview_failure
    out = fleet_summary({"a": None, "b": None}, ["a", "b"], {"a": {"path": "converged"}, "b": {}},
                        {"a": {}, "b": preview_failure("b: refused, nothing was changed.", "skip")})
    rows = dict((r["node"], r) for r in out["nodes"])
    assert rows["a"]["outcome"] == "converged" and "reason" not in rows["a"]
    assert rows["b"]["outcome"] == "skipped" and rows["b"]["reason"] == "b: refused, nothing was changed."
    assert out["totals"] == {"converged": 1, "skipped": 1}
    assert out["table"][-1] == "b skipped: b: refused, nothing was changed."
    stopped = fleet_summary({}, ["c"], {}, {"c": preview_failure("c: refused", "stop")})
    assert stopped["nodes"][0]["outcome"] == "not done" and "reason" not in stopped["nodes"][0]


def test_the_preview_lists_each_node_of_a_small_fleet():
    hosts = ["a", "b", "c"]
    messages = dict((h, "%s: says" % h) for h in hosts)
    assert r.preview_lines(hosts, messages, ["b"], ["z"]) == [
        "a: says", "b: says", "c: says",
        "1 node(s) to change (b), 2 already converged. 1 skipped, left as they are (z)."]


def test_a_large_converged_fleet_is_one_line_in_the_preview_and_the_summary():
    hosts = ["gpu-%02d" % i for i in range(64)]
    messages = dict((h, "%s: layout 'x' is already in place" % h) for h in hosts)
    lines = r.preview_lines(hosts, messages, ["gpu-05"])
    assert lines[0] == "gpu-05: layout 'x' is already in place"
    assert lines[1].startswith("63 node(s) already converged: gpu-00, gpu-01, ") and lines[1].endswith(" and 43 more.")
    assert lines[2] == "1 node(s) to change (gpu-05), 63 already converged."
    decisions = dict((h, {"path": "converged"}) for h in hosts)
    summary = r.fleet_summary({}, hosts, decisions)
    assert len(summary["nodes"]) == 64 and summary["totals"] == {"converged": 64}   # AWX still gets every row
    assert len(summary["table"]) == 2 and summary["table"][1].startswith("64 node(s) converged, nothing to do: gpu-00")
