"""The fleet report of playbooks/facts.yml (plugins/plugin_utils/_fleet_report.py), every branch,
and the filters that expose it (plugins/filter/fleet_report.py)."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.mig.plugins.filter.fleet_report import FilterModule
from ansible_collections.gpuops.mig.plugins.plugin_utils import _fleet_report as r


def gpu(index=0, name="NVIDIA A30", current="enabled", pending=None, devices=None, capable=True):
    mode = {"current": current, "pending": pending or current} if capable else None
    return {"index": index, "name": name, "uuid": "GPU-%d" % index, "pci_bus_id": "0000:%02d:00.0" % index,
            "mig_capable": capable, "mig_mode": mode, "mig_devices": devices or {},
            "gpu_instances": [{"id": 1, "profile": "1g.6gb"}] if devices else [],
            # what the report leaves out
            "memory_total_mib": 24576, "supported_profiles": [{"name": "1g.6gb"}]}


def facts(*gpus, version="570.124.06", simulated=True):
    return {"driver": {"present": True, "version": version, "error": None}, "simulated": simulated,
            "gpu_count": len(gpus), "gpus": list(gpus)}


def node(name, **labels):
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {}}


def declared(config_name="", layouts=False, config_from_label=True, kubernetes=True, k8s_node_name=None, host="h1"):
    return {"config_name": config_name, "layouts": layouts, "config_from_label": config_from_label,
            "kubernetes": kubernetes, "k8s_node_name": k8s_node_name or host}


PLAN = {"version": 1, "nodes": {"h1": {"layouts": [{"gpus": "all", "devices": {"1g.6gb": 4}}],
                                       "config_label": "gpuops-plan-1a2b", "touched": True}}}


def one(host_facts, decl=None, nodes=None, plan=None, host="h1"):
    return r.fleet_report({host: host_facts}, {host: decl} if decl is not None else None, nodes, plan)["hosts"][host]


# -- the GPUs -----------------------------------------------------------------------

def test_a_host_without_facts_has_an_error_and_still_its_declaration():
    entry = one(None, declared("all-1g"), [node("h1", **{r.STATE_LABEL: "failed"})])
    assert entry["error"] == r.NO_FACTS
    assert "gpus" not in entry and "driver" not in entry
    assert entry["declared"] == {"layout": "all-1g", "source": "inventory"}
    assert entry["kubernetes"]["mig_config_state"] == "failed"


def test_the_gpus_keep_the_keys_users_read():
    entry = one(facts(gpu(0, devices={"1g.6gb": 2}), gpu(1, capable=False, name="Tesla T4")))
    assert entry["driver"] == "570.124.06" and entry["simulated"] is True
    assert list(entry["gpus"][0]) == ["index", "name", "uuid", "pci_bus_id", "mig_capable", "mig_mode",
                                      "mig_devices", "gpu_instances"]
    assert entry["gpus"][0]["mig_devices"] == {"1g.6gb": 2} and entry["gpus"][0]["gpu_instances"]
    assert entry["gpus"][1]["mig_mode"] is None and entry["gpus"][1]["mig_devices"] == {}
    assert entry["gpus"][1]["gpu_instances"] == []


def test_facts_without_mig_devices_or_gpu_instances_give_empty_ones():
    bare = {"index": 0, "name": "A", "mig_capable": True, "mig_mode": {"current": "enabled", "pending": "enabled"}}
    entry = one({"driver": {"version": None}, "simulated": False, "gpus": [bare]})
    assert entry["gpus"][0]["mig_devices"] == {} and entry["gpus"][0]["gpu_instances"] == []
    assert entry["driver"] is None


def test_a_host_without_gpus_has_an_empty_list():
    assert one(facts())["gpus"] == []
    assert one({"driver": None, "simulated": False, "gpus": None})["gpus"] == []


def test_hosts_are_sorted():
    report = r.fleet_report({"b": facts(), "a": None, "c": facts()})
    assert list(report["hosts"]) == ["a", "b", "c"]


# -- the declared layout ---------------------------------------------------------------

def test_nothing_declared():
    assert one(facts(), declared())["declared"] == {"layout": None, "source": "none"}
    assert one(facts())["declared"] == {"layout": None, "source": "none"}   # host left out: role defaults


def test_declared_in_the_inventory():
    labelled = [node("h1", **{r.CONFIG_LABEL: "all-7g"})]
    assert one(facts(), declared("all-1g"), labelled)["declared"] == {"layout": "all-1g", "source": "inventory"}


def test_declared_by_the_node_label():
    labelled = [node("h1", **{r.CONFIG_LABEL: "all-7g"})]
    assert one(facts(), declared(), labelled)["declared"] == {"layout": "all-7g", "source": "node label"}


def test_the_node_label_is_not_used_when_the_role_would_not_use_it():
    labelled = [node("h1", **{r.CONFIG_LABEL: "all-7g"})]
    assert one(facts(), declared(config_from_label=False), labelled)["declared"] == {"layout": None,
                                                                                     "source": "none"}
    assert one(facts(), declared(config_from_label="false"), labelled)["declared"]["source"] == "none"
    # Inline layouts: the rollout labels them 'custom' and never takes the label.
    assert one(facts(), declared(layouts=True), labelled)["declared"] == {"layout": "custom", "source": "inventory"}
    # No Kubernetes: there is no label to take.
    assert one(facts(), declared(), None)["declared"]["source"] == "none"


def test_inline_layouts_with_a_name_take_the_name():
    assert one(facts(), declared("mine", layouts=True))["declared"] == {"layout": "mine", "source": "inventory"}


def test_the_plan_wins_as_in_the_rollout():
    labelled = [node("h1", **{r.CONFIG_LABEL: "all-7g"})]
    entry = one(facts(), declared("all-1g"), labelled, PLAN)
    assert entry["declared"] == {"layout": "gpuops-plan-1a2b", "source": "plan"}


def test_a_plan_entry_without_a_label_is_planned():
    plan = {"nodes": {"h1": {"layouts": [], "config_label": ""}}}
    assert one(facts(), declared(), None, plan)["declared"] == {"layout": "planned", "source": "plan"}
    # A null entry is no plan for the host, as in the rollout (its role passes the entry as the preview's plan).
    assert one(facts(), declared(), None, {"nodes": {"h1": None}})["declared"] == {"layout": None, "source": "none"}


def test_a_plan_that_does_not_name_the_host_is_not_used():
    assert one(facts(), declared("all-1g"), None, PLAN, host="h2")["declared"]["source"] == "inventory"
    assert one(facts(), declared(), None, {"version": 1})["declared"]["source"] == "none"
    assert one(facts(), declared(), None, {})["declared"]["source"] == "none"


# -- the Kubernetes node -------------------------------------------------------------------

def test_no_kubernetes_means_no_node():
    assert one(facts(), declared(), None)["kubernetes"] is None


def test_a_host_outside_kubernetes_is_not_looked_up():
    assert one(facts(), declared(kubernetes=False), [node("h1")])["kubernetes"] is None
    assert one(facts(), declared(kubernetes="no"), [node("h1")])["kubernetes"] is None


def test_the_node_labels_present():
    labels = {r.CONFIG_LABEL: "all-1g", r.STATE_LABEL: "success"}
    assert one(facts(), declared(), [node("other"), node("h1", **labels)])["kubernetes"] == {
        "node": "h1", "found": True, "mig_config": "all-1g", "mig_config_state": "success"}


def test_the_node_labels_absent():
    bare = {"metadata": {"name": "h1"}}
    assert one(facts(), declared(), [bare])["kubernetes"] == {
        "node": "h1", "found": True, "mig_config": None, "mig_config_state": None}


def test_a_missing_node_is_reported_not_an_error():
    entry = one(facts(), declared(), [node("other", **{r.STATE_LABEL: "success"})])
    assert entry["kubernetes"] == {"node": "h1", "found": False, "mig_config": None, "mig_config_state": None}
    assert entry["declared"]["source"] == "none"


def test_the_node_is_found_by_k8s_node_name():
    nodes = [node("h1", **{r.STATE_LABEL: "failed"}), node("worker-7", **{r.STATE_LABEL: "success"})]
    entry = one(facts(), declared(k8s_node_name="worker-7"), nodes)
    assert entry["kubernetes"]["node"] == "worker-7" and entry["kubernetes"]["mig_config_state"] == "success"
    # Without a declaration the node is named like the host.
    assert one(facts(), None, nodes)["kubernetes"]["mig_config_state"] == "failed"


def test_nodes_without_a_name_are_skipped():
    assert one(facts(), declared(), [None, {"metadata": {}}, node("h1")])["kubernetes"]["found"] is True


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: r.fleet_report(["h1"]), "the facts by host must be a dict"),
    (lambda: r.fleet_report({"h1": "text"}), "the gpuops_mig facts of h1 must be a dict"),
    (lambda: r.fleet_report({"h1": None}, ["h1"]), "the declared settings by host must be a dict"),
    (lambda: r.fleet_report({"h1": None}, {"h1": "x"}), "the declared settings of h1 must be a dict"),
    (lambda: r.fleet_report({"h1": None}, None, {"h1": {}}), "nodes must be a list of Node objects"),
    (lambda: r.fleet_report({"h1": None}, None, None, "plan.yml"), "gpuops_mig_plan must be a dict"),
    (lambda: r.fleet_report({"h1": None}, None, None, {"nodes": []}), "gpuops_mig_plan.nodes must be a dict"),
    (lambda: r.table(["x"]), "the report must be a dict"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(r.ReportError, match=message):
        call()


# -- the table -------------------------------------------------------------------------------

def test_cells_of_a_gpu():
    assert r.mig_mode_text(None) == "n/a"
    assert r.mig_mode_text({"current": "enabled", "pending": "enabled"}) == "enabled"
    assert r.mig_mode_text({"current": "disabled", "pending": "enabled"}) == "disabled (pending enabled)"
    assert r.mig_mode_text({"current": "enabled"}) == "enabled"
    assert r.devices_text({}) == "-" and r.devices_text(None) == "-"
    assert r.devices_text({"2g.12gb": 1, "1g.6gb": 2}) == "1g.6gb x2, 2g.12gb x1"


def test_node_cells():
    assert r.node_cells({"declared": {"layout": None, "source": "none"}, "kubernetes": None}) == ["-", "none", "-"]
    missing = {"node": "worker-7", "found": False, "mig_config": None, "mig_config_state": None}
    assert r.node_cells({"declared": {"layout": "a", "source": "plan"}, "kubernetes": missing}) == [
        "a", "plan", "no node worker-7"]
    unset = dict(missing, found=True)
    assert r.node_cells({"declared": {"layout": "a", "source": "inventory"}, "kubernetes": unset})[2] == "unset"
    assert r.node_cells({"kubernetes": dict(unset, mig_config_state="pending")}) == ["-", "none", "pending"]


def fleet():
    nodes = [node("gpu-a", **{r.CONFIG_LABEL: "all-1g", r.STATE_LABEL: "success"}), node("gpu-b")]
    return r.fleet_report(
        {"gpu-a": facts(gpu(0, devices={"1g.6gb": 4}), gpu(1, current="disabled", pending="enabled")),
         "gpu-b": facts(gpu(0, name="Tesla T4", capable=False)),
         "gpu-c": None,
         "gpu-d": facts()},
        {"gpu-a": declared(host="gpu-a"), "gpu-b": declared("all-3g", host="gpu-b"),
         "gpu-c": declared(host="gpu-c"), "gpu-d": declared(kubernetes=False, host="gpu-d")},
        nodes)


def test_table_rows():
    assert r.table_rows(fleet()) == [
        ["gpu-a", "0", "NVIDIA A30", "enabled", "1g.6gb x4", "all-1g", "node label", "success"],
        ["", "1", "NVIDIA A30", "disabled (pending enabled)", "-", "", "", ""],
        ["gpu-b", "0", "Tesla T4", "n/a", "-", "all-3g", "inventory", "unset"],
        ["gpu-c", r.NO_FACTS, "-", "none", "no node gpu-c"],
        ["gpu-d", "no GPUs", "-", "none", "-"],
    ]


def test_table_layout():
    lines = r.table(fleet())
    assert lines == [
        "HOST             GPU  MODEL                    MIG                        MIG DEVICES  DECLARED  FROM        STATE",
        "gpu-a            0    NVIDIA A30               enabled                    1g.6gb x4    all-1g    node label  success",
        "                 1    NVIDIA A30               disabled (pending enabled) -",
        "gpu-b            0    Tesla T4                 n/a                        -            all-3g    inventory   unset",
        "gpu-c            no facts (the host failed or is unreachable)                          -         none        no node gpu-c",
        "gpu-d            no GPUs                                                               -         none        -",
    ]


def test_table_keeps_the_old_columns_for_short_values():
    # The widths the report has always had: host 16, GPU 4, model 24, MIG 10.
    report = r.fleet_report({"gpu-good": facts(gpu(0, current="disabled"))})
    assert r.table(report)[1].startswith("gpu-good         0    NVIDIA A30               disabled   -")


def test_long_cells_widen_their_columns_and_the_node_columns_line_up():
    lines = r.table(r.fleet_report({"h": None, "verylonghostname-0123456789": facts(gpu(0, name="A", capable=False))}))
    assert lines[0].startswith("HOST" + " " * 24 + "GPU")
    assert lines[1].startswith("h" + " " * 27 + "no facts")
    start = lines[0].index("DECLARED")
    assert all(line[start:].split() == ["-", "none", "-"] for line in lines[1:])


def test_a_long_error_widens_the_devices_column():
    report = {"hosts": {"h": {"error": "x" * 80, "declared": {"layout": "a", "source": "inventory"},
                              "kubernetes": None}}}
    lines = r.table(report)
    assert lines[1] == "h" + " " * 16 + "x" * 80 + "  a         inventory  -"
    assert lines[0].index("DECLARED") == lines[1].index("a  ")


def test_an_empty_report_is_a_header():
    assert r.table(r.fleet_report({})) == [
        "HOST             GPU  MODEL                    MIG        MIG DEVICES  DECLARED  FROM  STATE"]
    assert r.table({}) == r.table({"hosts": {}})


# -- the filters -------------------------------------------------------------------------------

def test_the_filters():
    filters = FilterModule().filters()
    out = filters["mig_fleet_report"]({"h1": facts(gpu())}, {"h1": declared("all-1g")}, [node("h1")], PLAN)
    report = r.fleet_report({"h1": facts(gpu())}, {"h1": declared("all-1g")}, [node("h1")], PLAN)
    assert out == {"report": report, "table": r.table(report)}
    assert filters["mig_fleet_report"].__name__ == "report_and_table"
    assert "mig_fleet_report_table" not in filters


def test_the_filters_turn_bad_input_into_filter_errors():
    filters = FilterModule().filters()
    with pytest.raises(AnsibleFilterError, match="nodes must be a list"):
        filters["mig_fleet_report"]({"h1": None}, None, "gpu-1")
    with pytest.raises(AnsibleFilterError, match="the facts by host must be a dict"):
        filters["mig_fleet_report"]("report")
