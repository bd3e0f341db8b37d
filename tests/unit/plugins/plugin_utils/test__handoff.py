"""Hand-off of a node to a dynamic MIG partitioner and back (plugins/plugin_utils/_handoff.py), and how the node
decision (plugins/plugin_utils/_node_decision.py) uses it."""

import json

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _handoff as h
from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as d
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError

from test__node_decision import info, node, policy, settings

DYNAMIC_SELECTOR = {"gpuops.mig/dynamic": "nvidia-dra"}


def dra_daemonset(dynamic=True, selector=None, name="dra-driver-nvidia-gpu-kubelet-plugin"):
    env = [{"name": "FEATURE_GATES", "value": "DynamicMIG=true"}] if dynamic else []
    spec = {"containers": [{"name": "gpus", "env": env}]}
    if selector is not False:
        spec["nodeSelector"] = dict(selector or DYNAMIC_SELECTOR)
    return {"metadata": {"name": name, "namespace": "nvidia-dra-driver-gpu"},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": "dra-driver-nvidia-gpu"}},
                                  "spec": spec}}}


def hami_daemonset():
    return {"metadata": {"name": "hami-device-plugin", "namespace": "kube-system"},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/component": "hami-device-plugin"}},
                                  "spec": {"nodeSelector": {"gpu": "on"}, "containers": [{"name": "plugin"}]}}}}


def handoff_info(mode=True, geometry=True, evicted=()):
    out = info(mode=mode, geometry=geometry, planned=[{"index": 0, "name": "A100", "mig_enabled": True, "devices": {}}])
    out["evictions"] = {"pods": [{"pod": p, "reasons": [{"reason": "device destroyed"}]} for p in evicted]}
    out["allocations_source"] = "kubelet"
    return out


def dynamic(**kw):
    return settings(**dict(dict(operator_mode="dynamic", source="dynamic", config_label="dynamic",
                                partitioner="nvidia-dra", daemonsets=[dra_daemonset()], drain="devices"), **kw))


def record(partitioner="nvidia-dra", mig_manager="true", labels=None, **more):
    return {h.ANNOTATION_HANDED_OFF: json.dumps(dict({
        "partitioner": partitioner, "daemonset": "nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin",
        "namespace": "nvidia-dra-driver-gpu", "pod_selectors": ["app.kubernetes.io/name=dra-driver-nvidia-gpu"],
        "labels": DYNAMIC_SELECTOR if labels is None else labels, "mig_manager": mig_manager}, **more))}


def operator_on(labels):
    return d.operator_view([policy(strategy="mixed")], node(labels))


# -- the hand-off ---------------------------------------------------------------------

def test_a_static_node_is_handed_to_dynamic_mig_with_mig_manager_off_and_its_plugin_put_on_the_node():
    labels = {d.LABEL_MIG_MANAGER: "true", d.LABEL_CONFIG: "all-3g"}
    out = d.decide(handoff_info(evicted=["train-1"]), node(labels), operator_on(labels), dynamic())
    assert out["path"] == "handoff" and out["operator_mode"] == "dynamic"
    assert out["operator_mig_manager_off"] is True and out["switch_off_mig_manager"] is True
    handoff = out["handoff"]
    assert handoff["partitioner"] == "nvidia-dra" and handoff["node_labels"] == DYNAMIC_SELECTOR
    assert handoff["pod_selectors"] == ["app.kubernetes.io/name=dra-driver-nvidia-gpu"]
    assert handoff["record"]["mig_manager"] == "true" and handoff["record"]["labels"] == DYNAMIC_SELECTOR
    assert out["drain"]["pods"] == [{"pod": "train-1", "reasons": ["device destroyed"]}]
    assert "hand the node to the dynamic partitioner nvidia-dra" in out["summary"] and "mig-manager off" in out["summary"]


def test_without_the_gpu_operator_the_hand_off_switches_no_mig_manager_off():
    out = d.decide(handoff_info(), node(), d.operator_view([], node()), dynamic())
    assert out["path"] == "handoff" and out["operator_mig_manager_off"] is False


