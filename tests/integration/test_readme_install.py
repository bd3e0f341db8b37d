"""The README's install commands, as written, in a new virtual environment that holds only what the README
says must come first (ansible-core): the Python packages, then the install without Galaxy, which must leave
gpuops.mig and kubernetes.core in the -p path. The blocks that need Galaxy (an install from requirements.yml,
a download of kubernetes.core) are not run. Then the README's first run on a simulated host
("Trying it without a GPU"): its inventory and its playbook commands, as written, on the
installed collection.

pip uses its own configuration (index, find-links) and the user's pip cache, plus the `ansible` wheel that
scripts/setup.sh downloaded (.build/downloads) when it is there, so the test runs without network once the
wheels are cached. About two minutes, most of it pip unpacking the `ansible` package.
"""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DEV_BIN = os.path.dirname(sys.executable)
# The ansible-core the collection is tested with (requirements-dev.txt): "ansible-core 2.16 or later".
with open(os.path.join(REPO, "requirements-dev.txt")) as _handle:
    ANSIBLE_CORE = re.search(r"^ansible-core==\S+", _handle.read(), re.MULTILINE).group(0)

pytestmark = pytest.mark.playbook


def install_blocks(readme):
    """The bash blocks of the README's "Install" section, each marked whether it needs Galaxy."""
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [(block, bool(re.search(r"ansible-galaxy collection (install(?![^\n]*--offline)|download)", block)))
            for block in blocks]


def simulated_first_run(readme):
    """The inventory (YAML) and the playbook commands of the README's "Trying it without a GPU"."""
    section = readme.split("\n## Trying it without a GPU\n", 1)[1].split("\n## ", 1)[0]
    inventories = re.findall(r"```yaml\n# inventory.yml\n(.*?)```", section, re.DOTALL)
    blocks = [block for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
              if "ansible-playbook" in block]
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return inventories, [line for line in lines if line]


def first_run_config(readme):
    """The ansible.cfg of the README's "First run"."""
    section = readme.split("\n## First run\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```ini\n# ansible.cfg\n(.*?)```", section, re.DOTALL)[0]


def test_simulated_first_run_is_found():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    inventories, commands = simulated_first_run(readme)
    assert len(inventories) == 1 and "gpuops_mig_simulate:" in inventories[0]
    assert "stdout_callback = gpuops.mig.rollout" in first_run_config(readme)
    assert commands == ["ansible-playbook -i inventory.yml gpuops.mig.facts"] + \
        ["ansible-playbook -i inventory.yml gpuops.mig.site"] * 2


def test_install_blocks_are_found():
    with open(os.path.join(REPO, "README.md")) as handle:
        blocks = install_blocks(handle.read())
    assert [needs_galaxy for dummy, needs_galaxy in blocks] == [False, True, False, True]
    assert "--offline" in blocks[2][0] and "-r requirements.yml" in blocks[1][0]


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kw)
    assert proc.returncode == 0, "%s\n%s\n%s" % (cmd, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def test_readme_install_commands_run_as_written(tmp_path):
    with open(os.path.join(REPO, "README.md")) as handle:
        blocks = install_blocks(handle.read())
    venv, home, work = tmp_path / "venv", tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = dict((k, v) for k, v in os.environ.items()
               if not k.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV", "K8S_AUTH_",
                                    "XDG_CACHE_HOME")))
    env.update(HOME=str(home), VIRTUAL_ENV=str(venv), PATH=str(venv / "bin") + os.pathsep + env.get("PATH", ""),
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR") or os.path.expanduser("~/.cache/pip"),
               PIP_NO_COMPILE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    downloads = os.path.join(REPO, ".build", "downloads")
    if os.path.isdir(downloads):
        env["PIP_FIND_LINKS"] = " ".join(filter(None, [env.get("PIP_FIND_LINKS"), downloads]))

    # What the README says must be there first: a Python with ansible-core.
    run(["python3", "-m", "venv", str(venv)], env=env)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", ANSIBLE_CORE], env=env)
    # The tarball, as a source checkout builds it (the README: ansible-galaxy collection build).
    run([os.path.join(DEV_BIN, "ansible-galaxy"), "collection", "build", REPO, "--output-path", str(work)],
        env=dict(env, PATH=DEV_BIN + os.pathsep + env["PATH"]))

    for block, needs_galaxy in blocks:
        if not needs_galaxy:
            run(["bash", "-euo", "pipefail", "-c", block], cwd=str(work), env=env)

    collections = home / ".ansible" / "collections"
    listed = run([str(venv / "bin" / "ansible-galaxy"), "collection", "list", "-p", str(collections),
                  "--format", "json"], env=env).stdout
    installed = json.loads(listed).get(str(collections / "ansible_collections"), {})
    assert sorted(installed) == ["gpuops.mig", "kubernetes.core"], listed
    assert installed["kubernetes.core"]["version"].startswith("6.")
    # Both found in -p alone (not through the `ansible` package on the Python path).
    only_p = dict(env, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    doc = run([str(venv / "bin" / "ansible-doc"), "-t", "module", "gpuops.mig.mig_facts", "kubernetes.core.k8s_info"],
              env=only_p).stdout
    assert "gpuops.mig.mig_facts" in doc and "kubernetes.core.k8s_info" in doc
    run([str(venv / "bin" / "python"), "-c", "import kubernetes, yaml, jsonpatch, pynvml"], env=env)

    # "Trying it without a GPU": the first run on a simulated host, from the installed collection.
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    inventories, commands = simulated_first_run(readme)
    (work / "inventory.yml").write_text(inventories[0])
    (work / "ansible.cfg").write_text(first_run_config(readme))
    facts, first, again = [run(["bash", "-euo", "pipefail", "-c", command], cwd=str(work),
                               env=env).stdout for command in commands]
    assert re.search(r"sim-01 +0 +NVIDIA H100 80GB HBM3 +disabled", facts), facts
    assert re.search(r"sim-01 +changed +reconfigure ", first), first[-3000:]
    # The collection's callback (First run's ansible.cfg): no task banners, a closing count.
    assert "TASK [" not in first + again, first[-3000:]
    assert "-- 1 node(s): 0 changed, 0 failed, 0 unreachable" in again, again[-3000:]
    assert "Batch 1" not in again, again[-3000:]
    # Everything the run wrote on the simulated host is under its root in the cache.
    state = home / ".cache" / "gpuops-mig" / "simulated" / "sim-01" / "2xH100-SXM5-80GB.json"
    units = state.parent / "2xH100-SXM5-80GB" / "etc" / "systemd" / "system"
    assert (units / "gpuops-mig-restore.service").is_file()
    mig_sim = collections / "ansible_collections" / "gpuops" / "mig" / "tools" / "mig-sim"
    shown = run([str(venv / "bin" / "python"), str(mig_sim), "show", str(state)], env=env).stdout
    assert shown.count("3g.40gb (profile id 9)") == 4, shown
