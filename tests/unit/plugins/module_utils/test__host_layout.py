"""The geometry engine: what NVML reports becomes the planner's model, and plans apply."""

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as geometry
import gpuops_mig_sim as sim
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml

from layout_helpers import MODELS  # noqa: E402  (tables written from NVIDIA's MIG user guide)

SIM_KEYS = {
    "A100-40GB": "A100-SXM4-40GB", "A100-80GB": "A100-SXM4-80GB", "A30": "A30-24GB",
    "H100-80GB": "H100-SXM5-80GB", "H100-NVL": "H100-NVL", "H200": "H200", "B200": "B200",
}


@pytest.fixture
def nvml_host(tmp_path, monkeypatch):
    import pynvml

    def make(spec, **kwargs):
        path = str(tmp_path / "host.json")
        sim.create_state(path, spec, **kwargs)
        monkeypatch.setenv("GPUOPS_MIG_SIMULATE", path)
        pynvml.nvmlLib = None
        return path
    yield make
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()


def test_compute_instance_rule_matches_the_user_guide_table():
    # mig-facts.md section 1.11: instances per compute profile inside each GI size.
    expected = {1: {1: 1}, 2: {1: 2, 2: 1}, 3: {1: 3, 2: 1, 3: 1}, 4: {1: 4, 2: 2, 4: 1},
                7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1}}
    for g, counts in expected.items():
        profiles = geometry.derived_ci_profiles("%dg.Xgb" % g, g)
        assert {p.sm_slices: p.max_count for p in profiles} == counts
        full = [p for p in profiles if p.sm_slices == g][0]
        assert full.name == "%dg.Xgb" % g and full.placements == (0,)


@pytest.mark.parametrize("model", sorted(SIM_KEYS))
def test_geometry_read_through_pynvml_matches_the_documented_model(nvml_host, model):
    nvml_host("1x%s" % SIM_KEYS[model], mig="enabled")
    with Nvml() as nvml:
        read = geometry.read_geometry(nvml, 0)
    documented = MODELS[model]
    assert (read.memory_slices, read.sm_slices) == (documented.memory_slices, documented.sm_slices)

    def table(geo):
        return sorted((p.id, p.name, p.memory_slices, p.sm_slices, p.max_count, tuple(p.placements),
                       tuple((c.id, c.max_count, c.placements) for c in p.ci_profiles)) for p in geo.profiles)
    assert table(read) == table(documented)


def test_resolve_refuses_an_entry_that_selects_nothing(nvml_host):
    nvml_host("1xA100-SXM4-40GB")
    entries = geometry.load_entries(layouts=[{"gpus": "all", "device_filter": "0x233010DE", "devices": {}},
                                             {"gpus": "all", "devices": {"1g.5gb": 1}}])
    with Nvml() as nvml:
        resolution, _gpus = geometry.resolve(nvml, entries)
    assert len(resolution.unmatched) == 1 and len(resolution.targets) == 1   # a filter for another model is fine
    entries = geometry.load_entries(layouts=[{"gpus": "all", "device_filter": "0x233010DE", "devices": {}}])
    with Nvml() as nvml:
        with pytest.raises(geometry.migparted.ConfigError, match="no entry of the config selects a GPU"):
            geometry.resolve(nvml, entries)


def test_apply_refuses_a_plan_that_destroys_a_device_a_pod_holds():
    """A plan made with evict_pods (mig_node_info's) runs only once the pods are gone: nothing is touched."""
    import dataclasses
    from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError
    from ansible_collections.gpuops.mig.plugins.module_utils._gpu_layout import plan_gpu
    from layout_helpers import make_gi  # noqa: E402
    held = make_gi(MODELS["A100-40GB"], 1, "7g.40gb", 0)
    held = dataclasses.replace(held, compute_instances=(dataclasses.replace(held.compute_instances[0],
                                                                            pods=("ml/a/main",)),))
    item = geometry.GpuWork(target=None, gpu={"index": 0, "label": "GPU 0"}, mode=(1, 1))
    item.geometry = MODELS["A100-40GB"]
    item.plan = plan_gpu(item.geometry, [held], {"3g.20gb": 2}, evict_pods=True)
    with pytest.raises(RefusedError, match="Nothing was changed. GPU 0: MIG device MIG-1-0 is allocated to ml/a/main"):
        geometry.apply_host(None, [item])   # no NVML call is made


