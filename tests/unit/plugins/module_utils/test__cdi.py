"""The CDI spec refresh (plugins/module_utils/_cdi.py)."""

import os
import stat

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _cdi as cdi


def generator(text, rc=0, calls=None):
    """A stand-in for `nvidia-ctk cdi generate --output=PATH` writing ``text``."""
    def run(argv, env=None):
        if calls is not None:
            calls.append(argv)
        output = argv[-1].split("=", 1)[1]
        if rc == 0:
            with open(output, "w") as handle:
                handle.write(text)
        return rc, "", "" if rc == 0 else "failed to initialize NVML: Unknown Error"
    return run


def test_the_first_existing_spec_is_the_one_in_use(tmp_path):
    second = tmp_path / "run" / "nvidia.yaml"
    second.parent.mkdir()
    second.write_text("x")
    paths = [str(tmp_path / "etc" / "nvidia.yaml"), str(second)]
    assert cdi.spec_in_use(paths) == str(second)
    assert cdi.spec_in_use(paths[:1]) is None


def test_replaced_only_when_it_differs_keeping_its_mode(tmp_path):
    spec = tmp_path / "nvidia.yaml"
    spec.write_text("old devices\n")
    os.chmod(spec, 0o640)
    calls = []
    assert cdi.refresh(str(spec), generator("new devices\n", calls=calls), check_mode=True) is True
    assert spec.read_text() == "old devices\n"
    assert cdi.refresh(str(spec), generator("new devices\n", calls=calls)) is True
    assert spec.read_text() == "new devices\n" and stat.S_IMODE(os.stat(spec).st_mode) == 0o640
    assert cdi.refresh(str(spec), generator("new devices\n", calls=calls)) is False
    # Generated elsewhere, with the spec's name (its extension picks the format), never beside the spec.
    generated = calls[0][-1].split("=", 1)[1]
    assert calls[0][:3] == ["nvidia-ctk", "cdi", "generate"] and os.path.basename(generated) == "nvidia.yaml"
    assert os.path.dirname(generated) != str(tmp_path) and not os.path.exists(os.path.dirname(generated))
    assert sorted(os.listdir(tmp_path)) == ["nvidia.yaml"]


def test_a_failure_leaves_the_spec_as_it_is(tmp_path):
    spec = tmp_path / "nvidia.yaml"
    spec.write_text("old\n")
    with pytest.raises(cdi.CdiError, match="nvidia-ctk cdi generate failed .exit status 1.: failed to initialize "
                                           "NVML: Unknown Error. The CDI spec .* was left as it is"):
        cdi.refresh(str(spec), generator("", rc=1))

    def missing(argv, env=None):
        raise OSError(2, "No such file or directory")
    with pytest.raises(cdi.CdiError, match="nvidia-ctk cannot run"):
        cdi.refresh(str(spec), missing)
    assert spec.read_text() == "old\n" and os.listdir(tmp_path) == ["nvidia.yaml"]


def test_a_generate_that_times_out_leaves_the_spec_as_it_is(tmp_path):
    from ansible_collections.gpuops.mig.plugins.module_utils._nvml import ProgramTimedOut

    spec = tmp_path / "nvidia.yaml"
    spec.write_text("old\n")

    def hangs(argv, env=None):
        raise ProgramTimedOut(argv, 120, 4242, True)
    with pytest.raises(cdi.CdiError, match=r"^nvidia-ctk cdi generate --output=\S+ did not finish "
                                           r"within 120 s and was stopped \(SIGKILL\)\. The CDI "
                                           r"spec .* was left as it is\.$"):
        cdi.refresh(str(spec), hangs)
    assert spec.read_text() == "old\n"


@pytest.mark.parametrize("root", ["", None, "/"])
def test_the_spec_paths_of_the_hosts_own_root_are_the_defaults(root):
    assert cdi.spec_paths(root) == ["/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml"]


@pytest.mark.parametrize("root", ["/srv/h1", "/srv/h1/"])
def test_a_simulated_hosts_spec_paths_are_under_its_root(root):
    assert cdi.spec_paths(root) == ["/srv/h1/etc/cdi/nvidia.yaml",
                                    "/srv/h1/var/run/cdi/nvidia.yaml"]
    assert cdi.spec_paths(root, ["/x.yaml"]) == ["/srv/h1/x.yaml"]
