"""The mig_node role's decisions (plugins/plugin_utils/_node_decision.py), every branch."""

import json

import pytest

from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_decision as d
from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
from ansible_collections.gpuops.mig.plugins.module_utils._k8s_objects import DRA_APP


def node(labels=None, annotations=None, unschedulable=False, name="gpu-1"):
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"unschedulable": unschedulable} if unschedulable else {}}


def policy(strategy="single", mig_manager=True, config_name="", device_plugin=True, namespace="gpu-operator"):
    return {"metadata": {"name": "cluster-policy"}, "status": {"namespace": namespace},
            "spec": {"mig": {"strategy": strategy}, "devicePlugin": {"enabled": device_plugin},
                     "migManager": {"enabled": mig_manager, "config": {"name": config_name}}}}


def info(mode=False, geometry=False, planned=None, in_step=True, wants_mig=True):
    return {"change": {"mode": mode, "geometry": geometry, "any": mode or geometry}, "wants_mig": wants_mig,
            "planned": planned or [{"index": 0, "name": "A100", "mig_enabled": True, "devices": {"3g.20gb": 2}}],
            "restore": {"in_step": in_step}}


SETTINGS = {"host": "gpu-1", "kubernetes": True, "strategy": "", "operator_mode": "auto", "source": "mig_node_layouts",
            "config_label": "all-3g", "cordoned_annotation": "gpuops.mig/cordoned"}


def settings(**kw):
    return dict(SETTINGS, **kw)


# -- the operator ------------------------------------------------------------------

def test_no_clusterpolicy_means_no_operator():
    assert d.operator_view([], node())["present"] is False


def test_operator_view_reads_clusterpolicy_and_the_node_label():
    view = d.operator_view([policy(config_name="custom-mig")], node({d.LABEL_MIG_MANAGER: "true"}))
    assert view["namespace"] == "gpu-operator" and view["mig_strategy"] == "single"
    assert view["mig_manager"] == {"enabled": True, "on_node": True, "deploy_label": "true",
                                   "config_maps": ["custom-mig"], "config_default": "all-disabled",
                                   "with_reboot": False}
    assert view["device_plugin"] is True


@pytest.mark.parametrize("label, enabled, on_node", [
    ("true", True, True), (d.PAUSED, True, True), ("false", True, False), ("", True, False), ("true", False, False)])
def test_mig_manager_on_node(label, enabled, on_node):
    view = d.operator_view([policy(mig_manager=enabled)], node({d.LABEL_MIG_MANAGER: label} if label else {}))
    assert view["mig_manager"]["on_node"] is on_node


def test_the_oldest_clusterpolicy_counts_then_the_lowest_name():
    """As the operator selects its singleton (gpu-operator controllers/active_config.go), not the first by name."""
    def dated(name, created, strategy):
        return dict(policy(strategy), metadata={"name": name, "creationTimestamp": created})
    older = dated("z-older", "2026-01-01T00:00:00Z", "mixed")
    newer = dated("a-newer", "2026-01-02T00:00:00Z", "single")
    assert d.operator_view([newer, older], node())["name"] == "z-older"
    assert d.operator_view([older, newer], node())["mig_strategy"] == "mixed"
    twin = dated("b-twin", "2026-01-01T00:00:00Z", "none")
    assert d.operator_view([older, twin, newer], node())["name"] == "b-twin"


def test_a_clusterpolicy_without_mig_strategy_means_none():
    """No mig.strategy: the operator sets no MIG_STRATEGY, the device plugin runs with none (not mixed)."""
    unset = dict(policy(), spec={"devicePlugin": {"enabled": True}})
    view = d.operator_view([unset], node())
    assert view["mig_strategy"] == "none" and view["mig_strategy_set"] is False
    assert d.effective_strategy("", view, "h") == "none"
    assert d.effective_strategy("none", view, "h") == "none"
    with pytest.raises(RefusedError, match="'mixed' but the GPU Operator's ClusterPolicy cluster-policy sets no "
                                           "mig.strategy [(]its device plugin and GFD run with their default, 'none'[)]"):
        d.effective_strategy("mixed", view, "h")
    assert d.operator_view([policy("mixed")], node())["mig_strategy_set"] is True


def test_generated_config_maps_are_tried_before_the_default():
    view = d.operator_view([policy()], node(name="n7"))
    assert view["mig_manager"]["config_maps"] == ["n7-mig-config", "default-mig-parted-config"]


def dra_ds(gates=None, selector=None, args=None):
    env = [{"name": "FEATURE_GATES", "value": gates}] if gates else []
    return {"metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": "dra"},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": DRA_APP}},
                                  "spec": {"nodeSelector": selector or {},
                                           "containers": [{"name": "gpus", "env": env, "args": args or []}]}}}}