def test_a_pod_on_two_gpus_is_evicted_once_for_the_node(nvml_host):
    """Issue 33: a node of two H100s, pod ml/p holds a 3g.40gb on each GPU, ml/q the other
    3g.40gb of GPU 1. GPU 0 becomes one 7g.80gb (ml/p goes), GPU 1 a 3g.40gb and a 2g.20gb: one
    of its 3g.40gb goes, equal for GPU 1 alone. The node's plan takes ml/p's, which goes anyway:
    one pod evicted, not two."""
    nvml_host("2xH100-SXM5-80GB", mig="enabled")
    with Nvml() as nvml:
        for index in (0, 1):
            for start in (0, 4):
                gi = nvml.create_gpu_instance(index, 9, start, 4)
                nvml.create_compute_instance(index, gi, 2, 0)
        uuids = dict(((index, gi["placement"]["start"]),
                      gi["compute_instances"][0]["mig_device_uuid"])
                     for index in (0, 1) for gi in nvml.layout(index))
        holders = {uuids[(0, 0)]: ("ml/p/main",), uuids[(1, 0)]: ("ml/p/main",),
                   uuids[(1, 4)]: ("ml/q/main",)}
        entries = geometry.load_entries(layouts=[
            {"gpus": [0], "devices": {"7g.80gb": 1}},
            {"gpus": [1], "devices": {"3g.40gb": 1, "2g.20gb": 1}}])
        resolution, gpus = geometry.resolve(nvml, entries)
        work = geometry.plan_host(nvml, resolution, gpus, check_mode=True, evict_pods=True,
                                  holders=holders)
    from ansible_collections.gpuops.mig.plugins.module_utils._evictions import host_evictions
    evicted = host_evictions(work, {"gpus": []})
    assert [p.pod for p in evicted.pods] == ["ml/p"]
    counts = [dict(geometry.layout.device_counts(item.geometry, item.plan.result))
              for item in work]
    assert counts == [{"7g.80gb": 1}, {"3g.40gb": 1, "2g.20gb": 1}]


def test_a_refusal_says_as_data_which_pods_hold_the_devices_in_the_way(nvml_host):
    """Issue 33, item 4: a plan that must destroy a device a pod holds is refused before any
    change, and the refusal (RefusedError.details, mig_config's refusals) names the GPU, the device
    and its pod with reason allocated; a device with processes of no pod is reason other."""
    from ansible_collections.gpuops.mig.plugins.module_utils._errors import RefusedError

    path = nvml_host("2xH100-SXM5-80GB", mig="enabled")
    with Nvml() as nvml:
        for index in (0, 1):
            gi = nvml.create_gpu_instance(index, 9, 0, 4)
            nvml.create_compute_instance(index, gi, 2, 0)
        uuid = nvml.layout(0)[0]["compute_instances"][0]["mig_device_uuid"]
        sim.add_process(path, 1, pid=4242, gi=nvml.layout(1)[0]["id"], ci=0)
        entries = geometry.load_entries(layouts=[{"gpus": "all", "devices": {"7g.80gb": 1}}])
        resolution, gpus = geometry.resolve(nvml, entries)
        with pytest.raises(RefusedError) as refused:
            geometry.plan_host(nvml, resolution, gpus, holders={uuid: ("ml/late/main",)})
    assert str(refused.value).startswith("Nothing was changed.")
    by_gpu = dict((r["gpu"], r) for r in refused.value.details["refusals"])
    assert by_gpu[0]["reason"] == "allocated" and by_gpu[1]["reason"] == "other"
    assert [(d["uuid"], d["device"], d["pods"]) for d in by_gpu[0]["devices"]] == [
        (uuid, "3g.40gb", ["ml/late/main"])]
    assert by_gpu[1]["devices"] == [] and "4242" in by_gpu[1]["message"]
