#!/usr/bin/env bash
# The main job on a simulated fleet (no GPU, no cluster needed):
#   1. set up .venv (scripts/setup.sh; about a minute the first time) and build the test
#      cluster's control plane (scripts/control-plane.sh; 6 to 10 minutes the first time, cached)
#   2. create three simulated GPU hosts with different models (tools/mig-sim)
#   3. start a test cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes)
#      with those nodes, a few pods (one of them a DaemonSet pod, one guarded by a
#      PodDisruptionBudget); the collection runs as a ServiceAccount bound to rbac/ only
#   4. run playbooks/site.yml against examples/simulated-fleet/inventory.yml
#   5. print the fleet report (playbooks/facts.yml)
#   6. run site.yml again and show that nothing changed
# Everything lives under .build/demo/. The simulated hosts (state files there) and the test cluster
# (left running, its pid in .build/demo/cluster.pid) stay, so that running the demo again shows the
# converged re-run of the fleet as it was left: site.yml and the fleet report, nothing changed.
#   scripts/demo.sh            the first time (or when the cluster is gone): steps 1-6; after that: the re-run
#   scripts/demo.sh --fresh    start over: a new fleet and cluster, steps 1-6
#   scripts/demo.sh --stop     stop the test cluster (the next run starts over)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

mode=auto
for arg in "$@"; do
  case $arg in
    --fresh) mode=fresh ;;
    --stop) mode=stop ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $arg (--fresh, --stop or --help)" >&2; exit 2 ;;
  esac
done

demo=$root/.build/demo
# The test cluster this script left running, if it still runs (the pid must still be that one).
api_pid() {
  local pid
  pid=$(cat "$demo/cluster.pid" 2>/dev/null) || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
    | grep -q "tests.support.controlplane.*$demo/cluster.yaml" || return 1
  echo "$pid"
}
stop_api() {
  local pid
  if pid=$(api_pid); then
    kill "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$demo/cluster.pid"
}

if [ "$mode" = stop ]; then
  stop_api
  echo "demo: the test cluster is stopped; the next scripts/demo.sh starts over"
  exit 0
fi
./scripts/setup.sh
./scripts/control-plane.sh > /dev/null
if [ "$mode" = auto ] && api_pid > /dev/null && [ -f "$demo/first-run-done" ]; then
  mode=rerun
else
  stop_api
  rm -rf "$demo"
  mkdir -p "$demo"
fi

export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$root/.build/collections"
export ANSIBLE_NOCOLOR=${ANSIBLE_NOCOLOR:-1}
# The collection's screen output: the preview, batches, each node's steps, failures, the summary.
# ANSIBLE_STDOUT_CALLBACK=default shows Ansible's usual task-by-task output instead.
export ANSIBLE_STDOUT_CALLBACK=${ANSIBLE_STDOUT_CALLBACK:-gpuops.mig.rollout}
export ANSIBLE_LOCAL_TEMP="$demo/ansible-tmp" ANSIBLE_REMOTE_TEMP="$demo/ansible-tmp"
export GPUOPS_SIM_DIR="$demo" GPUOPS_SIM_REPO="$root"
export HELM_CACHE_HOME="$demo/helm/cache" HELM_CONFIG_HOME="$demo/helm/config" HELM_DATA_HOME="$demo/helm/data"
export KUBECACHEDIR="$demo/kube-cache"
inventory=examples/simulated-fleet/inventory.yml
export K8S_AUTH_KUBECONFIG="$demo/kubeconfig" KUBECONFIG="$demo/kubeconfig"

converged_rerun() {
  echo "== playbooks/site.yml again: nothing changes"
  ansible-playbook -i "$inventory" playbooks/site.yml -e gpuops_mig_canary=true -e gpuops_mig_serial=2 \
    > "$demo/$1"
  cat "$demo/$1"
  if grep -Eq 'changed=[1-9]|: [1-9][0-9]* changed' "$demo/$1"; then
    echo "demo: the re-run changed something (see $demo/$1)" >&2
    exit 1
  fi
}

report() {
  echo "== playbooks/facts.yml"
  ansible-playbook -i "$inventory" playbooks/facts.yml -e gpuops_mig_report_file="$demo/mig-fleet-report.json" \
    > "$demo/facts.log"
  cat "$demo/mig-fleet-report.txt"
  echo "  (machine-readable: $demo/mig-fleet-report.json)"
  echo
  kubectl get nodes -o custom-columns='NODE:.metadata.name,CORDONED:.spec.unschedulable,MIG CONFIG:.metadata.labels.nvidia\.com/mig\.config,STATE:.metadata.labels.nvidia\.com/mig\.config\.state'
}

