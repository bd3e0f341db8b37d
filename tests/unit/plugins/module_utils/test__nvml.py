"""The NVML adapter: naming, error wording, reset parsing, and simulator isolation."""

import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _nvml

GIB = 1024 ** 3


@pytest.mark.parametrize("profile_mib, total_mib, expected", [
    (4864, 40960, 5),        # A100-40GB 1g.5gb
    (9856, 40960, 10),       # A100-40GB 2g.10gb
    (19968, 40960, 20),      # A100-40GB 3g.20gb
    (40192, 40960, 40),      # A100-40GB 7g.40gb
    (5836, 24576, 6),        # A30 1g.6gb
    (16384, 143771, 18),     # H200 1g.18gb (17.6 rounds up)
    (71168, 143771, 71),     # H200 3g.71gb (70.5 rounds half up, not to even)
    (22528, 183359, 23),     # B200 1g.23gb (22.5 rounds half up)
])
def test_profile_memory_name_matches_nvidia_tools(profile_mib, total_mib, expected):
    assert _nvml.mig_profile_memory_gb(profile_mib, total_mib * 1024 * 1024) == expected


def test_profile_and_device_names():
    assert _nvml.gi_profile_name(7, 1, 4864, 40960 * 1024 * 1024) == "1g.5gb+me"
    assert _nvml.gi_profile_name(9, 1, 9856, 40960 * 1024 * 1024) == "1g.10gb"
    assert _nvml.mig_device_name(3, 3, "3g.20gb") == "3g.20gb"   # _gpu_layout's, the one naming rule
    assert _nvml.mig_device_name(1, 3, "3g.20gb") == "1c.3g.20gb"


@pytest.mark.parametrize("text, reason", [
    ("Unable to reset GPU 00000000:07:00.0: In use by another client", "in_use"),
    ("Unable to reset GPU 00000000:07:00.0 because it's being used by some other process", "in_use"),
    ("Unable to reset GPU 00000000:07:00.0: Not Supported", "not_supported"),
    ("GPU Reset couldn't run because GPU 00000000:07:00.0 is the primary GPU.", "primary"),
    ("Unable to reset GPU 00000000:07:00.0: Unknown Error", "other"),
])
def test_reset_refusals_are_classified(text, reason):
    assert _nvml.classify_reset_failure(text) == reason
    assert reason in _nvml.RESET_HINTS


def test_reset_runs_nvidia_smi_per_gpu_and_reads_its_answer():
    calls = []

    def run(argv, env=None):
        calls.append(argv)
        if argv[-1] == "00000000:07:00.0":
            return 0, "GPU 00000000:07:00.0 was successfully reset.\n", ""
        return 255, "", "Unable to reset GPU 00000000:0F:00.0: In use by another client\n"

    out = _nvml.reset_gpus(["00000000:07:00.0", "00000000:0F:00.0"], run, ("/usr/bin/nvidia-smi", None))
    assert calls == [["/usr/bin/nvidia-smi", "-r", "-i", "00000000:07:00.0"],
                     ["/usr/bin/nvidia-smi", "-r", "-i", "00000000:0F:00.0"]]
    assert out["00000000:07:00.0"][:2] == (True, None)
    assert out["00000000:0F:00.0"][:2] == (False, "in_use")


def test_reset_through_the_simulated_nvidia_smi(tmp_path):
    import gpuops_mig_sim as sim
    state = str(tmp_path / "h.json")
    sim.create_state(state, "1xA100-SXM4-40GB")
    sim.set_host(state, passthrough=True)
    smi = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "simulator", "bin", "nvidia-smi")

    def run(argv, env=None):
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, GPUOPS_MIG_SIMULATE=state), check=False)
        return p.returncode, p.stdout, p.stderr

    out = _nvml.reset_gpus(["00000000:07:00.0"], run, (smi, None))
    assert out["00000000:07:00.0"][:2] == (False, "not_supported")


def test_nvml_errors_read_as_sentences_and_go_by_pynvml_names():
    assert "permission denied" in _nvml.nvml_reason(4)
    assert "in use by another client" in _nvml.nvml_reason(19)
    assert _nvml.nvml_reason(4242) == "NVML error 4242"
    assert _nvml.error_name(19) == "NVML_ERROR_IN_USE" and _nvml.error_name(4242) is None


