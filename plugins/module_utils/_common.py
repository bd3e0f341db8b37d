# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""What the gpuops.mig modules share on the Ansible side: option specs, the NVML session,
and the one place an engine error becomes the module's failure.

Private to the collection. Each argument spec here is paired with a doc fragment
(named beside it); change both together.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.mig.plugins.module_utils._errors import (
    ApplyError,
    DriverNotFound,
    GpuopsError,
    MissingLibrary,
    NvmlError,
)
from ansible_collections.gpuops.mig.plugins.module_utils._nvml import (
    DRIVER_ROOT_AUTO,
    PYNVML_IMPORT_ERROR,
    Nvml,
)
from ansible_collections.gpuops.mig.plugins.module_utils._dra_claims import merge as merge_allocations
from ansible_collections.gpuops.mig.plugins.module_utils._podresources import DEFAULT_SOCKET, read_allocations

# Paired with the doc fragment gpuops.mig._gpu_selection.
GPU_SELECTION_ARG_SPEC = dict(
    gpus=dict(type="list", elements="str", default=["all"]),
)

# Paired with the doc fragment gpuops.mig._driver.
DRIVER_ARG_SPEC = dict(
    driver_root=dict(type="str", default=DRIVER_ROOT_AUTO),
)

# Paired with the doc fragment gpuops.mig._config_source.
CONFIG_SOURCE_ARG_SPEC = dict(
    config=dict(type="raw"),   # a mapping, or YAML text read strictly and within limits (_bounded_yaml)
    config_file=dict(type="path"),
    layouts=dict(type="list", elements="dict"),
    config_name=dict(type="str"),
    allow_unmatched=dict(type="bool", default=False),
)
CONFIG_SOURCE_EXCLUSIVE = [("config", "config_file", "layouts")]

# Paired with the doc fragment gpuops.mig._pod_resources.
POD_RESOURCES_ARG_SPEC = dict(
    read_allocations=dict(type="bool", default=True),
    pod_resources_socket=dict(type="path", default=DEFAULT_SOCKET),
    dra_allocations=dict(type="dict"),
)


def allocations_of(module: AnsibleModule) -> dict[str, Any]:
    """Which pods hold which devices, per the module's read_allocations, pod_resources_socket and dra_allocations
    options: ``{"allocations", "allocations_source", "allocations_error"}`` (see _podresources.read_allocations;
    the DRA driver's claims join the kubelet's answer, _dra_claims.merge)."""
    if not module.params["read_allocations"]:
        return {"allocations": None, "allocations_source": None,
                "allocations_error": "not read (read_allocations is false)"}
    return merge_allocations(read_allocations(module.params["pod_resources_socket"]), module.params.get("dra_allocations"))


# What missing_required_lib() adds to its message when the host's Python cannot import pynvml.
NVML_LIBRARY_REASON = ("to read and change the GPUs through NVML (import pynvml). The gpuops.mig.mig_preflight role "
                       "installs it with mig_preflight_install_nvml=true")


def fail_from(module: AnsibleModule, error: GpuopsError, **result: Any) -> NoReturn:
    """End the module with an engine error: its message, the traceback as ``exception``,
    the NVML error by its pynvml name, and after a part-way failure what was done."""
    if isinstance(error, MissingLibrary):
        module.fail_json(msg=missing_required_lib("nvidia-ml-py", reason=NVML_LIBRARY_REASON),
                         exception=PYNVML_IMPORT_ERROR, **result)
    message = str(error)
    if isinstance(error, DriverNotFound):
        message = "No usable NVIDIA driver on this host: %s" % message
    nvml = error if isinstance(error, NvmlError) else error.__cause__
    if isinstance(nvml, NvmlError):
        result.update(nvml_error=nvml.name, nvml_error_code=nvml.code)
    if error.report is not None:
        result["failed_part_way"] = error.report
    if isinstance(error, ApplyError):
        result["changed"] = True
    result.update(error.details)
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    module.fail_json(msg=message, exception=trace, **result)


@contextmanager
def nvml_session(module: AnsibleModule, **result: Any) -> Iterator[Nvml]:
    """An NVML session (driver found per the driver_root option, if the module has it) in
    which any engine error ends the module through fail_from, never as a bare traceback.
    ``result`` is returned with such a failure too."""
    try:
        with Nvml(driver_root=module.params.get("driver_root")) as nvml:
            yield nvml
    except GpuopsError as e:
        fail_from(module, e, **result)
