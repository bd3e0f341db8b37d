# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""How many lines playbooks/site.yml prints on N simulated hosts: the first rollout (every node changes) and a
converged re-run, with the gpuops.mig.rollout stdout callback and (--default) with Ansible's default one.

The fleet is bench_fleet.py's (one H100 per host, connection local, kwok nodes of the real test
cluster, tests/support/controlplane, the device plugin not deployed, validation off). Each run's
output is kept in --keep DIR when given.

Usage (from the repository root, after scripts/setup.sh):
    .venv/bin/python bench/bench_output.py [--hosts 64] [--serial 25%] [--forks 16] [--default] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_fleet import BIN, REPO, simulated_fleet, timed  # noqa: E402

CALLBACKS = {"gpuops.mig.rollout": "gpuops.mig.rollout", "default": "ansible.builtin.default"}


def lines_printed(hosts, serial, forks, callback, keep=None):
    """{"first": lines, "converged": lines, "first_s", "converged_s"} for one fleet and one callback (lines on
    stdout and stderr together)."""
    with simulated_fleet(hosts, forks, "bench-output-") as fleet:
        fleet.env["ANSIBLE_STDOUT_CALLBACK"] = CALLBACKS[callback]
        site = [os.path.join(BIN, "ansible-playbook"), "-i", fleet.inventory(),
                os.path.join(REPO, "playbooks", "site.yml"), "-e",
                '{"gpuops_mig_serial": "%s", "gpuops_mig_deploy_device_plugin": false, "mig_node_validate": false}'
                % serial]
        result = {}
        for run in ("first", "converged"):
            seconds, _rss, proc = timed(site, fleet.env)
            # The screen shows both streams (Ansible's warnings go to stderr).
            result[run] = len(proc.stdout.splitlines()) + len(proc.stderr.splitlines())
            result[run + "_s"] = seconds
            if keep:
                os.makedirs(keep, exist_ok=True)
                with open(os.path.join(keep, "%s-%s-%d.log" % (callback, run, hosts)), "w") as handle:
                    handle.write(proc.stderr + proc.stdout)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--serial", default="25%")
    parser.add_argument("--forks", type=int, default=16)
    parser.add_argument("--default", action="store_true", help="also measure Ansible's default callback")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's output here")
    args = parser.parse_args()
    callbacks = ["gpuops.mig.rollout"] + (["default"] if args.default else [])
    rows = [(callback, lines_printed(args.hosts, args.serial, args.forks, callback, args.keep))
            for callback in callbacks]
    print("| %d nodes, serial %s | %s |" % (args.hosts, args.serial, " | ".join("`%s`" % c for c, _result in rows)))
    print("|---|%s" % ("---|" * len(rows)))
    for run, text in (("first", "first rollout"), ("converged", "converged re-run")):
        print("| %s | %s |" % (text, " | ".join("%d lines" % r[run] for _c, r in rows)))


if __name__ == "__main__":
    main()