@pytest.mark.parametrize("geometry", [False, True])
def test_a_node_handed_over_already_is_converged_whatever_mig_devices_the_partitioner_made(geometry):
    annotations = record()
    out = d.decide(handoff_info(mode=False, geometry=geometry), node(DYNAMIC_SELECTOR, annotations),
                   d.operator_view([], node()), dynamic())
    assert out["path"] == "converged" and out["handoff"] is None and out["converged_labels"] == {}
    assert out["drain"] is None
    assert "handed to the dynamic partitioner nvidia-dra already" in out["summary"]
    # MIG mode off again (someone else turned it off): handed over again, MIG mode on.
    again = d.decide(handoff_info(mode=True), node(DYNAMIC_SELECTOR, annotations), d.operator_view([], node()),
                     dynamic())
    assert again["path"] == "handoff"


# -- a hand-off cut short (a crash, a failure) --------------------------------------------------

def test_the_record_is_written_pending_before_the_first_change_and_done_at_the_end():
    labels = {d.LABEL_MIG_MANAGER: "true"}
    handoff = d.decide(handoff_info(), node(labels), operator_on(labels), dynamic())["handoff"]
    pending = json.loads(h.record_text(handoff, True))
    assert pending["pending"] is True and pending["mig_manager"] == "true" and "hami_entry" not in pending
    done = json.loads(h.record_text(handoff, False))
    assert done == {k: v for k, v in pending.items() if k != "pending"}
    # HAMi's entry as it was is recorded before the entry is turned to mig mode.
    change = {"text": "{}", "previous": {"name": "gpu-1", "operatingmode": "hami-core"}}
    assert json.loads(h.record_text(handoff, True, change))["hami_entry"] == change["previous"]
    assert json.loads(h.record_text(handoff, True, {"text": "{}", "previous": None}))["hami_entry"] is None


def test_a_hand_off_cut_short_is_finished_with_what_the_node_had_before_the_first_attempt():
    # The crashed attempt switched mig-manager off and turned HAMi's entry to mig mode; its record kept both.
    first = {"name": "gpu-1", "operatingmode": "hami-core", "filterdevices": {"uuid": ["GPU-x"]}}
    labels = {d.LABEL_MIG_MANAGER: "false"}
    cut_short = node(labels, record(mig_manager="true", pending=True, hami_entry=first))
    out = d.decide(handoff_info(mode=False, geometry=False), cut_short, operator_on(labels), dynamic())
    assert out["path"] == "handoff" and out["handoff"]["finishing"] is True
    assert "an earlier hand-off did not finish" in out["summary"]
    now_in_mig_mode = {"text": "{}", "previous": dict(first, operatingmode="mig")}
    text = json.loads(h.record_text(out["handoff"], False, now_in_mig_mode))
    assert text["mig_manager"] == "true" and text["hami_entry"] == first and "pending" not in text
    # Without the pending mark the same node is handed over already.
    done = node(dict(labels, **DYNAMIC_SELECTOR), record(mig_manager="true", hami_entry=first))
    assert d.decide(handoff_info(mode=False, geometry=False), done, operator_on(labels), dynamic())["path"] == "converged"


def test_a_static_run_and_the_take_back_of_a_hand_off_cut_short():
    cut_short = node({d.LABEL_MIG_MANAGER: "false"}, record(partitioner="hami", pending=True))
    out = d.decide(info(geometry=True), cut_short, d.operator_view([], node()), settings())
    assert out["path"] == "converged" and "a hand-off to the dynamic partitioner hami did not finish" in out["summary"]
    # Cut short before HAMi's entry changed: the take-back leaves the entry alone.
    assert h.take(h.record_of(cut_short, "gpu-1"))["hami_restore"] is False
    changed = node({}, record(partitioner="hami", pending=True, hami_entry=None))
    assert h.take(h.record_of(changed, "gpu-1"))["hami_restore"] is True


@pytest.mark.parametrize("kw, message", [
    ({"partitioner": "run-ai"}, "a hand-off needs mig_node_operator_mode dynamic-dra or dynamic-hami, "
                                "not 'run-ai'"),
    ({"daemonsets": []}, "no DaemonSet of NVIDIA's DRA kubelet plugin with DynamicMIG=true"),
    ({"daemonsets": [dra_daemonset(dynamic=False)]}, "no DaemonSet of NVIDIA's DRA kubelet plugin"),
    ({"daemonsets": [dra_daemonset(selector=False)]}, "has no nodeSelector, so it runs on every GPU node"),
    ({"partitioner": "hami"}, "mig_node_operator_mode=dynamic-hami, but no DaemonSet of HAMi's device plugin"),
    ({"kubernetes": False}, "mig_node_kubernetes is false"),
    ({"drain": "none"}, "pods hold MIG devices the hand-off to nvidia-dra destroys: train-1, and mig_node_drain is none"),
])
def test_bad_hand_offs_are_refused_with_the_reason(kw, message):
    with pytest.raises(RefusedError, match=message) as refused:
        d.decide(handoff_info(evicted=["train-1"]), node(), d.operator_view([], node()), dynamic(**kw))
    assert "Nothing was changed" in str(refused.value)


