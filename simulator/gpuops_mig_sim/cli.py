# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""mig-sim: create and drive simulated GPU hosts (see docs/simulator.md); tools/mig-sim runs it."""

import argparse
import json
import sys

import gpuops_mig_sim as sim


def on_off(value):
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError("expected on or off, got %r" % value)
    return value == "on"


def build_parser():
    parser = argparse.ArgumentParser(prog="mig-sim", description="Create and drive simulated GPU hosts.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    commands.add_parser("models", help="list the GPU models that can be simulated")

    create = commands.add_parser("create", help="write a new simulated host")
    create.add_argument("state")
    create.add_argument("--gpus", action="append", required=True,
                        help='COUNTxMODEL[,COUNTxMODEL...], e.g. "8xH100-SXM5-80GB"; may be repeated')
    create.add_argument("--driver", default=sim.DEFAULT_DRIVER_VERSION, help="driver version (default %(default)s)")
    create.add_argument("--cuda", type=int, default=sim.DEFAULT_CUDA_DRIVER_VERSION,
                        help="CUDA driver version as an integer (default %(default)s)")
    create.add_argument("--seed", default=sim.DEFAULT_SEED, help="seed for the UUIDs (default %(default)s)")
    create.add_argument("--mig", choices=("enabled", "disabled"), default="disabled",
                        help="initial MIG mode of every MIG-capable GPU (default %(default)s)")
    create.add_argument("--force", action="store_true", help="overwrite an existing state file")
    create.add_argument("--root", metavar="DIR", help="the host's root directory: the driver's /proc is kept there")

    show = commands.add_parser("show", help="print the host: GPUs, MIG layout, processes, quirks, faults")
    show.add_argument("state")
    show.add_argument("--json", action="store_true", help="print the raw state file content")

    process = commands.add_parser("process", help="add or clear simulated GPU processes")
    process_commands = process.add_subparsers(dest="action", metavar="ACTION")
    process_commands.required = True
    add = process_commands.add_parser("add", help="start a process on a GPU or MIG device")
    add.add_argument("state")
    add.add_argument("--gpu", type=int, required=True, help="GPU index")
    add.add_argument("--gi", type=int, help="GPU instance id (MIG-enabled GPUs)")
    add.add_argument("--ci", type=int, help="compute instance id (MIG-enabled GPUs)")
    add.add_argument("--pid", type=int, required=True)
    add.add_argument("--name", default="python")
    add.add_argument("--memory-mib", type=int, default=0)
    add.add_argument("--type", choices=sim.PROCESS_TYPES, default="compute")
    add.add_argument("--live", action="store_true",
                     help="PID is a real process; the GPU lists it only while it runs")
    clear = process_commands.add_parser("clear", help="end processes (all, or on one GPU)")
    clear.add_argument("state")
    clear.add_argument("--gpu", type=int, help="GPU index")

    host = commands.add_parser("host", help="set host quirks")
    host.add_argument("state")
    host.add_argument("--passthrough", type=on_off, metavar="on|off",
                      help="a passthrough VM: GPU resets are refused, a reboot is needed")
    host.add_argument("--mode-change-survives-reboot", type=on_off, metavar="on|off",
                      help="off: a pending Ampere MIG mode stays pending across reboots")
    host.add_argument("--deny-changes", type=on_off, metavar="on|off",
                      help="on: every change fails with NVML_ERROR_NO_PERMISSION")
    host.add_argument("--client", nargs=2, action="append", default=[], metavar=("add|remove", "NAME"),
                      help="a host service holding the GPUs, e.g. nvidia-dcgm; may be repeated")
    host.add_argument("--auto-placement", choices=sim.AUTO_PLACEMENTS,
                      help="where a GPU/compute instance created without a placement goes")
    host.add_argument("--driver-root", metavar="DIR|none",
                      help="the driver lives in a container whose root is DIR (the GPU Operator mounts it at "
                           "/run/nvidia/driver); none puts it back on the host")
    host.add_argument("--root", metavar="DIR|none",
                      help="the host's root directory: the driver's /proc (MIG capabilities) is kept there")

    driver = commands.add_parser("driver-up", help="start the driver container: lay out its root again "
                                                   "(after a boot that emptied /run)")
    driver.add_argument("state")
    driver.add_argument("--validations", metavar="DIR",
                        help="also write the operator validator's driver-ready file there "
                             "(/run/nvidia/validations)")

    fault = commands.add_parser("fault", help="arm or clear injected NVML errors")
    fault_commands = fault.add_subparsers(dest="action", metavar="ACTION")
    fault_commands.required = True
    fault_add = fault_commands.add_parser("add", help="make the Nth call of an NVML function fail")
    fault_add.add_argument("state")
    fault_add.add_argument("--function", required=True, help="C symbol or pynvml function name")
    fault_add.add_argument("--nth", type=int, default=1, help="which call fails, counted from now (default 1)")
    fault_add.add_argument("--error", required=True, help="NVML error name (INSUFFICIENT_RESOURCES) or number (23)")
    fault_add.add_argument("--sticky", action="store_true", help="every call from the Nth on fails")
    fault_clear = fault_commands.add_parser("clear", help="remove all faults")
    fault_clear.add_argument("state")

    reset = commands.add_parser("reset", help="reset GPUs like nvidia-smi -r")
    reset.add_argument("state")
    reset.add_argument("--gpu", action="extend", nargs="+", default=[], metavar="BUS_ID",
                       help="bus ids (or indexes or UUIDs); default all GPUs")

    reboot = commands.add_parser("reboot", help="reboot the simulated host")
    reboot.add_argument("state")

    boot_id = commands.add_parser("boot-id", help="print the boot id")
    boot_id.add_argument("state")
    return parser


def run(args):
    """Runs one command; returns the exit code."""
    if args.command == "models":
        print(sim.format_models())
    elif args.command == "create":
        sim.create_state(args.state, args.gpus, driver_version=args.driver, cuda_driver_version=args.cuda,
                         seed=args.seed, mig=args.mig, force=args.force, root=args.root)
        print(sim.format_state(sim.load_state(args.state)))
    elif args.command == "show":
        state = sim.load_state(args.state)
        print(json.dumps(state, indent=1, sort_keys=True) if args.json else sim.format_state(state))
    elif args.command == "process" and args.action == "add":
        sim.add_process(args.state, args.gpu, args.pid, name=args.name, used_memory_mib=args.memory_mib,
                        gi=args.gi, ci=args.ci, kind=args.type, live=args.live)
    elif args.command == "process":
        sim.clear_processes(args.state, args.gpu)
    elif args.command == "host":
        actions = {"add": [], "remove": []}
        for action, name in args.client:
            if action not in actions:
                raise sim.SimulatorError("--client takes add NAME or remove NAME, not %r" % action)
            actions[action].append(name)
        sim.set_host(args.state, passthrough=args.passthrough,
                     mode_change_survives_reboot=args.mode_change_survives_reboot,
                     deny_changes=args.deny_changes, add_clients=actions["add"], remove_clients=actions["remove"],
                     auto_placement=args.auto_placement, driver_root=args.driver_root, root=args.root)
    elif args.command == "driver-up":
        print(sim.start_driver_container(args.state, args.validations))
    elif args.command == "fault" and args.action == "add":
        sim.add_fault(args.state, args.function, args.error, nth=args.nth, sticky=args.sticky)
    elif args.command == "fault":
        sim.clear_faults(args.state)
    elif args.command == "reset":
        results = sim.reset_gpus(args.state, args.gpu)
        for _bus_id, _ok, message in results:
            print(message)
        return sim.reset_exit_code(results)
    elif args.command == "reboot":
        print(sim.reboot(args.state))
    elif args.command == "boot-id":
        print(sim.boot_id(args.state))
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except sim.SimulatorError as exc:
        sys.stderr.write("mig-sim: error: %s\n" % exc)
        return 2
