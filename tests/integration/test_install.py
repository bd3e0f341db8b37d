"""The collection as a user installs it: build the tarball, install it offline into a clean
collections path together with kubernetes.core, then run ansible-doc and a playbook from the
installed copy (docs/install.md, "Offline").

kubernetes.core comes from an already installed copy, as it does for a user whose `ansible`
package (PyPI) holds it: ansible-galaxy installs it from that directory and checks it against the
range in galaxy.yml, with --offline (no Galaxy). Only the clean path is searched for collections.
"""

import glob
import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.playbook

# Parts that develop or test the collection and must not ship (galaxy.yml build_ignore).
NOT_SHIPPED = ("tests/", "bench/", "extensions/molecule/", "scripts/", "examples/",
               ".ci/", ".build/", ".venv/", "changelogs/fragments/", "conftest.py", "pytest.ini",
               "requirements-dev.txt", "execution-environment.yml", "ee/")
# What users need (docs/install.md, "What the tarball holds").
SHIPPED = ("MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.md", "requirements.yml",
           "meta/runtime.yml", "meta/execution-environment.yml", "meta/ee-requirements.txt",
           "plugins/modules/mig_facts.py", "plugins/modules/mig_mode.py",
           "plugins/modules/mig_config.py", "plugins/modules/mig_boot_restore.py",
           "roles/mig_node/tasks/main.yml", "playbooks/site.yml", "playbooks/demand_round.yml",
           "extensions/eda/plugins/event_source/mig_demand.py", "extensions/eda/rulebooks/mig_demand.yml",
           "simulator/gpuops_mig_sim/__init__.py", "simulator/bin/systemctl", "tools/mig-sim", "tools/gpuops-mig-restore",
           "docs/install.md", "docs/simulator.md", "LICENSES/GPL-3.0-or-later.txt")

PLAYBOOK = """\
- name: The installed collection against a simulated host
  hosts: localhost
  connection: local
  gather_facts: false
  environment:
    GPUOPS_MIG_SIMULATE: "{{ sim_state }}"
    PYTHONPATH: "{{ sim_package_dir }}"
  tasks:
    - name: Which simulator the modules import
      ansible.builtin.command: "{{ ansible_playbook_python }} -c 'import gpuops_mig_sim; print(gpuops_mig_sim.__file__)'"
      register: sim_import
      changed_when: false

    - name: Read the GPUs
      gpuops.mig.mig_facts:
      register: before

    - name: Two 3g.20gb devices on the A100
      gpuops.mig.mig_config:
        layouts:
          - gpus: [0]
            devices: {3g.20gb: 2}
      register: apply

    - name: Again, nothing to do
      gpuops.mig.mig_config:
        layouts:
          - gpus: [0]
            devices: {3g.20gb: 2}
      register: again

    - name: Read the GPUs again
      gpuops.mig.mig_facts:
      register: after

    - name: Keep the results
      ansible.builtin.copy:
        dest: "{{ out_file }}"
        content: "{{ {'sim': sim_import.stdout, 'before': before.ansible_facts.gpuops_mig,
                      'apply': apply.changed, 'again': again.changed,
                      'after': after.ansible_facts.gpuops_mig} | to_json }}"
        mode: "0644"
"""


def _ee_collection_sources():
    """What execution-environment.yml copies into the image's gpuops.mig source, as paths relative to
    the collection root; every source must exist in the repository."""
    with open(os.path.join(REPO, "execution-environment.yml")) as handle:
        ee = yaml.safe_load(handle)
    copied = []
    for entry in ee["additional_build_files"]:
        matches = glob.glob(os.path.join(REPO, entry["src"]))
        assert matches, f"execution-environment.yml copies {entry['src']}, which is not in the repository"
        dest = entry["dest"]
        if dest == "gpuops.mig" or dest.startswith("gpuops.mig/"):
            sub = dest[len("gpuops.mig/"):] if "/" in dest else ""
            for match in matches:
                copied.append(sub if os.path.isdir(match) else os.path.join(sub, os.path.basename(match)))
    return copied


