#!/usr/bin/env bash
# Builds the test cluster's control plane from the pinned Go modules in
# tests/support/controlplane/{kubernetes,etcd,kwok}: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and kwok (with kwok's stage files).
#
#   scripts/control-plane.sh           build what is missing, print the binaries' directory
#   scripts/control-plane.sh --check   print it if it is complete, else exit 1 (builds nothing)
#   scripts/control-plane.sh --stages  print the path of kwok's stage file (writes it if missing)
#
# The binaries go to a cache outside the checkout, keyed by the pinned versions and the
# go.sum files: ${GPUOPS_MIG_CACHE:-~/.cache/gpuops-mig}/control-plane/<key>. A second run
# reuses them. Where KUBEBUILDER_ASSETS names a directory that already holds every binary
# (envtest's convention, what `setup-envtest use` prints), that directory is used and
# nothing is built. docs/testing-kubernetes.md has the measured build times.
set -euo pipefail
PATH=$PATH:/usr/local/go/bin  # where the Go toolchain installs itself
root=$(cd "$(dirname "$0")/.." && pwd)
mods=$root/tests/support/controlplane
BINARIES="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok"

require() { sed -n "s|^require $1 \(v[^ ]*\)\$|\1|p" "$mods/$2/go.mod"; }
K8S=$(require k8s.io/kubernetes kubernetes)
ETCD=$(require go.etcd.io/etcd/server/v3 etcd)
KWOK=$(require sigs.k8s.io/kwok kwok)
[ -n "$K8S" ] && [ -n "$ETCD" ] && [ -n "$KWOK" ] || {
  echo "control-plane: cannot read the pinned versions from $mods/*/go.mod" >&2; exit 2; }

complete() {
  local b
  for b in $BINARIES; do [ -x "$1/$b" ] || return 1; done
}

cache=${GPUOPS_MIG_CACHE:-$HOME/.cache/gpuops-mig}/control-plane
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

# kwok's standalone binary needs its Stage documents (kwokctl embeds them): the fast node and
# pod stages and the lease heartbeat, taken from the pinned module.
write_stages() {
  local stages f
  command -v go >/dev/null || { echo "control-plane: no 'go' command on PATH" >&2; exit 2; }
  stages=$(cd "$mods/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
  for f in node/fast/node-initialize.yaml \
           node/heartbeat-with-lease/node-heartbeat-with-lease.yaml pod/fast/pod-ready.yaml \
           pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$stages/$f" ] || { echo "control-plane: kwok $KWOK has no stage $f" >&2; exit 2; }
    printf -- '---\n'; cat "$stages/$f"
  done > "$1.tmp" && mv "$1.tmp" "$1"
}
if [ "${1:-}" = --stages ]; then
  f=$cache/kwok-$KWOK-stages.yaml
  [ -f "$f" ] || { mkdir -p "$cache"; write_stages "$f"; }
  echo "$f"; exit 0
fi

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  if complete "$KUBEBUILDER_ASSETS"; then echo "$KUBEBUILDER_ASSETS"; exit 0; fi
  echo "control-plane: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks one of: $BINARIES;" \
    "using the build cache instead" >&2
fi

key=$(cat "$mods"/*/go.mod "$mods"/*/go.sum | sha256sum | cut -c1-12)
dir=$cache/k8s-$K8S-etcd-$ETCD-kwok-$KWOK-$key
if complete "$dir"; then echo "$dir"; exit 0; fi
[ "${1:-}" = --check ] && exit 1

command -v go >/dev/null || {
  echo "control-plane: no 'go' command on PATH (Go 1.26 or later)" >&2; exit 2; }
mkdir -p "$dir.tmp"
start=$(date +%s)
step() { echo "control-plane: [$(( $(date +%s) - start ))s] $*" >&2; }

# The version the binaries report (/version, kubectl version, helm's kubeVersion checks);
# without it they say v0.0.0-master.
minor=${K8S#v1.}; minor=${minor%%.*}
stamp="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp="$stamp -X $pkg.gitVersion=$K8S -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp="$stamp -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

step "etcd $ETCD (1 of 3)"
(cd "$mods/etcd" && go build -trimpath -o "$dir.tmp/etcd" -ldflags "-s -w" \
  go.etcd.io/etcd/server/v3)
step "kwok $KWOK (2 of 3)"
(cd "$mods/kwok" && go build -trimpath -o "$dir.tmp/kwok" \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK#v}" sigs.k8s.io/kwok/cmd/kwok)
write_stages "$dir.tmp/kwok-stages.yaml"
step "kubernetes $K8S: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (3 of 3;" \
  "6 to 10 minutes cold on 2 cores)"
(cd "$mods/kubernetes" && go build -trimpath -pgo=off -tags selinux,notest -o "$dir.tmp/" \
  -ldflags "$stamp" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl)
rm -rf "$dir" && mv "$dir.tmp" "$dir"
step "done: $(du -sh "$dir" | cut -f1) in $dir"
echo "$dir"
