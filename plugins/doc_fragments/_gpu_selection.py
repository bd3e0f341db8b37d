# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """Paired with GPU_SELECTION_ARG_SPEC in plugins/module_utils/_common.py (private)."""

    DOCUMENTATION = r"""
options:
  gpus:
    description:
      - The GPUs to act on.
      - Each item is V(all), a GPU index (V(0)), a GPU UUID (V(GPU-...)), a PCI device ID
        in the C(0xDDDDVVVV) form used by mig-parted's C(device-filter) (every GPU of that
        model, for example V(0x20B010DE)), or a PCI bus ID (V(0000:07:00.0)).
      - A selector that matches no GPU is an error, and nothing is changed.
      - An index is ASCII digits only; digits of other scripts (Arabic-Indic, fullwidth) are no
        selector. Spaces around an item are dropped (Ansible splits V(0, 1) into V(0) and V( 1));
        any other white space, such as a trailing newline, makes the item no selector.
    type: list
    elements: str
    default: [all]
notes:
  - Set the environment variable E(GPUOPS_MIG_SIMULATE) to the path of a simulated host's state file
    to run against simulated GPUs (see the collection's C(docs/simulator.md)); without it the real
    driver is used.
"""
