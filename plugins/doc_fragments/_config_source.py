# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):
    """Paired with CONFIG_SOURCE_ARG_SPEC in plugins/module_utils/_common.py (private)."""

    DOCUMENTATION = r"""
options:
  config:
    description:
      - A mig-parted v1 config, inline (the same structure as the file, or the GPU Operator's
        ConfigMap C(config.yaml)) with C(version) and C(mig-configs), each config a list of entries with
        C(devices) (V(all) or GPU indices), optional C(device-filter) (one or a list of C(0xDDDDVVVV)),
        C(mig-enabled) and C(mig-devices) (MIG device name to count, for example C(3g.20gb) or C(1c.3g.20gb)).
      - A mapping, or the config's YAML text (for example a file read on the controller with
        C(lookup('ansible.builtin.file', ...))). Text is parsed strictly, as O(config_file) is. A key that
        appears twice, such as a config name defined twice, is an error instead of the last one winning.
      - Config text, here or in O(config_file), is refused before anything is built from it when it goes past
        the limits on input. It may have at most 1 MiB (1,048,576 characters, or bytes of UTF-8 in a file) and
        collections nested at most 32 deep. Aliases and merge keys may add at most 10,000 values in all, and
        a single value may have at most 4,096 characters. The text must be one document, with no alias inside
        the node it names and no tags but YAML's standard ones for scalars, mappings and lists. The message
        names the source and the line, and quotes only a short excerpt of any value.
      - Mutually exclusive with O(config_file) and O(layouts).
    type: raw
  config_file:
    description:
      - Path, on the managed host, of a mig-parted v1 config file.
      - It must be a regular file (a link to one is followed). A FIFO, a socket, a device or a
        directory is refused before it is opened, as is a file larger than the 1 MiB a config may
        have; a path that cannot be read (missing, no permission, a NUL byte in it) or text that is
        not UTF-8 fails the module with a message naming O(config_file) and the path, before any
        change.
    type: path
  layouts:
    description:
      - Inline per-GPU layouts, for playbooks that do not use mig-parted files. Each item has C(gpus)
        (V(all) or a list of indices), optional C(device_filter) (one or a list of C(0xDDDDVVVV)),
        C(mig_enabled) (default V(true)) and C(devices).
      - C(devices) is either a mapping of MIG device name to count (as mig-parted's C(mig-devices)), or a list
        with one item per GPU instance. A list item has C(profile) (the GPU instance profile, for example
        C(3g.40gb)), optional C(placement) (C(start) and optionally C(size), in memory slices, as
        C(nvidia-smi mig -lgipp) and M(gpuops.mig.mig_facts) show them) and optional C(compute_instances)
        (a list of C(profile), such as C(1c.3g.40gb), and optional C(placement) with C(start) in SM slices
        inside the GPU instance; default one compute instance spanning the GPU instance).
      - An item with a C(placement) is pinned there. Items without one are placed by the planner around the
        pinned ones. A pinned GPU instance that already exists with the same compute instances is kept as it is.
      - A placement the GPU cannot hold (not in the profile's placements, a wrong size, overlapping another
        pin, more instances or SM slices than the GPU has) is refused before any change, naming the GPU, the
        layout and the item.
      - The C(checkpoint) that M(gpuops.mig.mig_facts) returns with O(gpuops.mig.mig_facts#module:checkpoint=true)
        is a value for this option that puts every device back at its placement.
    type: list
    elements: dict
  config_name:
    description:
      - Which config of O(config) or O(config_file) to apply. May be left out when there is only one.
    type: str
  allow_unmatched:
    description:
      - Accept entries that select no GPU on this host. Entries with a C(device-filter) for another
        GPU model are always accepted, so one config can serve a mixed fleet.
    type: bool
    default: false
notes:
  - Profile names are resolved per GPU through NVML, so one config serves a node with several GPU models.
    GPUs that no entry selects are left alone.
"""
