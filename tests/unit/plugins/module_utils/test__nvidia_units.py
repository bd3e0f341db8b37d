from ansible_collections.gpuops.mig.plugins.module_utils import _nvidia_units as units


def test_parse_show():
    assert units.parse_show("LoadState=loaded\nUnitFileState=enabled\n") == {"present": True, "enabled": True}
    assert units.parse_show("LoadState=loaded\nUnitFileState=disabled\n") == {"present": True, "enabled": False}
    assert units.parse_show("LoadState=not-found\nUnitFileState=\n") == {"present": False, "enabled": False}
    assert units.parse_show("") == {"present": False, "enabled": False}


def test_selected_config_from_the_drop_in():
    assert units.selected_config('[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-disabled"\n') == "all-disabled"
    assert units.selected_config('[Service]\nEnvironment=A=1 "MIG_PARTED_SELECTED_CONFIG=all-1g.10gb"\n') == \
        "all-1g.10gb"
    assert units.selected_config("[Service]\n") is None and units.selected_config(None) is None


def test_state_reads_the_drop_in_and_the_marker_under_root(tmp_path):
    override = tmp_path / units.OVERRIDE
    override.parent.mkdir(parents=True)
    override.write_text('[Service]\nEnvironment="MIG_PARTED_SELECTED_CONFIG=all-balanced"\n')
    got = units.state("LoadState=loaded\nUnitFileState=enabled\n", str(tmp_path))
    assert got == {"unit": units.UNIT, "present": True, "enabled": True, "selected_config": "all-balanced",
                   "override": str(override), "marker": str(tmp_path / units.MARKER), "disabled_by_gpuops": False}
    marker = tmp_path / units.MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    assert units.state(None, str(tmp_path))["disabled_by_gpuops"] is True
    assert units.state(None, str(tmp_path))["present"] is False
