# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Run time of the mig_facts, mig_mode and mig_config modules on a simulated 8-GPU host.

Each case runs the real module (AnsibleModule, the NVML adapter, pynvml's own
functions, the simulated libnvidia-ml with its state file) in a fresh Python
process, the way Ansible runs a module on a host, and reports the median of
several runs. Process start-up and imports are part of what a user waits for,
so they are measured too (the "startup" row is a module-less Python start with
the same imports).

Usage (from the repository root):
    .venv/bin/python bench/bench_module.py [--gpus 8xH100-SXM5-80GB] [--repeat 5] [--write-docs]

--write-docs replaces the results section of docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COLLECTIONS = os.path.join(ROOT, ".build", "collections")
sys.path.insert(0, COLLECTIONS)

import gpuops_mig_sim as sim  # noqa: E402

DOC = os.path.join(ROOT, "docs", "planner.md")
BEGIN, END = "<!-- bench-module:begin -->", "<!-- bench-module:end -->"
CONFIG = os.path.join(ROOT, "tests", "unit", "plugins", "module_utils", "fixtures", "mig-parted-config.yaml")

RUNNER = r"""
import json, sys, time
t0 = time.perf_counter()
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpuops.mig.plugins.modules import {module} as m
args = json.loads(sys.argv[1])
with patch_module_args(args):
    try:
        m.main()
    except SystemExit:
        pass
sys.stderr.write("ELAPSED %f\n" % (time.perf_counter() - t0))
"""


def run_module(module, args, state):
    env = dict(os.environ, GPUOPS_MIG_SIMULATE=state, PYTHONPATH=COLLECTIONS,
               PATH=os.path.join(ROOT, "simulator", "bin") + os.pathsep + os.environ["PATH"])
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(module=module), json.dumps(args)],
                          env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    result = json.loads(proc.stdout)
    if result.get("failed"):
        raise SystemExit("%s failed: %s" % (module, result["msg"]))
    return wall, result


def measure(label, module, args, state, repeat, prepare=None):
    times = []
    result = None
    for dummy in range(repeat):
        if prepare:
            prepare()
        wall, result = run_module(module, args, state)
        times.append(wall)
    return {"case": label, "median_s": statistics.median(times), "max_s": max(times), "changed": result.get("changed")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--gpus", default="8xH100-SXM5-80GB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="gpuops-bench-")
    state = os.path.join(work, "host.json")
    balanced = {"config_file": CONFIG, "config_name": "all-balanced"}
    one_g = {"config_file": CONFIG, "config_name": "all-1g.10gb"}

    def fresh(mig="enabled"):
        def make():
            if os.path.exists(state):
                os.remove(state)
            sim.create_state(state, args.gpus, mig=mig)
        return make

    def at(config):
        def make():
            fresh()()
            run_module("mig_config", config, state)
        return make

    rows = [
        measure("mig_facts, full report", "mig_facts", {}, state, args.repeat, fresh()),
        measure("mig_mode enable (Hopper: no reset)", "mig_mode", {"mode": "enabled"}, state, args.repeat,
                fresh("disabled")),
        measure("mig_config all-balanced from empty", "mig_config", balanced, state, args.repeat, fresh()),
        measure("mig_config all-balanced, converged re-run", "mig_config", balanced, state, args.repeat,
                at(balanced)),
        measure("mig_config all-balanced -> all-1g.10gb", "mig_config", one_g, state, args.repeat, at(balanced)),
        measure("mig_config check mode (plan only)", "mig_config", dict(balanced, _ansible_check_mode=True),
                state, args.repeat, fresh()),
    ]
    startup = []
    for dummy in range(args.repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import ansible.module_utils.basic, pynvml, yaml"],
                       env=dict(os.environ, PYTHONPATH=COLLECTIONS), check=True)
        startup.append(time.perf_counter() - t0)

    lines = ["| case (%s, one module process each) | median | max | changed |" % args.gpus, "|---|---|---|---|"]
    for row in rows:
        lines.append("| %s | %.2f s | %.2f s | %s |" % (row["case"], row["median_s"], row["max_s"], row["changed"]))
    lines.append("| Python start + imports only (no module) | %.2f s | %.2f s | - |"
                 % (statistics.median(startup), max(startup)))
    command = ".venv/bin/python bench/bench_module.py --gpus %s --repeat %d" % (args.gpus, args.repeat)
    report = "\n".join(["Produced by `%s` (Python %s, %s, %d CPUs)."
                        % (command, platform.python_version(), platform.machine(), os.cpu_count()), ""] + lines)
    print(report)
    if args.write_docs:
        with open(DOC) as f:
            text = f.read()
        block = "%s\n%s\n%s" % (BEGIN, report, END)
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda match: block, text, flags=re.S)
        else:
            text += "\n## Module run time on a simulated 8-GPU host\n\n" + block + "\n"
        with open(DOC, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