@pytest.mark.parametrize("ds, present, dynamic", [
    (dra_ds(), True, False),
    (dra_ds("DynamicMIG=true"), True, True),
    (dra_ds("MPSSupport=true,DynamicMIG=false"), True, False),
    (dra_ds(args=["--feature-gates", "DynamicMIG=true"]), True, True),
    (dra_ds("DynamicMIG=true", selector={"dra": "yes"}), False, None),   # not on this node
    # The GPUCluster's plugin, its deploy label left paused by a run that died: still this node's (repaired).
    (dra_ds(selector={"nvidia.com/gpu.deploy.dra-driver": "true"}), True, False),
    (dra_ds(selector={"nvidia.com/gpu.deploy.dra-validator": "true"}), False, None),
])
def test_dra_driver_and_its_dynamic_mig_gate(ds, present, dynamic):
    view = d.operator_view([], node({"gpu": "yes", "nvidia.com/gpu.deploy.dra-driver": "paused-for-mig-change",
                                     "nvidia.com/gpu.deploy.dra-validator": "false"}), [ds])["dra"]
    assert view["present"] is present
    if present:
        assert view["dynamic_mig"] is dynamic


def test_dynamic_mig_is_refused():
    operator = d.operator_view([], node(), [dra_ds("DynamicMIG=true")])
    with pytest.raises(RefusedError, match="DynamicMIG feature gate, which destroys MIG devices"):
        d.decide(info(geometry=True), node(), operator, settings())


# -- settings ------------------------------------------------------------------------

def test_strategy_declared_operator_default():
    assert d.effective_strategy("", {"present": False}, "h") == "mixed"
    assert d.effective_strategy("", d.operator_view([policy("single")]), "h") == "single"
    assert d.effective_strategy("single", d.operator_view([policy("single")]), "h") == "single"
    with pytest.raises(RefusedError, match="'mixed' but the GPU Operator's ClusterPolicy cluster-policy has "
                                           "mig.strategy 'single'"):
        d.effective_strategy("mixed", d.operator_view([policy("single")]), "h")
    with pytest.raises(RefusedError, match="must be none, single or mixed"):
        d.effective_strategy("both", {"present": False}, "h")


def test_operator_modes():
    on = d.operator_view([policy()], node({d.LABEL_MIG_MANAGER: "true"}))
    off = d.operator_view([policy()], node({d.LABEL_MIG_MANAGER: "false"}))
    none = {"present": False}
    assert d.operator_mode("auto", none, "mig_node_layouts", "h") == "none"
    assert d.operator_mode("takeover", none, "mig_node_layouts", "h") == "none"
    assert d.operator_mode("auto", on, "configmap", "h") == "mig-manager"
    assert d.operator_mode("auto", off, "mig_node_layouts", "h") == "takeover"
    assert d.operator_mode("takeover", on, "configmap", "h") == "takeover"
    assert d.operator_mode("mig-manager", on, "configmap", "h") == "mig-manager"
    with pytest.raises(RefusedError, match="would be fought over"):
        d.operator_mode("auto", on, "mig_node_layouts", "h")
    with pytest.raises(RefusedError, match="does not run on this node .its label nvidia.com/gpu.deploy.mig-manager is false"):
        d.operator_mode("mig-manager", off, "configmap", "h")
    with pytest.raises(RefusedError, match="no GPU Operator ClusterPolicy"):
        d.operator_mode("mig-manager", none, "configmap", "h")
    with pytest.raises(RefusedError, match="must be auto, mig-manager, takeover, dynamic-dra or dynamic-hami"):
        d.operator_mode("yes", none, "configmap", "h")


# -- the decision --------------------------------------------------------------------

