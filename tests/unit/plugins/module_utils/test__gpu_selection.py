"""GPU selection: every selector form, and errors that name the selector."""

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils._gpu_selection import (
    SelectionError,
    normalize_bus_id,
    select_gpus,
)

GPUS = [
    {"index": 0, "uuid": "GPU-aaaa", "pci_device_id": "0x20B010DE", "pci_bus_id": "00000000:07:00.0"},
    {"index": 1, "uuid": "GPU-bbbb", "pci_device_id": "0x20B010DE", "pci_bus_id": "00000000:0F:00.0"},
    {"index": 2, "uuid": "GPU-cccc", "pci_device_id": "0x233010DE", "pci_bus_id": "00000000:47:00.0"},
]


def indexes(selectors):
    return [g["index"] for g in select_gpus(GPUS, selectors)]


def test_selectors():
    assert indexes(["all"]) == [0, 1, 2]
    assert indexes(["2", "0"]) == [0, 2]
    assert indexes(["GPU-BBBB"]) == [1]
    assert indexes(["0x20b010de"]) == [0, 1]
    assert indexes(["0000:47:00.0"]) == [2]
    assert indexes(["47:00.0", "2"]) == [2]


def test_bus_ids_normalise():
    assert normalize_bus_id("07:00.0") == "00000000:07:00.0"
    assert normalize_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert normalize_bus_id("nope") is None


@pytest.mark.parametrize("selector, message", [
    ("5", "GPU index 5 does not exist on this host (it has GPU indexes 0, 1, 2)"),
    ("GPU-dddd", "no GPU with UUID GPU-dddd on this host"),
    ("0x26B910DE", "no GPU with PCI device ID 0x26B910DE on this host"),
    ("0000:99:00.0", "no GPU at PCI bus ID 0000:99:00.0 on this host"),
    ("first", "'first' is not a GPU selector"),
    ("-1", "'-1' is not a GPU selector"),
])
def test_bad_selectors(selector, message):
    with pytest.raises(SelectionError) as e:
        select_gpus(GPUS, [selector])
    assert str(e.value).startswith(message)