def test_a_node_handed_to_another_partitioner_must_be_taken_back_first():
    with pytest.raises(RefusedError, match="handed to hami .* not nvidia-dra. Nothing was changed. Take it back"):
        d.decide(handoff_info(), node({}, record(partitioner="hami")), d.operator_view([], node()), dynamic())


def test_hami_is_found_by_its_pods_component_label():
    out = d.decide(handoff_info(), node(), d.operator_view([], node()),
                   dynamic(partitioner="hami", daemonsets=[dra_daemonset(), hami_daemonset()]))
    assert out["handoff"]["daemonset"] == "kube-system/hami-device-plugin"
    assert out["handoff"]["node_labels"] == {"gpu": "on"}


def test_dynamic_mig_on_the_node_is_not_refused_when_the_node_is_handed_to_it():
    daemonsets = [dra_daemonset()]
    view = d.operator_view([], node(DYNAMIC_SELECTOR), daemonsets)
    assert view["dra"]["dynamic_mig"] is True
    with pytest.raises(RefusedError, match="DynamicMIG feature gate"):
        d.decide(info(geometry=True), node(DYNAMIC_SELECTOR), view, settings())
    assert d.decide(handoff_info(), node(DYNAMIC_SELECTOR), view, dynamic())["path"] == "handoff"


# -- a static run, and the take-back ----------------------------------------------------------

def test_a_static_run_leaves_a_handed_over_node_alone_and_says_so():
    out = d.decide(info(geometry=True), node(DYNAMIC_SELECTOR, record()), d.operator_view([], node()), settings())
    assert out["path"] == "converged" and out["handed_off"] == "nvidia-dra" and out["steady_work"] == []
    assert "left to it. Set mig_node_dynamic_take_back=true" in out["summary"]


def test_the_take_back_restores_mig_manager_and_sends_the_plugin_away_before_the_static_layout():
    theirs = node({d.LABEL_MIG_MANAGER: "false", "gpuops.mig/dynamic": "nvidia-dra"}, record(mig_manager="true"))
    back = h.taken_back_node(theirs, h.record_of(theirs, "gpu-1"))
    assert back["metadata"]["labels"] == {d.LABEL_MIG_MANAGER: "true"}
    view = d.operator_view([policy(strategy="mixed")], back)
    out = d.decide(info(geometry=True), back, view, settings(source="configmap", take_back=True))
    assert out["path"] == "mig-manager" and out["operator_mig_manager_off"] is False
    assert out["take_back"]["labels"] == {"gpuops.mig/dynamic": None, d.LABEL_MIG_MANAGER: "true"}
    assert out["take_back"]["annotations"] == {h.ANNOTATION_HANDED_OFF: None}
    assert "take the node back from the dynamic partitioner nvidia-dra" in out["summary"]
    # GPUs that already hold the layout still go through the path: the take-back runs and the layout is checked.
    assert d.decide(info(), back, view, settings(source="configmap", take_back=True))["path"] == "mig-manager"
    # Taken back to a layout the collection applies itself (takeover): mig-manager's label stays false.
    takeover = d.decide(info(geometry=True), back, view, settings(operator_mode="takeover", take_back=True))
    assert takeover["path"] == "reconfigure" and takeover["take_back"]["labels"][d.LABEL_MIG_MANAGER] == "false"


def test_an_operand_deploy_label_is_set_to_false_not_removed():
    rec = h.record_of(node({}, record(labels={"nvidia.com/gpu.deploy.dra-driver": "true"}, mig_manager=None)), "h")
    assert h.labels_off(rec) == {"nvidia.com/gpu.deploy.dra-driver": "false", d.LABEL_MIG_MANAGER: None}


def test_a_record_this_collection_did_not_write_is_refused():
    bad = node({}, {h.ANNOTATION_HANDED_OFF: "yes"})
    with pytest.raises(RefusedError, match="is not a hand-off record this collection wrote"):
        d.decide(info(), bad, d.operator_view([], bad), settings())


# -- what the partitioner publishes ----------------------------------------------------------

