# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Which GPUs a selector names: all, an index, a UUID, a PCI device ID (a model) or a PCI bus ID.

Private to the collection; no Ansible imports (the modules and the engine share it).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from ansible_collections.gpuops.mig.plugins.module_utils._errors import SelectionError, excerpt
from ansible_collections.gpuops.mig.plugins.module_utils._input import pattern, whole

# ASCII digits only: "\u0661" (Arabic-Indic) or "\uff11" (fullwidth) is not GPU 1.
_INDEX = pattern(r"[0-9]+")
# More digits than any GPU index has (and than int() reads: Python refuses over 4300).
_MAX_INDEX_DIGITS = 6
_NOT_A_SELECTOR = ("%s is not a GPU selector: use all, an index (0), a GPU UUID (GPU-...), "
                   "a PCI device ID (0x20B010DE) or a PCI bus ID (0000:07:00.0)")
_DEVICE_ID = pattern(r"0x[0-9a-fA-F]{8}")
# Printable ASCII after GPU- (NVML's UUIDs are hex and dashes).
_UUID = pattern(r"GPU-[!-~]+", re.IGNORECASE)
_BUS_ID = pattern(r"(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def normalize_bus_id(text: str) -> str | None:
    """'07:00.0', '0000:07:00.0' and '00000000:07:00.0' all name the same GPU."""
    m = whole(_BUS_ID, text)
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return "%08X:%s:%s.%s" % (domain, m.group(2).upper(), m.group(3).upper(), m.group(4))


def select_gpus(gpus: Sequence[Mapping[str, Any]], selectors: Iterable[str | int]) -> list[Mapping[str, Any]]:
    """Pick GPUs by selector; ``gpus`` are dicts with index, uuid, pci_device_id, pci_bus_id.

    A selector is ``all``, an index, a GPU UUID, a PCI device ID (0xDDDDVVVV, every
    GPU of that model) or a PCI bus ID. Returns the matching GPUs in index order.
    Raises SelectionError naming the selector that matched nothing or is malformed.
    """
    chosen = {}
    for raw in selectors:
        for g in _match(gpus, _selector_text(raw))[1]:
            chosen[g["index"]] = g
    return [chosen[i] for i in sorted(chosen)]


def explicitly_selected(gpus: Sequence[Mapping[str, Any]], selectors: Iterable[str | int]) -> set[int]:
    """Indexes of GPUs named one by one (index, UUID or bus ID), not through all or a model ID."""
    named = set()
    for raw in selectors:
        kind, matched = _match(gpus, _selector_text(raw))
        if kind in ("index", "uuid", "bus"):
            named.update(g["index"] for g in matched)
    return named


def _selector_text(raw):
    """A selector as text; an int is an index (Ansible passes text, the engine's callers may not).
    Spaces around it are dropped (Ansible splits the string "0, 1" into "0" and " 1"); any other
    white space, a trailing newline say, is part of it and makes it no selector."""
    if isinstance(raw, str):
        return raw.strip(" ")
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < 10 ** _MAX_INDEX_DIGITS:
        return str(raw)
    raise SelectionError(_NOT_A_SELECTOR % excerpt(raw))


def _match(gpus, sel):
    """(kind, matching GPUs) for one selector; SelectionError if malformed or unmatched."""
    if sel.lower() == "all":
        return "all", list(gpus)
    if whole(_INDEX, sel):
        matched = [g for g in gpus if len(sel) <= _MAX_INDEX_DIGITS and g["index"] == int(sel)]
        if not matched:
            raise SelectionError("GPU index %s does not exist on this host (it has %s)"
                                 % (excerpt(sel, quote=False), _describe_indexes(gpus)))
        return "index", matched
    if whole(_UUID, sel):
        matched = [g for g in gpus if g["uuid"].lower() == sel.lower()]
        if not matched:
            raise SelectionError("no GPU with UUID %s on this host" % excerpt(sel, quote=False))
        return "uuid", matched
    if whole(_DEVICE_ID, sel):
        matched = [g for g in gpus if g["pci_device_id"].lower() == sel.lower()]
        if not matched:
            raise SelectionError("no GPU with PCI device ID %s on this host" % sel)
        return "model", matched
    bus = normalize_bus_id(sel)
    if bus:
        matched = [g for g in gpus if normalize_bus_id(g["pci_bus_id"]) == bus]
        if not matched:
            raise SelectionError("no GPU at PCI bus ID %s on this host" % excerpt(sel, quote=False))
        return "bus", matched
    raise SelectionError(_NOT_A_SELECTOR % excerpt(sel))


def _describe_indexes(gpus):
    if not gpus:
        return "no GPUs"
    return "GPU indexes %s" % ", ".join(str(g["index"]) for g in gpus)