def test_a_reset_whose_nvidia_smi_cannot_run_is_reported_not_raised():
    def run(argv, env=None):
        raise OSError(2, "No such file or directory")

    out = _nvml.reset_gpus(["00000000:07:00.0"], run, ("/nope/nvidia-smi", None))
    assert out["00000000:07:00.0"] == (False, "cannot_run", "/nope/nvidia-smi could not run: No such file or directory")
    assert "cannot_run" in _nvml.RESET_HINTS


def test_simulator_is_not_loaded_without_the_variable():
    code = (
        "import sys\n"
        "from ansible_collections.gpuops.mig.plugins.module_utils import _nvml\n"
        "try:\n"
        "    _nvml.Nvml().__enter__()\n"
        "except _nvml.DriverNotFound as e:\n"
        "    print('driver:', e)\n"
        "print('sim loaded:', any('gpuops_mig_sim' in m for m in sys.modules))\n"
    )
    env = dict(os.environ)
    env.pop("GPUOPS_MIG_SIMULATE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "driver: libnvidia-ml.so.1 is neither on the host's library path nor under a driver root " \
           "(tried /run/nvidia/driver (no libnvidia-ml.so.1 in /, /usr/lib64," in out
    assert "sim loaded: False" in out


def test_missing_pynvml_is_its_own_error(monkeypatch):
    monkeypatch.setattr(_nvml, "HAS_PYNVML", False)
    with pytest.raises(_nvml.MissingLibrary):
        _nvml.Nvml().__enter__()


def test_terminate_processes_ends_real_processes():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _nvml.pid_alive(proc.pid)
        assert _nvml.terminate_processes([proc.pid], timeout=5) == []
        assert not _nvml.pid_alive(proc.pid)   # a zombie counts as gone
    finally:
        proc.kill()
        proc.wait()


# -- where the driver is --------------------------------------------------------------------------

class Opener(object):
    """ctypes.CDLL's part in find_driver: a library loads when its path is in `loadable`."""

    def __init__(self, *loadable):
        self.loadable = loadable
        self.tried = []

    def __call__(self, path):
        self.tried.append(path)
        if path not in self.loadable:
            raise OSError("%s: cannot open shared object file: No such file or directory" % path)
        return "handle of %s" % path


def driver_root(base, libdir="usr/lib64", smidir="usr/bin", link=None):
    """A driver root laid out as a driver image has it; link makes libnvidia-ml.so.1 a link to it."""
    lib = base / libdir
    lib.mkdir(parents=True)
    if link:
        (lib / "libnvidia-ml.so.580.95.05").write_text("lib")
        os.symlink(link, str(lib / "libnvidia-ml.so.1"))
    else:
        (lib / "libnvidia-ml.so.1").write_text("lib")
    (base / smidir).mkdir(parents=True)
    (base / smidir / "nvidia-smi").write_text("smi")
    return base


def test_the_hosts_own_driver_comes_first(tmp_path):
    driver_root(tmp_path / "run" / "nvidia" / "driver")
    opener = Opener("libnvidia-ml.so.1")
    driver, handle = _nvml.find_driver("auto", opener, host_root=str(tmp_path))
    assert driver.root is None and handle == "handle of libnvidia-ml.so.1" and opener.tried == ["libnvidia-ml.so.1"]
    assert driver.smi_command("nvidia-smi") == ("nvidia-smi", {})


def test_without_a_host_driver_the_operators_driver_root_is_found(tmp_path):
    root = driver_root(tmp_path / "run" / "nvidia" / "driver", libdir="usr/lib/x86_64-linux-gnu",
                       link="/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05")   # absolute: inside the root
    library = str(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05")
    driver, handle = _nvml.find_driver(None, Opener(library), host_root=str(tmp_path))
    assert driver.root == str(root) and driver.library == library and handle == "handle of " + library
    # nvidia-smi runs inside that root the way the operator's validator runs it.
    assert driver.smi_command("nvidia-smi") == (str(root / "usr/bin/nvidia-smi"), {"LD_PRELOAD": library})
    assert driver.smi_command("/opt/bin/nvidia-smi") == ("/opt/bin/nvidia-smi", {"LD_PRELOAD": library})


def test_the_validators_driver_ready_file_names_the_root(tmp_path):
    root = driver_root(tmp_path / "srv" / "nvidia-driver")
    driver_root(tmp_path / "run" / "nvidia" / "driver")          # the default root exists too, but comes second
    ready = tmp_path / "run" / "nvidia" / "validations"
    ready.mkdir(parents=True)
    (ready / "driver-ready").write_text("IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/srv/nvidia-driver\n")
    library = str(root / "usr/lib64/libnvidia-ml.so.1")
    driver, _handle = _nvml.find_driver("auto", Opener(library), host_root=str(tmp_path))
    assert driver.root == str(root)
    (ready / "driver-ready").write_text("IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\n")
    assert _nvml.driver_root_candidates(str(tmp_path)) == [str(tmp_path / "run" / "nvidia" / "driver")]


def test_no_driver_anywhere_names_every_place_tried(tmp_path):
    with pytest.raises(_nvml.DriverNotFound) as e:
        _nvml.find_driver("auto", Opener(), host_root=str(tmp_path))
    assert "libnvidia-ml.so.1 is neither on the host's library path nor under a driver root (tried %s (no " \
           "libnvidia-ml.so.1 in /, /usr/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu, /lib64, " \
           "/lib/x86_64-linux-gnu, /lib/aarch64-linux-gnu))" % (tmp_path / "run/nvidia/driver") in str(e.value)
    assert e.value.name == "NVML_ERROR_LIBRARY_NOT_FOUND"


def test_an_explicit_driver_root_must_hold_the_driver(tmp_path):
    empty = tmp_path / "driver"
    empty.mkdir()
    with pytest.raises(_nvml.DriverNotFound) as e:
        _nvml.find_driver(str(empty), Opener(), host_root=str(tmp_path))
    assert str(e.value).startswith("the driver root %s holds no NVIDIA driver: no libnvidia-ml.so.1 in /, /usr/lib64"
                                   % empty)
    with pytest.raises(_nvml.DriverNotFound) as e:
        _nvml.find_driver("/", Opener(), host_root=str(tmp_path))
    assert "libnvidia-ml.so.1 is not on the host's library path" in str(e.value)


def test_a_simulated_driver_container_is_found_and_its_nvidia_smi_runs_inside_it(tmp_path, monkeypatch):
    import gpuops_mig_sim as sim
    state = str(tmp_path / "host.json")
    sim.create_state(state, "1xA30-24GB")
    root = str(tmp_path / "run" / "nvidia" / "driver")
    sim.set_host(state, driver_root=root)
    monkeypatch.setenv("GPUOPS_MIG_SIMULATE", state)
    with pytest.raises(_nvml.DriverNotFound) as e:   # the host itself has no library
        _nvml.Nvml(driver_root="/").__enter__()
    assert "not on the host's library path" in str(e.value)
    with _nvml.Nvml(driver_root=root) as nvml:
        assert nvml.driver.root == root
        assert nvml.driver.library == os.path.join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.124.06")
        assert nvml.gpu(0)["name"] == "NVIDIA A30"
        smi = nvml.driver.smi_command()

    def run(argv, env=None):
        p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **(env or {})), check=False)
        return p.returncode, p.stdout, p.stderr

    assert smi == (os.path.join(root, "usr/bin/nvidia-smi"), {"LD_PRELOAD": nvml.driver.library})
    assert _nvml.reset_gpus(["00000000:07:00.0"], run, smi)["00000000:07:00.0"][:2] == (True, None)
    # Without the root's library preloaded, that nvidia-smi cannot start (as the real one).
    failed = _nvml.reset_gpus(["00000000:07:00.0"], run, (smi[0], None))["00000000:07:00.0"]
    assert failed[0] is False and "cannot load libnvidia-ml.so.1" in failed[2]