def slice_(devices, generation=1, node_name="gpu-1"):
    return {"spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation}, "devices": devices}}


def device(kind, parent=None, uuid=None, name="gpu-0-mig-1g10gb-19-0"):
    attrs = {"type": {"string": kind}}
    if parent:
        attrs["parentUUID"] = {"string": parent}
    if uuid:
        attrs["uuid"] = {"string": uuid}
    return {"name": name, "attributes": attrs}


GPUS = [{"uuid": "GPU-a", "mig_capable": True}, {"uuid": "GPU-b", "mig_capable": False}]


def test_dynamic_mig_is_published_when_every_mig_capable_gpu_has_placements_and_no_static_device():
    ok = h.published([slice_([device("gpu", uuid="GPU-a", name="gpu-0"), device("mig", parent="GPU-a")])],
                     "nvidia-dra", GPUS, "gpu-1")
    assert ok["ok"] is True
    stale = h.published([slice_([device("mig", parent="GPU-a", uuid="MIG-1")], generation=2),
                         slice_([device("mig", parent="GPU-a")], generation=1)], "nvidia-dra", GPUS, "gpu-1")
    assert stale["ok"] is False and "static MIG devices: gpu-0-mig-1g10gb-19-0" in stale["text"]
    assert h.published([], "nvidia-dra", GPUS, "gpu-1")["text"].startswith("0 device(s)")


def test_hami_registers_the_gpus_in_mig_mode_with_their_profiles():
    def with_register(devices):
        return [{"metadata": {"annotations": {h.HAMI_REGISTER: json.dumps(devices)}}}]
    assert h.published(with_register([{"id": "GPU-a", "mode": "mig", "migProfiles": [{"name": "1g.10gb"}]}]),
                       "hami", GPUS, "gpu-1")["ok"] is True
    assert h.published(with_register([{"id": "GPU-a", "mode": "hami-core"}]), "hami", GPUS, "gpu-1")["ok"] is False
    assert h.published([{"metadata": {}}], "hami", GPUS, "gpu-1")["ok"] is False


def test_withdrawn_once_the_nodes_slices_are_gone():
    assert h.withdrawn([], "nvidia-dra", "gpu-1")["ok"] is True
    assert h.withdrawn([slice_([device("mig", parent="GPU-a")])], "nvidia-dra", "gpu-1")["ok"] is False
    assert h.withdrawn([slice_([device("mig", parent="GPU-a")], node_name="gpu-2")], "nvidia-dra", "gpu-1")["ok"]
    left = [slice_([device("mig", parent="GPU-a")])]
    gone = h.published(left, "nvidia-dra", None, "gpu-1", gone=True)
    assert gone == h.withdrawn(left, "nvidia-dra", "gpu-1")
    assert h.published([], "nvidia-dra", None, "gpu-1", gone=True)["ok"] is True
    assert h.published(left, "hami", None, "gpu-1", gone=True)["ok"] is True


# -- HAMi's per-node config ------------------------------------------------------------------

def test_hami_node_config_sets_mig_mode_and_puts_the_entry_back():
    text = json.dumps({"nodeconfig": [{"name": "gpu-1", "operatingmode": "hami-core", "devicesplitcount": 10},
                                      {"name": "gpu-2", "operatingmode": "hami-core"}]})
    handed = h.hami_node_config(text, "gpu-1", "mig")
    entries = dict((e["name"], e) for e in json.loads(handed["text"])["nodeconfig"])
    assert entries["gpu-1"] == {"name": "gpu-1", "operatingmode": "mig", "devicesplitcount": 10}
    assert entries["gpu-2"]["operatingmode"] == "hami-core"
    assert handed["previous"]["operatingmode"] == "hami-core"
    back = h.hami_node_config(handed["text"], "gpu-1", handed["previous"])
    assert json.loads(back["text"]) == json.loads(text) | {"nodeconfig": json.loads(back["text"])["nodeconfig"]}
    assert dict((e["name"], e) for e in json.loads(back["text"])["nodeconfig"])["gpu-1"]["operatingmode"] == "hami-core"
    added = h.hami_node_config("{}", "gpu-3", "mig")
    assert added["previous"] is None and json.loads(added["text"])["nodeconfig"] == [{"name": "gpu-3",
                                                                                      "operatingmode": "mig"}]
    assert json.loads(h.hami_node_config(added["text"], "gpu-3", None)["text"])["nodeconfig"] == []
    with pytest.raises(h.HandoffError, match="config.json is not JSON"):
        h.hami_node_config("{", "gpu-1", "mig")
