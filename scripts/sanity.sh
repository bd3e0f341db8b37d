#!/usr/bin/env bash
# ansible-test sanity, offline-friendly: ansible-test wants the collection under
# .../ansible_collections/gpuops/mig and bootstraps pip from the internet, so we
# copy the tracked files there and hand it a local get-pip stand-in.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
./scripts/setup.sh

dest=.build/sanity/ansible_collections/gpuops/mig
rm -rf .build/sanity
mkdir -p "$dest"
git ls-files -co --exclude-standard -z | xargs -0 -I{} cp --parents {} "$dest"/ 2>/dev/null || true
# Dependencies beside it, where ansible-test looks for them (doc fragments, module_utils).
cp -rL .build/collections/ansible_collections/kubernetes .build/sanity/ansible_collections/
# ansible-test only looks at files git knows about when a .git is present.
(cd "$dest" && git init -q && git add -A)

cache=$HOME/.ansible/test/cache
mkdir -p "$cache"
for v in 24.2 25.0 25.1 25.2 25.3; do
  cat > "$cache/get_pip_${v//./_}.py" <<'PY'
# Stand-in for the get-pip.py download: use ensurepip, then pip from PyPI.
import subprocess, sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + args)
PY
done

cd "$dest"
export PATH="$root/.venv/bin:$PATH"
exec ansible-test sanity --venv --python 3.11 --color no "$@"