if [ "$mode" = rerun ]; then
  echo "== the fleet and cluster the last scripts/demo.sh left (.build/demo, cluster pid $(api_pid))"
  run=$(( $(cat "$demo/runs" 2>/dev/null || echo 2) + 1 ))
  converged_rerun "site-$run.log"
  echo "$run" > "$demo/runs"
  report
  echo "demo: converged re-run, nothing changed; scripts/demo.sh --fresh starts over, --stop stops the cluster"
  exit 0
fi

echo "== simulated GPU hosts"
python - "$demo" <<'PY'
import sys
import yaml
sys.path.insert(0, ".build/collections")
import gpuops_mig_sim as sim
from tests.support.kubeapi import seed

demo = sys.argv[1]
with open("examples/simulated-fleet/inventory.yml") as f:
    hosts = yaml.safe_load(f)["all"]["children"]["gpu_nodes"]["hosts"]
objects = [seed.namespace("ml"), seed.namespace("monitoring")]
for name, host in hosts.items():
    state = "%s/%s.json" % (demo, name)
    sim.create_state(state, host["gpuops_sim_gpus"], seed=name)
    print("  %-12s %s" % (name, sim.format_gpu_list(sim.load_state(state)).splitlines()[0]))
    if host.get("mig_node_kubernetes") is False:
        continue
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true"}
    if name == "gpu-a100-01":
        labels["nvidia.com/mig.config"] = "all-balanced"   # GPU Operator style: the label names the config
        sim.set_host(state, add_clients=["nvidia-dcgm"])   # a host service holding the GPUs
    objects.append(seed.node(name, labels, nvml_state=state))
    app = "train" if name == "gpu-a100-01" else "notebook"
    objects.append(seed.pod("%s-%s" % (app, name), node=name, namespace="ml", labels={"app": app},
                            owner=("ReplicaSet", app + "-5d8f"), limits={"nvidia.com/gpu": 1}))
objects += [
    seed.pdb("train", {"app": "train"}, namespace="ml", max_unavailable=1),
    # A GPU Operator operand: it follows nvidia.com/gpu.deploy.dcgm-exporter, so it pauses.
    seed.daemonset("dcgm-exporter", namespace="monitoring", labels={"app": "nvidia-dcgm-exporter"},
                   node_selector={"nvidia.com/gpu.deploy.dcgm-exporter": "true"}),
    seed.daemonset("node-exporter", namespace="monitoring"),  # a DaemonSet pod the drain leaves alone
]
with open("%s/cluster.yaml" % demo, "w") as f:
    yaml.safe_dump_all(objects, f)
PY

echo "== test cluster (tests/support/controlplane)"
# In a session of its own, so that it outlives this script for the next run's converged re-run.
setsid python -m tests.support.controlplane --dir "$demo/cluster" --seed "$demo/cluster.yaml" \
  --rbac-kubeconfig "$demo/kubeconfig" > "$demo/cluster.json" 2> "$demo/cluster.log" < /dev/null &
echo $! > "$demo/cluster.pid"
# Until the first rollout is through, a failure stops the cluster too (the next run starts over).
trap 'stop_api' EXIT
for _ in $(seq 1200); do [ -s "$demo/cluster.json" ] && break; api_pid > /dev/null || break; sleep 0.2; done
[ -s "$demo/cluster.json" ] || { tail -20 "$demo/cluster.log"; exit 1; }
echo "  $(cat "$demo/cluster.json")"

echo "== playbooks/site.yml (a canary node first, then the rest)"
ansible-playbook -i "$inventory" playbooks/site.yml -e gpuops_mig_canary=true -e gpuops_mig_serial=2 \
  | tee "$demo/site-1.log"

report
converged_rerun site-2.log
echo 2 > "$demo/runs"
touch "$demo/first-run-done"
trap - EXIT
echo "demo: second run changed nothing; logs and state under $demo"
echo "demo: the test cluster keeps running (pid $(api_pid)): scripts/demo.sh again shows the converged"
echo "      re-run, --fresh starts over, --stop stops it"
