"""What the simulated mig-manager runs on a node's simulated GPUs: the collection's own engine.

    python -m tests.support.kubeapi.migmanager_engine CONFIG_FILE CONFIG_NAME [--check]
    python -m tests.support.kubeapi.migmanager_engine --destroy-all

with GPUOPS_MIG_SIMULATE naming the node's state file. --check: exit 10 when the
named config is already in place (mig-parted's `assert`), 0 when it is not.
Otherwise apply it (mode, reset, geometry) through _boot_restore.restore, the code
the boot-time restore runs: exit 0 done, 2 bad input, 3 mode still pending, 1 failed.
"""

import json
import os
import sys

IN_PLACE = 10


def in_place(desired):
    from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
    from ansible_collections.gpuops.mig.plugins.module_utils import _host_layout as host_layout
    from ansible_collections.gpuops.mig.plugins.module_utils import _host_mode as host_mode
    nvml = boot_restore.open_session(desired)
    try:
        entries = host_layout.load_entries(config=desired["config"], config_name=desired["config_name"])
        resolution, gpus = host_layout.resolve(nvml, entries, True)
        work = host_layout.plan_host(nvml, resolution, gpus, check_mode=True)
        records = host_mode.plan(nvml, host_mode.request_from_resolution(resolution, gpus))
        mode_ok = all(r["skipped"] or r["mig_mode_before"]["current"] == host_mode.mode_name(r["desired"])
                      for r in records)
        return mode_ok and not any(host_layout.item_changed(item) for item in work)
    finally:
        nvml.__exit__(None, None, None)


def destroy_all():
    """What NVIDIA's DRA driver with DynamicMIG does at start: destroy every MIG device (through NVML)."""
    from ansible_collections.gpuops.mig.plugins.module_utils._nvml import Nvml
    with Nvml(driver_root=os.environ.get("GPUOPS_SIM_DRIVER_ROOT") or "auto") as nvml:
        for index in range(nvml.gpu_count()):
            if (nvml.mig_mode(index) or (0, 0))[0] != 1:
                continue
            for gi in nvml.layout(index):
                for ci in gi["compute_instances"]:
                    nvml.destroy_compute_instance(index, gi["id"], ci["id"])
                nvml.destroy_gpu_instance(index, gi["id"])
    return 0


def main(argv):
    if argv == ["--destroy-all"]:
        return destroy_all()
    from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
    from ansible_collections.gpuops.mig.plugins.module_utils._errors import GpuopsError
    with open(argv[0]) as handle:
        config = handle.read()
    desired = {"format": boot_restore.FORMAT, "config": config, "config_name": argv[1], "layouts": None,
               "allow_unmatched": True, "reset": True, "nvidia_smi": "nvidia-smi", "driver_root": os.environ.get("GPUOPS_SIM_DRIVER_ROOT") or "auto",
               "wait_for_driver": 0}
    try:
        if "--check" in argv:
            return IN_PLACE if in_place(desired) else 0
        return boot_restore.restore(desired)
    except GpuopsError as e:
        print(json.dumps({"error": str(e)}))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
