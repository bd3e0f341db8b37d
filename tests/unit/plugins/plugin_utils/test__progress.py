from ansible_collections.gpuops.mig.plugins.plugin_utils import _progress as progress


def test_only_the_node_workflows_steps_are_named():
    assert progress.node_step("/x/roles/mig_node/tasks/geometry.yml") == "MIG geometry"
    assert progress.node_step("drain.yml") == "cordon and drain"
    for bookkeeping in ("labels.yml", "report.yml", "preview.yml", "", None):
        assert progress.node_step(bookkeeping) is None


def test_every_named_step_is_a_task_file_of_the_role():
    import os
    tasks = os.path.join(os.path.dirname(progress.__file__), "..", "..", "roles", "mig_node", "tasks")
    assert set(progress.NODE_STEPS) <= set(os.listdir(tasks))


def test_a_message_becomes_lines():
    assert progress.message_lines(["a", "b\nc", ""]) == ["a", "b", "c"]
    assert progress.message_lines("one\n\ntwo  ") == ["one", "two"]
    assert progress.message_lines(3) == ["3"]


def test_the_tally_names_the_hosts_that_failed():
    lines = progress.tally({"a": {"changed": 2}, "b": {"failures": 1}, "c": {"unreachable": 1}, "d": {}})
    assert lines == ["4 node(s): 1 changed, 1 failed, 1 unreachable", "  failed: b", "  unreachable: c"]
    assert progress.tally({}) == ["0 node(s): 0 changed, 0 failed, 0 unreachable"]


def test_the_controller_is_no_node_unless_it_failed():
    nodes = {"a": {"changed": 1}, "b": {"changed": 1}, "c": {"changed": 1}}
    lines = progress.tally(dict(nodes, localhost={"changed": 1}))
    assert lines == ["3 node(s): 3 changed, 0 failed, 0 unreachable"]
    lines = progress.tally(dict(nodes, localhost={"failures": 1}))
    assert lines == ["3 node(s): 3 changed, 1 failed, 0 unreachable", "  failed: localhost"]


def test_a_failure_is_one_line_with_its_message():
    line = progress.failure_line("node-a", "Apply the MIG geometry", {"msg": "GPU 0:\n  busy."})
    assert line == "FAILED node-a: Apply the MIG geometry: GPU 0: busy."
    loop = {"results": [{"failed": False}, {"failed": True, "msg": "item two broke"}]}
    assert progress.failure_line("h", "t", loop).endswith(": item two broke")
    assert "run with -v" in progress.failure_line("h", "t", {})
