# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the rollout (playbooks/site.yml) against the test bed and report what happened, as JSON.

    rollout.py run [--vars FILE]... [-e JSON]... [--limit HOSTS] [--runner DIR] [--log FILE] [--playbook FILE]
    rollout.py measure [--vars FILE]... [-e JSON]... [--log FILE]
    rollout.py ping

`run` launches the rollout the way an operator does: ansible-playbook over SSH to
the hosts of extensions/molecule/inventory/hosts.yml, or, with --runner, through
ansible-runner (the engine of AWX job templates) with a private data directory
whose extra vars arrive as strings, as survey answers do. It prints one JSON
object: rc, seconds, per-host stats, and per host the tasks that changed, that
ran (not skipped) and that failed (with their message). The exit status is 0
whatever the rollout's outcome, so callers can assert on expected failures.
`--playbook` runs another playbook of the collection the same way (the plan
scenario runs playbooks/plan.yml with it); site.yml is the default.

`measure` is the figure in docs/testbed.md: a bare `ansible -m ping` sweep of the
same hosts, then a converged re-run of the rollout; it prints both wall times,
their ratio and the number of changed tasks (which must be zero).

`ping` times the bare sweep alone (the rollout scenario takes it right before its
converged run).

The molecule scenarios call it from their playbooks; it also runs by hand on an
up test bed (tests/testbed/bed.py up), with the repository's .venv python.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", ".."))
BED = "/tmp/gpuops-testbed"  # as in bed.py and the inventory
INVENTORY = os.path.join(REPO, "extensions", "molecule", "inventory", "hosts.yml")
SITE = os.path.join(REPO, "playbooks", "site.yml")
BIN = os.path.dirname(sys.executable)
HOSTS = "gpu_nodes"


def ansible_env():
    """The settings every run uses, also outside molecule (they match extensions/molecule/config.yml)."""
    env = dict(os.environ)
    env.pop("ANSIBLE_CONFIG", None)  # the same settings inside and outside molecule
    env.update(
        PATH=BIN + os.pathsep + env.get("PATH", ""),
        ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".build", "collections"),
        ANSIBLE_FORKS="8",
        ANSIBLE_PIPELINING="true",
        ANSIBLE_HOST_KEY_CHECKING="false",
        ANSIBLE_RETRY_FILES_ENABLED="false",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_DEPRECATION_WARNINGS="false",
        # kubernetes.core keeps a discovery cache per API server in the temp dir: keep it in the bed.
        TMPDIR=os.path.join(BED, "tmp"),
    )
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def load_vars(files, inline):
    """Extra vars from YAML files and JSON strings, later ones winning (as -e does)."""
    merged = {}
    for path in files:
        with open(path, encoding="utf-8") as handle:
            merged.update(yaml.safe_load(handle) or {})
    for text in inline:
        merged.update(json.loads(text))
    return merged


def run_logged(cmd, env, log=None, append=False):
    """Run cmd from the repository root, timed; write the command line and its output to log.

    Returns (the CompletedProcess, wall seconds). Every launch of ansible goes through here."""
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    seconds = round(time.monotonic() - started, 1)
    if log:
        with open(log, "a" if append else "w", encoding="utf-8") as handle:
            handle.write("$ %s\n%s\n--- stderr\n%s\n" % (" ".join(cmd), proc.stdout, proc.stderr))
    return proc, seconds


# ----- ansible-playbook -------------------------------------------------------------------------

def run_playbook(extra_vars, limit=None, log=None, playbook=SITE):
    env = ansible_env()
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", INVENTORY, playbook, "-e", json.dumps(extra_vars)]
    if limit:
        cmd += ["--limit", limit]
    proc, seconds = run_logged(cmd, env, log)
    try:
        report = json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        return {"rc": proc.returncode, "seconds": seconds, "error": (proc.stderr or proc.stdout)[-4000:],
                "stats": {}, "changed": {}, "ran": {}, "failed": {}}
    summary = summarize_json_callback(report)
    summary.update(rc=proc.returncode, seconds=seconds)
    return summary


def summarize_json_callback(report):
    changed, ran, failed = {}, {}, {}
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            name = task["task"]["name"]
            for host, result in task.get("hosts", {}).items():
                note(changed, ran, failed, host, name, result)
    return {"stats": report.get("stats", {}), "changed": changed, "ran": ran, "failed": failed}


def note(changed, ran, failed, host, name, result):
    """Record one task result of one host (loop results count once, as the task)."""
    if result.get("skipped") and not result.get("results"):
        return
    ran.setdefault(host, []).append(name)
    if result.get("changed"):
        changed.setdefault(host, []).append(name)
    if (result.get("failed") or result.get("unreachable")) and not result.get("ignore_errors"):
        failed.setdefault(host, []).append({"task": name, "msg": str(result.get("msg", ""))[:2000],
                                            "unreachable": bool(result.get("unreachable"))})


# ----- ansible-runner ---------------------------------------------------------------------------