def test_converged_node_only_fixes_labels():
    out = d.decide(info(), node({d.LABEL_CONFIG: "old"}), {"present": False}, settings())
    assert out["path"] == "converged" and out["strategy"] == "mixed" and out["operator_mode"] == "none"
    assert out["converged_labels"] == {d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success"}
    assert "already in place" in out["summary"]
    same = d.decide(info(), node({d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success"}), None, settings())
    assert same["converged_labels"] == {}


def test_outside_kubernetes_no_labels():
    out = d.decide(info(), None, None, settings(kubernetes=False))
    assert out["converged_labels"] == {} and out["cordoned_earlier"] is False


def test_reconfigure_and_what_it_says():
    cordoned = node(annotations={"gpuops.mig/cordoned": "true"}, unschedulable=True)
    out = d.decide(info(mode=True, geometry=True), cordoned, None, settings())
    assert out["path"] == "reconfigure" and out["cordoned_earlier"] and out["unschedulable"]
    assert out["summary"] == "gpu-1: layout 'all-3g' is not in place: MIG mode change and geometry change needed."


def owed(**parts):
    return {"gpuops.mig/owed": json.dumps(dict({"run": "r1"}, **parts))}


def lease_of(run_id, holder="gpuops.mig run r1 on ctl"):
    """The node's Lease as the run `run_id` left it (holder "": released)."""
    return {
        "metadata": {
            "name": "gpuops-mig-gpu-1",
            "annotations": {"gpuops.mig/lease-run-id": run_id},
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 60,
            "renewTime": "2026-01-01T00:00:00.000000Z",
        },
    }


LEFT_BY_R1 = {
    "lease": lease_of("r1"),
    "gpu_clients": ["nvidia-dcgm", "a.service"],
    "operand_components": ["dcgm", "device-plugin"],
}


def test_a_converged_node_with_an_owed_record_is_repaired_first():
    left = node(annotations=owed(services=["nvidia-dcgm.service"], operands={d.LABEL_DEPLOY + "dcgm": "true"},
                                 device_plugin=True))
    out = d.decide(info(), left, None, settings(**LEFT_BY_R1))
    assert out["path"] == "converged" and out["steady_work"][0] == "repair"
    assert out["repair"]["services"] == ["nvidia-dcgm.service"] and out["repair"]["device_plugin"]
    assert out["repair"]["validate"]
    assert out["repair"]["left"] == {"services": [], "operands": {}, "device_plugin": False}
    assert out["repair"]["devices"]     # the run may have died between the geometry and /dev/nvidia-caps
    assert out["summary"] == ("gpu-1: layout 'all-3g' is already in place: nothing disruptive to do; first, run r1, "
                              "interrupted, left host services stopped (nvidia-dcgm.service); GPU Operator operands "
                              "paused (nvidia.com/gpu.deploy.dcgm); the device plugin not restarted after the GPUs "
                              "changed; this run puts that right before anything else.")
    plain = d.decide(info(), node(), None, settings())
    assert plain["repair"] == {} and "repair" not in plain["steady_work"]


def test_a_node_about_to_change_keeps_the_device_plugin_restart_owed():
    out = d.decide(
        info(geometry=True),
        node(annotations=owed(services=["a.service"], device_plugin=True)),
        None,
        settings(**LEFT_BY_R1),
    )
    assert out["path"] == "reconfigure" and out["repair"]["device_plugin"] is False
    assert out["repair"]["devices"] is False    # its own change makes them current
    assert (
        out["repair"]["left"]["device_plugin"] is True and out["repair"]["left"]["services"] == []
    )
    assert "repair" not in out["steady_work"]   # the node is held for its change anyway


def test_a_node_left_alone_is_still_repaired_but_not_validated():
    out = d.left_alone(
        node(annotations=owed(device_plugin=True)), {"present": False}, settings(**LEFT_BY_R1)
    )
    assert out["steady_work"] == ["repair", "lease"]  # the dead run's lease expired too
    assert out["repair"]["device_plugin"] and not out["repair"]["validate"]


def test_an_owed_record_gpuops_did_not_write_stops_the_node():
    with pytest.raises(RefusedError, match="gpu-1: the annotation gpuops.mig/owed is not a record gpuops.mig wrote"):
        d.decide(info(), node(annotations={"gpuops.mig/owed": "{oops"}), None, settings())


@pytest.mark.parametrize(
    "parts, lease, refused",
    [
        (
            {"services": ["sshd.service"]},
            lease_of("r1"),
            "service(s) sshd.service are not among mig_node_gpu_clients",
        ),
        (
            {"operands": {"node-role.kubernetes.io/control-plane": ""}},
            lease_of("r1"),
            "label(s) node-role.kubernetes.io/control-plane are not operand labels "
            "gpuops.mig pauses",
        ),
        (
            {"operands": {d.LABEL_DEPLOY + "dcgm": "x\ny"}},
            lease_of("r1"),
            "would get back a value no run recorded",
        ),
        (
            {"device_plugin": True},
            lease_of("other"),
            "its run r1 never held the node's lease (the Lease names run other)",
        ),
        ({"device_plugin": True}, None, "its run r1 holds no lease on the node"),
    ],
)
def test_a_forged_owed_record_is_refused_and_nothing_in_it_runs(parts, lease, refused):
    forged = node(annotations=owed(**parts))
    with pytest.raises(RefusedError) as err:
        d.decide(info(), forged, None, settings(**{**LEFT_BY_R1, "lease": lease}))
    assert (
        "gpu-1: the annotation gpuops.mig/owed asks for what gpuops.mig does not put back"
        in str(err.value)
    )
    assert refused in str(err.value) and "nothing it names was started or relabelled" in str(
        err.value
    )


def test_a_record_of_the_run_that_released_the_lease_is_trusted():
    """A failed run releases its Lease (holderIdentity emptied) but the Lease still names it."""
    out = d.decide(
        info(),
        node(annotations=owed(operands={d.LABEL_DEPLOY + "dcgm": "pre-installed"})),
        None,
        settings(**{**LEFT_BY_R1, "lease": lease_of("r1", holder="")}),
    )
    assert out["repair"]["operands"] == {d.LABEL_DEPLOY + "dcgm": "pre-installed"}


def test_a_gpu_cluster_s_operands_may_be_owed():
    label = {d.LABEL_DEPLOY + "dra-driver": "true"}
    with pytest.raises(RefusedError, match="not operand labels"):
        d.decide(info(), node(annotations=owed(operands=label)), None, settings(**LEFT_BY_R1))
    out = d.left_alone(
        node(annotations=owed(operands=label)),
        {"present": True, "gpu_cluster": {"name": "c"}},
        settings(**LEFT_BY_R1),
    )
    assert out["repair"]["operands"] == label


def test_a_host_record_outside_kubernetes_needs_no_lease_but_only_gpu_clients():
    host = dict(
        info(),
        owed={
            "text": json.dumps({"run": "r1", "services": ["nvidia-dcgm.service"]}),
            "path": "/var/lib/gpuops-mig/owed.json",
        },
    )
    out = d.decide(host, None, None, settings(kubernetes=False, **{**LEFT_BY_R1, "lease": None}))
    assert out["repair"]["services"] == ["nvidia-dcgm.service"]
    host["owed"]["text"] = json.dumps({"run": "r1", "services": ["evil.service"]})
    with pytest.raises(
        RefusedError,
        match="the file /var/lib/gpuops-mig/owed.json asks for what gpuops.mig does not",
    ):
        d.decide(host, None, None, settings(kubernetes=False, **LEFT_BY_R1))


def test_the_summary_says_which_pods_the_change_evicts():
    evicting = dict(info(geometry=True), allocations_source="podresources",
                    evictions={"pods": [{"pod": "ml/a", "reasons": [{"reason": "device destroyed"}]}], "drain_node": False})
    out = d.decide(evicting, node(), None, settings(drain=True))
    assert out["drain"]["mode"] == "devices" and out["drain"]["pods"] == [{"pod": "ml/a", "reasons": ["device destroyed"]}]
    assert out["summary"].endswith("geometry change needed; evicts 1 pod(s): ml/a (device destroyed).")
    assert d.decide(info(), node(), None, settings(drain=True))["drain"] is None     # converged: no drain
    with pytest.raises(RefusedError, match="gpu-1: mig_node_drain must be devices, node or none"):
        d.decide(evicting, node(), None, settings(drain="sometimes"))


def test_driving_mig_manager():
    operator = d.operator_view([policy("mixed")], node({d.LABEL_MIG_MANAGER: "true"}))
    out = d.decide(info(geometry=True), node({d.LABEL_MIG_MANAGER: "true"}), operator, settings(source="configmap"))
    assert out["path"] == "mig-manager" and out["persist"] is False and out["switch_off_mig_manager"] is False
    assert "applied by the GPU Operator's mig-manager" in out["summary"]
    converged = d.decide(info(), node({d.LABEL_MIG_MANAGER: "true", d.LABEL_CONFIG: "x"}), operator,
                         settings(source="configmap"))
    assert converged["converged_labels"] == {d.LABEL_CONFIG: "all-3g"}    # mig-manager writes the state


def test_takeover_switches_mig_manager_off_once():
    labels = {d.LABEL_MIG_MANAGER: "true"}
    operator = d.operator_view([policy("mixed")], node(labels))
    out = d.decide(info(geometry=True), node(labels), operator, settings(operator_mode="takeover"))
    assert out["path"] == "reconfigure" and out["switch_off_mig_manager"] is True and out["persist"] is True
    labels = {d.LABEL_MIG_MANAGER: "false"}
    out = d.decide(info(), node(labels), d.operator_view([policy("mixed")], node(labels)), settings())
    assert out["operator_mode"] == "takeover" and out["switch_off_mig_manager"] is False


@pytest.mark.parametrize("planned, ok", [
    ([{"index": 0, "name": "A", "mig_enabled": True, "devices": {"1g.10gb": 7}}] * 2, True),
    ([{"index": 0, "name": "A", "mig_enabled": False, "devices": {}}] * 2, True),
    ([{"index": 0, "name": "A", "mig_enabled": True, "devices": {"1g.10gb": 3, "2g.20gb": 2}}], False),
    ([{"index": 0, "name": "A", "mig_enabled": True, "devices": {"1g.10gb": 7}},
      {"index": 1, "name": "A", "mig_enabled": False, "devices": {}}], False),
    ([{"index": 0, "name": "A", "mig_enabled": True, "devices": {}}], False),
])
def test_single_strategy_rule(planned, ok):
    problem = d.single_strategy_problem(planned, "x", "h")
    assert (problem is None) is ok
    if not ok:
        with pytest.raises(RefusedError, match="Nothing was changed"):
            d.decide(info(planned=planned), None, None, settings(strategy="single"))


# -- the config from the cluster ------------------------------------------------------

def cm(name, data):
    return {"metadata": {"name": name}, "data": data}


def test_config_from_configmaps():
    maps = [cm("default-mig-parted-config", {"config.yaml": "a"}), cm("n7-mig-config", {"config.yaml": "b"})]
    got = d.config_from_configmaps(maps, ["n7-mig-config", "default-mig-parted-config"], "gpu-operator",
                                   "config.yaml", "n7")
    assert got["config"] == "b" and got["origin"] == "ConfigMap gpu-operator/n7-mig-config (key config.yaml)"
    missing = d.config_from_configmaps(maps, ["nope"], "gpu-operator", "config.yaml", "n7")
    assert missing["error"] == "n7: no ConfigMap nope in namespace gpu-operator holds the MIG config. Nothing was changed."
    nokey = d.config_from_configmaps([cm("x", {"other": "1"})], ["x"], "ns", "config.yaml", "n7")
    assert nokey["error"] == "n7: ConfigMap ns/x has no key 'config.yaml' (it has: other). Nothing was changed."


# -- what the node advertises ---------------------------------------------------------

GPUS = [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a", "mig_enabled": True, "mig_devices": {"3g.20gb": 2}},
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-b", "mig_enabled": False, "mig_devices": {}}]


def test_expected_advertisement_per_strategy():
    assert d.expected_advertisement(GPUS, "none") == {
        "resources": {"nvidia.com/gpu": "2"},
        "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}
    assert d.expected_advertisement(GPUS, "mixed") == {
        "resources": {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.20gb": "2"},
        "labels": {"nvidia.com/gpu.count": "1", "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.20gb.count": "2"}}
    assert d.expected_advertisement(GPUS[:1], "single") == {
        "resources": {"nvidia.com/gpu": "2"},
        "labels": {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "2",
                   "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"}}
    assert d.expected_advertisement(GPUS, "single")["resources"] == {}      # the plugin refuses a mix
    assert d.expected_advertisement(GPUS, "mixed", with_labels=False)["labels"] == {}


def test_advertised_reads_only_what_is_expected():
    expected = d.expected_advertisement(GPUS, "mixed")
    n = node({"nvidia.com/gpu.count": "1", "other": "x"})
    n["status"] = {"allocatable": {"cpu": "8", "nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "0",
                                   "nvidia.com/mig-3g.20gb": "2"}}
    assert d.advertised(n, expected) == {"resources": {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.20gb": "2"},
                                         "labels": {"nvidia.com/gpu.count": "1"}}


def test_slices_compare_newest_generation():
    def dev(kind, uuid=None, parent=None, profile=None):
        attrs = {"type": {"string": kind}}
        if uuid:
            attrs["uuid"] = {"string": uuid}
        if parent:
            attrs["parentUUID"] = {"string": parent}
            attrs["profile"] = {"string": profile}
        return {"name": "x", "attributes": attrs}

    def slice_(gen, devices, node_name="gpu-1"):
        return {"spec": {"driver": "gpu.nvidia.com", "nodeName": node_name, "pool": {"generation": gen},
                         "devices": devices}}
    slices = [slice_(1, [dev("gpu", uuid="GPU-a")]),
              slice_(2, [dev("mig", parent="GPU-a", profile="3g.20gb")] * 2 + [dev("gpu", uuid="GPU-b")]),
              slice_(5, [dev("gpu", uuid="GPU-z")], node_name="other")]
    assert d.published_slices(slices, "gpu-1") == d.expected_slices(GPUS)
    assert d.published_slices([], "gpu-1") == {"mig": [], "gpus": []}


def test_steady_work_says_what_a_converged_node_still_needs():
    done = node({d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success"})
    assert d.decide(info(), done, None, settings())["steady_work"] == []
    assert d.decide(info(), node(), None, settings())["steady_work"] == ["labels"]
    assert d.decide(info(in_step=False), done, None, settings())["steady_work"] == ["restore"]
    marked = node({d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success"}, {"gpuops.mig/cordoned": "x"}, True)
    assert d.decide(info(), marked, None, settings())["steady_work"] == ["uncordon"]
    assert d.decide(info(), None, None, settings(kubernetes=False))["steady_work"] == []
    # Takeover: mig-manager is switched off even on a converged node.
    theirs = node({d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success", d.LABEL_MIG_MANAGER: "true"})
    out = d.decide(info(), theirs, d.operator_view([policy()], theirs), settings(operator_mode="takeover", strategy="single"))
    assert "switch off mig-manager" in out["steady_work"]


def test_a_node_with_no_layout_to_apply_is_left_alone():
    """A plan that leaves a node without MIG-capable GPUs as it is: mig_node_info read it without a layout."""
    unread = {"change": None, "wants_mig": None, "planned": None, "restore": None}
    out = d.decide(unread, node(), None, settings(source="gpuops_mig_plan"))
    assert out["path"] == "converged" and out["converged_labels"] == {} and out["steady_work"] == []
    assert out["persist"] is False and out["wants_mig"] is False and out["strategy"] == "mixed"
    assert out["summary"] == "gpu-1: the plan leaves this node as it is (no MIG layout for its GPUs): nothing to do."
    marked = node(annotations={"gpuops.mig/cordoned": "x"}, unschedulable=True)
    assert d.decide(unread, marked, None, settings(source="gpuops_mig_plan"))["steady_work"] == ["uncordon"]
    # Even where mig-manager runs: nothing is applied, so nothing is fought over.
    theirs = node({d.LABEL_MIG_MANAGER: "true"})
    assert d.decide(unread, theirs, d.operator_view([policy()], theirs), settings(source="gpuops_mig_plan"))["path"] == "converged"


@pytest.mark.parametrize("state, in_flight, finished", [
    ("pending", True, False), ("rebooting", True, False), ("success", False, True), ("failed", False, True),
    (None, False, False)])
def test_mig_manager_run_from_the_state_label(state, in_flight, finished):
    run = d.mig_manager_run(node({d.LABEL_STATE: state} if state else {}))
    assert run == {"state": state or "", "in_flight": in_flight, "finished": finished, "settled": not in_flight,
                   "restart_helps": state in ("pending", None), "paused_operands": {}}


def test_a_mig_manager_run_in_flight_is_in_the_decision():
    theirs = node({d.LABEL_MIG_MANAGER: "true", d.LABEL_STATE: "pending"})
    out = d.decide(info(geometry=True), theirs, d.operator_view([policy()], theirs), settings(source="configmap"))
    assert out["path"] == "mig-manager" and out["mig_manager_run"]["in_flight"] is True
    assert out["summary"].endswith("(applied by the GPU Operator's mig-manager), once its run in flight "
                                   "(nvidia.com/mig.config.state=pending) has ended.")
    mine = node({d.LABEL_MIG_MANAGER: "false", d.LABEL_STATE: "pending"})
    assert d.decide(info(geometry=True), mine, d.operator_view([policy()], mine), settings())["mig_manager_run"] is None


def lease(renewed, duration=20, holder="gpuops.mig run dead on ctl"):
    return {"metadata": {"name": "gpuops-mig-gpu-1", "resourceVersion": "7"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renewed,
                     "acquireTime": renewed}}


def test_a_converged_node_releases_a_lease_a_dead_run_left():
    old, fresh = "2020-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z"
    assert d.abandoned_lease(lease(old)) and not d.abandoned_lease(lease(fresh))
    assert not d.abandoned_lease(lease(old, holder="")) and not d.abandoned_lease(None)
    done = node({d.LABEL_CONFIG: "all-3g", d.LABEL_STATE: "success"})
    assert d.decide(info(), done, None, settings(lease=lease(old)))["steady_work"] == ["lease"]
    assert d.decide(info(), done, None, settings(lease=lease(fresh)))["steady_work"] == []   # a live rollout's
    assert d.left_alone(node(), {"present": False}, settings(lease=lease(old)))["steady_work"] == ["lease"]


def test_paused_operands_are_what_a_failed_run_left_paused():
    labels = {d.LABEL_DEPLOY + "device-plugin": d.PAUSED, d.LABEL_DEPLOY + "gpu-feature-discovery": "false",
              d.LABEL_DEPLOY + "dcgm": d.PAUSED, d.LABEL_DEPLOY + "client": d.PAUSED,
              d.LABEL_MIG_MANAGER: d.PAUSED, d.LABEL_DEPLOY + "driver": "true", "other": d.PAUSED}
    assert d.paused_operands(node(labels)) == {d.LABEL_DEPLOY + "client": "true", d.LABEL_DEPLOY + "dcgm": "true",
                                               d.LABEL_DEPLOY + "device-plugin": "true"}
    assert d.paused_operands(node()) == {}
    failed = d.mig_manager_run(node(dict(labels, **{d.LABEL_STATE: "failed"})))
    assert failed["paused_operands"] == d.paused_operands(node(labels))
    success = d.mig_manager_run(node(dict(labels, **{d.LABEL_STATE: "success"})))
    assert success["paused_operands"] == {}


@pytest.mark.parametrize("env, mode, reboots", [
    ([{"name": "WITH_REBOOT", "value": "true"}], True, True),
    ([{"name": "WITH_REBOOT", "value": "1"}], True, True),
    ([{"name": "WITH_REBOOT", "value": "true"}], False, False),    # geometry only: never a reboot
    ([{"name": "WITH_REBOOT", "value": "false"}], True, False),
    ([{"name": "WITH_REBOOT", "value": "yes"}], True, False),      # strconv.ParseBool refuses it
    ([], True, False)])
def test_with_reboot_extends_the_wait_only_for_a_mode_change(env, mode, reboots):
    with_env = policy()
    with_env["spec"]["migManager"]["env"] = env
    theirs = node({d.LABEL_MIG_MANAGER: "true"})
    out = d.decide(info(mode=mode, geometry=True), theirs, d.operator_view([with_env], theirs),
                   settings(source="configmap"))
    assert out["mig_manager_may_reboot"] is reboots
    rebooting = node({d.LABEL_MIG_MANAGER: "true", d.LABEL_STATE: "rebooting"})   # an earlier run's reboot
    assert d.decide(info(geometry=True), rebooting, d.operator_view([with_env], rebooting),
                    settings(source="configmap"))["mig_manager_may_reboot"] is True


def test_driving_mig_manager_checks_the_layout_in_the_config_it_reads():
    theirs = node({d.LABEL_MIG_MANAGER: "true"}, name="n7")
    default_install = d.operator_view([policy()], theirs)
    for ok in ({"configmap": "n7-mig-config", "configmap_explicit": True},
               {"configmap": "default-mig-parted-config", "configmap_explicit": False}):   # mig-manager's fallback
        assert d.decide(info(geometry=True), theirs, default_install,
                        settings(source="configmap", **ok))["path"] == "mig-manager"
    with pytest.raises(RefusedError, match="reads its MIG config from ConfigMap gpu-operator/n7-mig-config "
                                           "[(]generated by mig-manager .* not from default-mig-parted-config.*"
                                           "never put layouts there"):
        d.decide(info(geometry=True), theirs, default_install,
                 settings(source="configmap", configmap="default-mig-parted-config", configmap_explicit=True))
    named = d.operator_view([policy(config_name="fleet-mig")], theirs)
    with pytest.raises(RefusedError, match="from ConfigMap gpu-operator/fleet-mig [(]its migManager.config.name[)], "
                                           "not from mine"):
        d.decide(info(geometry=True), theirs, named,
                 settings(source="configmap", configmap="mine", configmap_explicit=True))
    # Taking over, any ConfigMap will do: our own modules apply it.
    assert d.decide(info(geometry=True), theirs, named, settings(
        source="configmap", configmap="mine", configmap_explicit=True, operator_mode="takeover"))["path"] == \
        "reconfigure"


@pytest.mark.parametrize("unit, wants_mig, mode_label, action", [
    ({"present": True, "enabled": True}, True, None, "disable"),
    ({"present": True, "enabled": False}, True, None, None),
    ({"present": False, "enabled": False}, True, None, None),
    ({"present": True, "enabled": False, "disabled_by_gpuops": True}, False, None, "enable"),    # the hand-back
    ({"present": True, "enabled": False, "disabled_by_gpuops": False}, False, None, None),       # not ours
    ({"present": True, "enabled": True}, True, "true", None)])                                  # mig-manager drives
def test_nvidia_host_mig_manager_is_switched_off_while_we_manage_the_node(unit, wants_mig, mode_label, action):
    labels = {d.LABEL_MIG_MANAGER: mode_label} if mode_label else {}
    theirs = node(labels)
    operator = d.operator_view([policy()], theirs) if mode_label else {"present": False}
    read = dict(info(geometry=True, wants_mig=wants_mig), host_mig_manager=unit)
    out = d.decide(read, theirs, operator, settings(source="configmap" if mode_label else "mig_node_layouts"))
    assert out["host_mig_manager"] == action
    assert out["switch_off_mig_manager"] is bool(action) and out["operator_mig_manager_off"] is False
    converged = d.decide(dict(info(wants_mig=wants_mig), host_mig_manager=unit), theirs, operator,
                         settings(source="configmap" if mode_label else "mig_node_layouts"))
    assert bool([w for w in converged["steady_work"] if "nvidia-mig-manager.service" in w]) is bool(action)


def test_a_failure_hint_for_a_config_name_the_mounted_configmap_may_not_have_yet():
    theirs = node({d.LABEL_MIG_MANAGER: "true"}, name="n7")
    named = d.decide(info(geometry=True), theirs, d.operator_view([policy(config_name="fleet-mig")], theirs),
                     settings(source="configmap"))
    assert "if 'all-3g' was added to ConfigMap gpu-operator/fleet-mig in the last minutes" in \
        named["mig_manager_failure_hint"]
    assert "--field-selector spec.nodeName=n7" in named["mig_manager_failure_hint"]
    # The generated config is read at the pod's start: no such delay.
    generated = d.decide(info(geometry=True), theirs, d.operator_view([policy()], theirs), settings(source="configmap"))
    assert generated["mig_manager_failure_hint"] == ""


def gpu_cluster(dynamic_mig=None):
    gates = {} if dynamic_mig is None else {"DynamicMIG": dynamic_mig}
    return {"metadata": {"name": "gpu-cluster"}, "status": {"namespace": "gpu-operator"},
            "spec": {"draDriver": {"featureGates": gates}}}


def test_a_gpu_cluster_node_gets_a_static_layout_applied_by_the_collection():
    view = d.operator_view([], node(), (), [gpu_cluster()])
    assert view["present"] is False
    assert view["gpu_cluster"] == {"name": "gpu-cluster", "namespace": "gpu-operator", "dynamic_mig": False}
    out = d.decide(info(geometry=True), node(), view, settings())
    assert out["path"] == "reconfigure" and out["operator_mode"] == "none" and out["persist"] is True
    assert "a static layout under the GPUCluster gpu-cluster, which runs no mig-manager" in out["summary"]
    with pytest.raises(RefusedError, match="GPUCluster gpu-cluster runs NVIDIA's DRA driver and no mig-manager"):
        d.decide(info(geometry=True), node(), view, settings(operator_mode="mig-manager"))
    with pytest.raises(RefusedError, match="GPUCluster gpu-cluster runs NVIDIA's DRA driver with its DynamicMIG"):
        d.decide(info(geometry=True), node(), d.operator_view([], node(), (), [gpu_cluster(True)]), settings())
    # A ClusterPolicy wins (the two may not coexist).
    assert d.operator_view([policy()], node(), (), [gpu_cluster()])["gpu_cluster"] is None


def test_a_gpu_cluster_nodes_dra_plugin_and_dcgm_are_paused_the_way_the_operator_assigns_them():
    """The GPUCluster's operands run where their nvidia.com/gpu.deploy.<component> label is "true"; the operator
    writes "true" only over an absent or empty label, so paused-for-mig-change holds while the GPUs change."""
    from ansible_collections.gpuops.mig.plugins.plugin_utils import _node_records as records
    out = d.decide(info(geometry=True), node(), d.operator_view([], node(), (), [gpu_cluster()]), settings())
    assert out["operand_components"] == ["dra-driver", "dcgm-dra", "dcgm-exporter-dra"]
    labels = {"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.dra-driver": "true",
              "nvidia.com/gpu.deploy.dra-validator": "true", "nvidia.com/gpu.deploy.dcgm-dra": "true",
              "nvidia.com/gpu.deploy.dcgm-exporter-dra": "true"}
    pause = records.clients_to_pause(labels, ["device-plugin", "dcgm"] + out["operand_components"],
                                     "nvidia.com/gpu.deploy.", "paused-for-mig-change")
    # The driver and the DRA validator hold no GPU: they run on.
    assert pause["operands"] == {"nvidia.com/gpu.deploy.dra-driver": "true", "nvidia.com/gpu.deploy.dcgm-dra": "true",
                                 "nvidia.com/gpu.deploy.dcgm-exporter-dra": "true"}
    # Without a GPUCluster (the ClusterPolicy stack, or no operator) nothing more is paused.
    for view in (d.operator_view([], node()), d.operator_view([policy()], node(), (), [gpu_cluster()])):
        assert d.decide(info(geometry=True), node(), view, settings(operator_mode="takeover")
                        )["operand_components"] == []
