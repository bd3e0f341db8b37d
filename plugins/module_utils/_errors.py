# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""The errors the engine raises. Private to the collection; no Ansible imports.

Every error is a GpuopsError whose text a person understands and that names the
host's GPU, the config source and the entry where it can. Engine code raises;
only _common.fail_from turns an error into the module's failure.
"""

from __future__ import annotations

import reprlib
from typing import Any, Mapping, Sequence


class GpuopsError(Exception):
    """Base of the engine's errors.

    ``report`` is set when the failure came after changes began: per GPU what
    was done and what was not, so the caller can say what the next run does.
    ``details`` are further result keys for the caller (the per-GPU view of a refusal).
    """

    def __init__(self, message: str, report: Any = None, details: Mapping[str, Any] | None = None) -> None:
        super(GpuopsError, self).__init__(message)
        self.report = report
        self.details = dict(details or {})


class ConfigError(GpuopsError):
    """A mig-parted config or inline layout that cannot be used (found before any change)."""


class ParseError(ConfigError):
    """Config text that is not valid YAML, or that goes past the limits on input (size, nesting,
    aliases, value length) before anything is built from it."""


class SelectionError(GpuopsError):
    """A GPU selector that is malformed or matches no GPU."""


class LayoutError(GpuopsError):
    """A target that no placement of the GPU can hold, or an unsafe plan (found before any change)."""


class RefusedError(GpuopsError):
    """Bad input or an unsafe change for this host, found before anything was changed: the engine's refusals
    on the host, and on the controller a node the rollout must not touch or role settings that are wrong
    (the node decisions of plugin_utils and gpuops.mig.mig_node_preview), with the reason."""


class ApplyError(GpuopsError):
    """A failure after changes began; ``report`` says what was done and what was not."""


class AllocationsUnreadable(GpuopsError):
    """The kubelet's PodResources API could not be read (no socket, no answer, an answer that is not one)."""


class NvmlError(GpuopsError):
    """An NVML failure, phrased for a person.

    ``code`` is NVML's return code and ``name`` its pynvml name (NVML_ERROR_IN_USE), when known.
    ``recreated`` lists the MIG device UUIDs of compute instances created again after the
    failure (the put-back of Nvml.destroy_gpu_instance): the failure did change something.
    """

    def __init__(self, message: str, code: int | None = None, name: str | None = None, report: Any = None,
                 details: Mapping[str, Any] | None = None, recreated: Sequence[str] = ()) -> None:
        super(NvmlError, self).__init__(message, report, details)
        self.code = code
        self.name = name
        self.recreated = list(recreated)


class MissingLibrary(NvmlError):
    """nvidia-ml-py (import pynvml) is not installed on the host."""


class DriverNotFound(NvmlError):
    """No usable NVIDIA driver: no libnvidia-ml.so.1 on the host or under a driver root, or no kernel driver."""


class _Excerpt(reprlib.Repr):
    """repr() that stops early: a few items, a few levels, a short string."""

    def __init__(self, limit):
        super(_Excerpt, self).__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 4
        self.maxstring = self.maxother = self.maxlong = limit

    def repr_int(self, x, level):
        # repr() of an int with more than 4300 digits raises ValueError (Python 3.11+).
        if x.bit_length() > 4 * self.maxlong:
            return "<int of %d bits>" % x.bit_length()
        return super(_Excerpt, self).repr_int(x, level)


def excerpt(value: Any, limit: int = 60, quote: bool = True) -> str:
    """A short, escaped text of ``value`` for a message: its repr() cut to about ``limit`` characters
    (and a few items, a few levels deep), never the whole of a value that may be huge or hostile.
    With ``quote=False`` a short printable string is shown as it is."""
    if isinstance(value, str):
        if not quote and len(value) <= limit and value.isprintable():
            return value
        text = repr(value[:limit])
        if len(value) > limit:
            text += "..."
    else:
        text = _Excerpt(limit).repr(value)
    return text if len(text) <= 2 * limit else text[:2 * limit] + "..."