def as_survey_answers(extra_vars):
    """AWX hands survey answers over as strings: "true", "2". Mappings and lists stay (JSON survey)."""
    def text(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value) if isinstance(value, (int, float)) else value
    return {key: text(value) for key, value in extra_vars.items()}


def run_runner(extra_vars, private_data_dir, limit=None, log=None):
    """ansible-runner with a private data directory, laid out as AWX prepares one for a job."""
    shutil.rmtree(private_data_dir, ignore_errors=True)
    for sub in ("inventory", "env"):
        os.makedirs(os.path.join(private_data_dir, sub))
    os.symlink(REPO, os.path.join(private_data_dir, "project"))  # AWX checks the project (this repo) out here
    shutil.copy(INVENTORY, os.path.join(private_data_dir, "inventory", "hosts.yml"))
    with open(os.path.join(private_data_dir, "env", "extravars"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(as_survey_answers(extra_vars), handle)
    env = {k: v for k, v in ansible_env().items() if k.startswith("ANSIBLE_")}
    with open(os.path.join(private_data_dir, "env", "envvars"), "w", encoding="utf-8") as handle:
        yaml.safe_dump(env, handle)
    cmd = [os.path.join(BIN, "ansible-runner"), "run", private_data_dir, "-p", "playbooks/site.yml",
           "--ident", "job"]
    if limit:
        cmd += ["--limit", limit]
    proc, seconds = run_logged(cmd, ansible_env(), log)
    summary = summarize_job_events(os.path.join(private_data_dir, "artifacts", "job"))
    summary.update(seconds=seconds, runner_rc=proc.returncode)
    return summary


def summarize_job_events(artifacts):
    changed, ran, failed, stats = {}, {}, {}, {}
    for path in sorted(glob.glob(os.path.join(artifacts, "job_events", "*.json")),
                       key=lambda p: int(os.path.basename(p).split("-", 1)[0])):
        with open(path, encoding="utf-8") as handle:
            event = json.load(handle)
        data = event.get("event_data", {})
        kind = event.get("event")
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable"):
            result = dict(data.get("res") or {})
            result.setdefault("changed", data.get("changed", False))
            if kind == "runner_on_failed":
                result["failed"] = True
                result["ignore_errors"] = data.get("ignore_errors", False)
            if kind == "runner_on_unreachable":
                result["unreachable"] = True
            name = "%s : %s" % (data["role"], data.get("task", "")) if data.get("role") else data.get("task", "")
            note(changed, ran, failed, data["host"], name, result)
        elif kind == "playbook_on_stats":
            keys = ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored")
            for key in keys:
                for host, count in (data.get(key) or {}).items():
                    stats.setdefault(host, dict.fromkeys(keys, 0))[key] = count
    with open(os.path.join(artifacts, "rc"), encoding="utf-8") as handle:
        rc = int(handle.read().strip())
    with open(os.path.join(artifacts, "status"), encoding="utf-8") as handle:
        status = handle.read().strip()
    return {"rc": rc, "status": status, "stats": stats, "changed": changed, "ran": ran, "failed": failed}


# ----- measure ----------------------------------------------------------------------------------

def ping_sweep(log=None):
    cmd = [os.path.join(BIN, "ansible"), "-i", INVENTORY, HOSTS, "-m", "ansible.builtin.ping"]
    proc, seconds = run_logged(cmd, ansible_env(), log, append=True)
    if proc.returncode != 0:
        raise SystemExit("rollout.py: ping sweep failed:\n%s%s" % (proc.stdout, proc.stderr))
    return seconds


def measure(extra_vars, log=None):
    ping_s = ping_sweep(log)
    rerun = run_playbook(extra_vars, log=log + ".rerun" if log else None)
    changed = sum(s.get("changed", 0) for s in rerun["stats"].values())
    return {"hosts": len(rerun["stats"]), "ping_seconds": ping_s, "rerun_seconds": rerun["seconds"],
            "ratio": round(rerun["seconds"] / ping_s, 1) if ping_s else None, "changed": changed,
            "rerun_rc": rerun["rc"], "changed_tasks": rerun["changed"], "failed": rerun["failed"]}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="rollout.py", description=__doc__.split("\n", maxsplit=1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ping")
    for name in ("run", "measure"):
        sub = commands.add_parser(name)
        sub.add_argument("--vars", action="append", default=[], metavar="FILE", help="extra vars file (YAML)")
        sub.add_argument("-e", dest="inline", action="append", default=[], metavar="JSON", help="extra vars (JSON)")
        sub.add_argument("--log", help="write the run's full output here")
        if name == "run":
            sub.add_argument("--limit")
            sub.add_argument("--runner", metavar="DIR", help="run through ansible-runner with this private data dir")
            sub.add_argument("--playbook", default=SITE, help="the playbook to run (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "ping":
        json.dump({"seconds": ping_sweep()}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    extra_vars = load_vars(args.vars, args.inline)
    if args.command == "measure":
        result = measure(extra_vars, args.log)
    elif args.runner:
        result = run_runner(extra_vars, args.runner, args.limit, args.log)
    else:
        result = run_playbook(extra_vars, args.limit, args.log, os.path.abspath(args.playbook))
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