def _find_kubernetes_core():
    """An installed kubernetes.core: from ANSIBLE_COLLECTIONS_PATH, this checkout's .build/collections
    (scripts/setup.sh takes it from the `ansible` package on PyPI), or an installed `ansible` package."""
    roots = [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p]
    roots.append(os.path.join(REPO, ".build", "collections"))
    roots.extend(p for p in sys.path if p.endswith("site-packages"))
    for root in roots:
        path = os.path.join(root, "ansible_collections", "kubernetes", "core")
        if os.path.isfile(os.path.join(path, "MANIFEST.json")):
            return path
    pytest.fail("no installed kubernetes.core found (run scripts/setup.sh, or set ANSIBLE_COLLECTIONS_PATH)")
    return None


def _clean_env(tmp_path, collections):
    """The environment of a user whose only collections are the ones just installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=collections,
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
        ANSIBLE_GALAXY_CACHE_DIR=str(tmp_path / "galaxy-cache"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
    )
    return env


def _run(cmd, env, cwd):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_build_install_offline_and_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    collections = str(tmp_path / "collections")
    env = _clean_env(tmp_path, collections)

    # Build, as a release does.
    _run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", REPO, "--output-path", str(work)],
         env, str(work))
    tarballs = glob.glob(str(work / "gpuops-mig-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    tarball = tarballs[0]

    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    for name in names:
        assert not any(name == bad.rstrip("/") or name.startswith(bad) for bad in NOT_SHIPPED), name
        assert "__pycache__" not in name and not name.endswith(".pyc"), name
    missing = [name for name in SHIPPED if name not in names]
    assert not missing, f"the tarball lacks {missing}"
    with tarfile.open(tarball) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    assert manifest["dependencies"] == {"kubernetes.core": ">=6.0.0,<7.0.0"}
    assert "example" not in json.dumps(manifest), "placeholder URL in galaxy.yml"

    # The execution environment installs gpuops.mig from copies of the same files.
    copied = _ee_collection_sources()
    with tarfile.open(tarball) as tar:
        files = [m.name for m in tar.getmembers() if m.isfile() and m.name not in ("MANIFEST.json", "FILES.json")]
    for name in files:
        assert any(name == c or name.startswith(c + "/") for c in copied), \
            f"{name} ships in the tarball but execution-environment.yml does not copy it"

    # Install offline with the dependency, into a path nothing else is in.
    k8s_core = _find_kubernetes_core()
    proc = _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline",
                 "-p", collections, k8s_core, tarball], env, str(work))
    assert "gpuops.mig:0.1.0 was installed successfully" in proc.stdout, proc.stdout
    installed = os.path.join(collections, "ansible_collections", "gpuops", "mig")
    _run([os.path.join(BIN, "ansible-galaxy"), "collection", "verify", "--offline", "gpuops.mig"],
         env, str(work))

    # The requirements file a user installs from names the same range as galaxy.yml.
    with open(os.path.join(installed, "requirements.yml")) as handle:
        assert '">=6.0.0,<7.0.0"' in handle.read()

    # The documentation, from the installed copy.
    proc = _run([os.path.join(BIN, "ansible-doc"), "--json", "gpuops.mig.mig_facts"], env, str(work))
    doc = json.loads(proc.stdout)["gpuops.mig.mig_facts"]["doc"]
    assert doc["filename"].startswith(installed + os.sep), doc["filename"]
    assert doc["module"] == "mig_facts"
    proc = _run([os.path.join(BIN, "ansible-doc"), "-t", "role", "gpuops.mig.mig_node"], env, str(work))
    assert "mig_node" in proc.stdout

    # A playbook against a simulated host made with the shipped simulator (docs/simulator.md).
    state = str(tmp_path / "host.json")
    _run([sys.executable, os.path.join(installed, "tools", "mig-sim"), "create", state,
          "--gpus", "1xA100-SXM4-40GB", "--mig", "enabled"], env, str(work))
    playbook = work / "play.yml"
    playbook.write_text(PLAYBOOK)
    out_file = tmp_path / "results.json"
    extra = {"sim_state": state, "sim_package_dir": os.path.join(installed, "simulator"),
             "out_file": str(out_file)}
    _run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-e", json.dumps(extra), str(playbook)],
         env, str(work))
    results = json.loads(out_file.read_text())

    assert results["sim"].startswith(os.path.join(installed, "simulator") + os.sep), results["sim"]
    (gpu,) = results["before"]["gpus"]
    assert gpu["mig_mode"] == {"current": "enabled", "pending": "enabled"}
    assert results["apply"] is True and results["again"] is False
    (gpu,) = results["after"]["gpus"]
    assert json.dumps(gpu).count("3g.20gb") >= 2, gpu
