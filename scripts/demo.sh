#!/usr/bin/env bash
# The main job on a simulated fleet (no GPU, no cluster needed):
#   1. set up .venv (scripts/setup.sh; about a minute the first time)
#   2. create three simulated GPU hosts with different models (tools/mig-sim)
#   3. start the Kubernetes API emulator with those nodes, a few pods (one of
#      them a DaemonSet pod, one guarded by a PodDisruptionBudget)
#   4. run playbooks/site.yml against examples/simulated-fleet/inventory.yml
#   5. print the fleet report (playbooks/facts.yml)
#   6. run site.yml again and show that nothing changed
# Everything lives under .build/demo/ and is recreated on every run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
./scripts/setup.sh

demo=$root/.build/demo
rm -rf "$demo"
mkdir -p "$demo"
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
    seed.replicaset("train-5d8f", 1, namespace="ml", labels={"app": "train"}),
    seed.pdb("train", {"app": "train"}, namespace="ml", max_unavailable=1),
    # A GPU Operator operand: it follows nvidia.com/gpu.deploy.dcgm-exporter, so it pauses.
    seed.daemonset("dcgm-exporter", namespace="monitoring", labels={"app": "nvidia-dcgm-exporter"},
                   node_selector={"nvidia.com/gpu.deploy.dcgm-exporter": "true"}),
    seed.daemonset("node-exporter", namespace="monitoring"),  # a DaemonSet pod the drain leaves alone
]
with open("%s/cluster.yaml" % demo, "w") as f:
    yaml.safe_dump_all(objects, f)
PY

echo "== Kubernetes API emulator"
python -m tests.support.kubeapi --port 0 --seed "$demo/cluster.yaml" --kubeconfig "$demo/kubeconfig" \
  > "$demo/kubeapi.json" 2> "$demo/kubeapi.log" &
api_pid=$!
trap 'kill $api_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -s "$demo/kubeapi.json" ] && break; sleep 0.2; done
[ -s "$demo/kubeapi.json" ] || { cat "$demo/kubeapi.log"; exit 1; }
export K8S_AUTH_KUBECONFIG="$demo/kubeconfig" KUBECONFIG="$demo/kubeconfig"
echo "  $(cat "$demo/kubeapi.json")"

echo "== playbooks/site.yml (a canary node first, then the rest)"
ansible-playbook -i "$inventory" playbooks/site.yml -e gpuops_mig_canary=true -e gpuops_mig_serial=2 \
  | tee "$demo/site-1.log"

echo "== playbooks/facts.yml"
ansible-playbook -i "$inventory" playbooks/facts.yml -e gpuops_mig_report_file="$demo/mig-fleet-report.json" \
  > "$demo/facts.log"
cat "$demo/mig-fleet-report.txt"
echo "  (machine-readable: $demo/mig-fleet-report.json)"
echo
kubectl get nodes -o custom-columns='NODE:.metadata.name,CORDONED:.spec.unschedulable,MIG CONFIG:.metadata.labels.nvidia\.com/mig\.config,STATE:.metadata.labels.nvidia\.com/mig\.config\.state'

echo "== playbooks/site.yml again: nothing changes"
ansible-playbook -i "$inventory" playbooks/site.yml -e gpuops_mig_canary=true -e gpuops_mig_serial=2 \
  > "$demo/site-2.log"
cat "$demo/site-2.log"
if grep -Eq 'changed=[1-9]|: [1-9][0-9]* changed' "$demo/site-2.log"; then
  echo "demo: the second run changed something (see $demo/site-2.log)" >&2
  exit 1
fi
echo "demo: second run changed nothing; logs and state under $demo"
