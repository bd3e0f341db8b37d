#!/usr/bin/env bash
# The whole test suite: unit and playbook tests (pytest), ansible-test sanity,
# and the changelog lint. Installs what it needs first (scripts/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
./scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$root/.build/collections"

echo "== pytest (unit and playbook tests)"
python -m pytest -q -n 2 -p no:cacheprovider

echo "== ansible-test sanity"
./scripts/sanity.sh

echo "== changelog lint"
antsibull-changelog lint

echo "== all test stages passed"