@pytest.mark.parametrize("value", ["", "   ", None])
def test_an_empty_driver_root_is_refused_not_read_as_auto(tmp_path, value):
    if value is None:   # no setting at all (the engine's own callers) is auto
        assert _nvml.check_driver_root(None) == "auto"
        return
    with pytest.raises(_nvml.RefusedError) as e:
        _nvml.find_driver(value, Opener("libnvidia-ml.so.1"), host_root=str(tmp_path))
    assert str(e.value) == "driver_root is empty; use auto, / or the driver's root directory"


def executable(path, mode=0o755):
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return str(path)


def test_a_program_option_takes_one_program_without_a_shell(tmp_path, monkeypatch):
    tool = executable(tmp_path / "nvidia-smi")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _nvml.check_program("nvidia-smi", "nvidia_smi") == "nvidia-smi"
    assert _nvml.find_program("nvidia-smi", "nvidia_smi") == tool
    assert _nvml.find_program(tool, "nvidia_smi") == tool
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    other = executable(sbin / "other-smi")
    assert _nvml.find_program("other-smi", "nvidia_smi", directories=(str(sbin),)) == other


@pytest.mark.parametrize("value, problem", [
    ("nvidia-smi; touch X", "'nvidia-smi; touch X' has shell syntax (';')"),
    ("nvidia-smi && reboot", "has shell syntax ('&')"),
    ("nvidia-smi > /etc/passwd", "has shell syntax ('>')"),
    ("a\nb", "has shell syntax ('\\n')"),
    ("nvidia-smi -r", "'nvidia-smi -r' has spaces or arguments"),
    (" nvidia-smi", "has spaces or arguments"),
    ("./nvidia-smi", "'./nvidia-smi' is a relative path"),
    ("", "nvidia_smi is empty"),
    (None, "nvidia_smi is empty"),
])
def test_a_program_option_with_shell_syntax_arguments_or_a_relative_path_is_refused(value, problem):
    with pytest.raises(_nvml.RefusedError) as e:
        _nvml.check_program(value, "nvidia_smi")
    assert problem in str(e.value)
    assert str(e.value).endswith("nvidia_smi takes a single program path (a name looked up in PATH, or an absolute "
                                 "path), run without a shell")


