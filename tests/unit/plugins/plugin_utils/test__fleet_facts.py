from ansible_collections.gpuops.mig.plugins.plugin_utils._fleet_facts import fleet_from_hostvars


def test_each_host_gets_its_facts_or_none():
    task_vars = {"hostvars": {"gpu-a": {"ansible_facts": {"gpuops_mig": {"gpus": []}}},
                              "gpu-b": {"ansible_facts": {}}},
                 "ansible_play_hosts_all": ["gpu-a", "gpu-b", "gpu-c"]}
    assert fleet_from_hostvars(task_vars, ["gpu-a", "gpu-c"]) == {"gpu-a": {"gpus": []}, "gpu-c": None}
    # Without hosts: every host of the play.
    assert fleet_from_hostvars(task_vars) == {"gpu-a": {"gpus": []}, "gpu-b": None, "gpu-c": None}