def test_a_program_that_is_not_there_or_not_executable_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(_nvml.RefusedError) as e:
        _nvml.find_program("nvidia-smi", "nvidia_smi", directories=("/nonexistent",))
    assert str(e.value) == "nvidia_smi: no executable nvidia-smi in PATH or /nonexistent"
    plain = executable(tmp_path / "plain", mode=0o644)
    for value in (plain, str(tmp_path)):   # not executable; a directory
        with pytest.raises(_nvml.RefusedError) as e:
            _nvml.find_program(value, "nvidia_smi")
        assert str(e.value) == "nvidia_smi: %s is not an executable file" % value


def test_a_command_line_option_takes_arguments_but_no_shell_syntax():
    assert _nvml.check_command_line("nvidia-ctk --version", "cmd") == "nvidia-ctk --version"
    with pytest.raises(_nvml.RefusedError) as e:
        _nvml.check_command_line("nvidia-ctk --version | head -1", "cmd")
    assert str(e.value) == ("cmd: 'nvidia-ctk --version | head -1' has shell syntax ('|'); it takes a program and "
                            "its arguments, run without a shell")


def process_gone(pid, seconds=10.0):
    """Whether the process ended (gone, or a zombie) within ``seconds``: a SIGKILL takes effect
    when the process next runs, which on a loaded machine may be a moment later."""
    import time
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open("/proc/%s/stat" % pid) as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_program_that_runs_past_its_timeout_is_killed_with_its_process_group(tmp_path):
    """Every program the modules run has a timeout (issue 36); the children it started die with
    it."""
    pids = tmp_path / "pids"
    script = "sleep 600 & echo $! > %s; wait" % pids
    with pytest.raises(_nvml.ProgramTimedOut) as raised:
        _nvml.run_program(["/bin/sh", "-c", script], timeout=0.5)
    assert isinstance(raised.value, TimeoutError) and isinstance(raised.value, OSError)
    assert str(raised.value) == ("/bin/sh -c %s did not finish within 0.5 s and was stopped "
                                 "(SIGKILL)" % script)
    assert raised.value.ended is True
    assert process_gone(pids.read_text().strip())
    script = "echo out; echo err >&2; exit 3"
    assert _nvml.run_program(["/bin/sh", "-c", script], {"X": "1"}, 5) == (3, "out\n", "err\n")
    assert _nvml.timed_run(5)(["/bin/sh", "-c", "echo $X"], {"X": "y"}) == (0, "y\n", "")
    with pytest.raises(OSError):
        _nvml.run_program(["/nonexistent/nvidia-smi"])


def test_a_reset_that_times_out_is_reported_and_the_gpus_after_it_are_not_tried():
    calls = []

    def run(argv, env=None):
        calls.append(argv[-1])
        raise _nvml.ProgramTimedOut(argv, 120, 4242, False)

    smi = ("/usr/bin/nvidia-smi", None)
    out = _nvml.reset_gpus(["00000000:07:00.0", "00000000:0F:00.0"], run, smi)
    assert calls == ["00000000:07:00.0"]
    assert out["00000000:07:00.0"] == (False, "timed_out",
                                       "/usr/bin/nvidia-smi -r -i 00000000:07:00.0 did not finish "
                                       "within 120 s and did not end when killed (PID 4242 is left)")
    assert out["00000000:0F:00.0"] == (False, "not_tried",
                                       "not tried: the reset of 00000000:07:00.0 timed out first")
    assert "timed_out" in _nvml.RESET_HINTS and "not_tried" in _nvml.RESET_HINTS
