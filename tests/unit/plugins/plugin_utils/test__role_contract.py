"""One contract for the roles: meta/argument_specs.yml, defaults/main.yml, gpuops.mig.mig_node_preview's options
(the action's argument spec and its module docs), the docs' variable tables and the shared constants, held
against each other."""

import glob
import os
import re

import pytest
import yaml

from ansible_collections.gpuops.mig.plugins.action import mig_node_preview as preview_action
from ansible_collections.gpuops.mig.plugins.module_utils import _boot_restore as boot_restore
from ansible_collections.gpuops.mig.plugins.module_utils import _k8s_objects as k8s_objects
from ansible_collections.gpuops.mig.plugins.modules import mig_boot_restore as boot_restore_module
from ansible_collections.gpuops.mig.plugins.modules import mig_node_preview as preview_docs
from ansible_collections.gpuops.mig.plugins.plugin_utils import _role_contract as contract

ROOT = os.path.dirname(contract.ROLES_DIR)
ROLES = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
               for p in glob.glob(os.path.join(contract.ROLES_DIR, "*", "meta", "argument_specs.yml")))

# A role default that falls back to a shared variable: the spec documents the fallback and names the variable.
SHARED_FALLBACK = re.compile(r"^\{\{ *(gpuops_mig_\w+) *\| *default\((.*?)(?:, *true)?\) *\}\}$")
# A role default that is another variable of the play, with no literal default at all.
PLAY_VARIABLE = re.compile(r"^\{\{ *(\w+) *\}\}$")


def load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


def entry_points(role):
    return load("roles", role, "meta", "argument_specs.yml")["argument_specs"]


def text_of(description):
    return " ".join(description) if isinstance(description, list) else str(description or "")


def test_the_roles_are_found():
    assert ROLES == ["mig_device_plugin", "mig_node", "mig_preflight"]


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_documents_exactly_the_defaults(role):
    defaults = load("roles", role, "defaults", "main.yml")
    for entry, spec in entry_points(role).items():
        assert sorted(spec["options"]) == sorted(defaults), "%s entry point %s" % (role, entry)


def documented_default_problem(name, documented, value):
    """Why the argument spec's default of name does not say what defaults/main.yml sets (None: it does)."""
    described = text_of(documented.get("description"))
    if isinstance(value, str) and "{{" in value:
        shared, play = SHARED_FALLBACK.match(value), PLAY_VARIABLE.match(value)
        if shared:
            fallback = yaml.safe_load(shared.group(2).replace("'", '"'))
            if documented.get("default") != fallback:
                return "%s: documented default %r, but without %s it is %r" % (
                    name, documented.get("default"), shared.group(1), fallback)
            if "C(%s)" % shared.group(1) not in described:
                return "%s: the description does not say that C(%s) sets it" % (name, shared.group(1))
            return None
        if play:
            if "default" in documented or "C(%s)" % play.group(1) not in described:
                return "%s: defaults to %s; document no default and name C(%s)" % (name, value, play.group(1))
            return None
        return "%s: a computed default (%s) the test cannot compare" % (name, value)
    if documented.get("default") != value:
        return "%s: documented default %r, defaults/main.yml %r" % (name, documented.get("default"), value)
    return None


@pytest.mark.parametrize("role", ROLES)
def test_documented_defaults_are_the_real_ones(role):
    defaults = load("roles", role, "defaults", "main.yml")
    problems = [documented_default_problem(name, documented, defaults[name])
                for spec in entry_points(role).values() for name, documented in spec["options"].items()]
    assert [p for p in problems if p] == []


def test_a_wrong_documented_default_is_found():
    assert documented_default_problem("x", {"default": "mixed"}, "{{ gpuops_mig_strategy | default('') }}") == \
        "x: documented default 'mixed', but without gpuops_mig_strategy it is ''"
    assert "does not say" in documented_default_problem("x", {"default": ""}, "{{ gpuops_mig_strategy | default('') }}")
    assert documented_default_problem("x", {"default": 5}, 6) == "x: documented default 5, defaults/main.yml 6"
    assert "document no default" in documented_default_problem("x", {"default": "a"}, "{{ inventory_hostname }}")


def documented_options():
    return yaml.safe_load(preview_docs.DOCUMENTATION)["options"]


def as_validated(documented):
    """A documented option as the validator sees it (no prose; no default is a default of None)."""
    spec = contract.validator_spec(documented)
    spec.setdefault("default", None)
    if "options" in spec:
        spec["options"] = dict((name, as_validated(sub)) for name, sub in documented["suboptions"].items())
    return spec


def test_the_action_spec_is_what_its_module_docs_say():
    docs = documented_options()
    for name, documented in docs.items():
        documented = dict(documented)
        if "suboptions" in documented:
            documented["options"] = documented["suboptions"]
        spec = dict(preview_action.ARGUMENT_SPEC[name])
        spec.setdefault("default", None)
        assert as_validated(documented) == spec, name
    assert sorted(docs) == sorted(preview_action.ARGUMENT_SPEC)


def test_the_role_fed_options_are_the_role_spec_options():
    role_spec = contract.argument_spec("mig_node")
    for option, variable in preview_action.ROLE_OPTIONS:
        expected = contract.validator_spec(role_spec[variable])
        if option == "config":          # the action also takes a config as text
            expected["type"] = "raw"
        assert preview_action.ARGUMENT_SPEC[option] == expected, option
    for setting, variable in preview_action.RESTORE_OPTIONS:
        assert variable in role_spec, setting


def test_role_variables_option_names_every_variable_it_reads():
    described = text_of(documented_options()["role_variables"]["description"])
    named = set(re.findall(r"C\((mig_node_\w+)\)", described))
    fed = set(variable for dummy, variable in preview_action.ROLE_OPTIONS)
    restore = set(variable for dummy, variable in preview_action.RESTORE_OPTIONS)
    assert named - fed == {"mig_node_reset_gpus"}
    assert fed <= named
    assert all(v in named or v.startswith("mig_node_persist") for v in restore) and "C(mig_node_persist*)" in described


def test_the_preflight_suboptions_have_the_mig_preflight_role_types():
    role_spec = contract.argument_spec("mig_preflight")
    for name, spec in preview_action.ARGUMENT_SPEC["preflight"]["options"].items():
        documented = role_spec["mig_preflight_" + name]
        assert (spec["type"], spec.get("elements")) == (documented["type"], documented.get("elements")), name


def test_role_variables_with_the_option_name_of_another_role_variable_are_named_in_one_place():
    assert contract.node_role_variable("config") == "mig_node_config"
    assert contract.node_role_variable("strategy") == "mig_node_mig_strategy"
    assert contract.node_role_variable("restore.lib_dir") == "mig_node_persist_lib_dir"
    assert contract.node_role_variable("restore.reset") == "mig_node_reset_gpus"


def docs_default_rows(path):
    """(file, role variable, documented value) from markdown rows `| `var`[, `var`] | `value`[, `value`] | ...`."""
    variables = set(name for role in ROLES for spec in entry_points(role).values() for name in spec["options"])
    rows = []
    with open(os.path.join(ROOT, path)) as handle:
        for line in handle:
            cells = line.split("|")
            if not line.startswith("| `") or len(cells) < 4:
                continue
            names = [n for n in re.findall(r"`([^`]+)`", cells[1]) if n in variables]
            values = re.findall(r"`([^`]*)`", cells[2])
            if names and len(names) == len(values) and not re.sub(r"`[^`]*`|[ ,/]", "", cells[2]):
                rows.extend((path, name, yaml.safe_load(value) if value else "") for name, value in zip(names, values))
    return rows


def test_the_docs_variable_tables_give_the_real_defaults():
    defaults = {}
    for role in ROLES:
        defaults.update(load("roles", role, "defaults", "main.yml"))
    rows = [row for path in ("docs/rollout.md", "docs/gpu-operator.md", "README.md") for row in docs_default_rows(path)]
    assert len(rows) >= 10
    wrong = []
    for path, name, value in rows:
        real = defaults[name]
        shared = SHARED_FALLBACK.match(real) if isinstance(real, str) else None
        if shared:
            real = yaml.safe_load(shared.group(2).replace("'", '"'))
        if value != real:
            wrong.append("%s: %s documented as %r, is %r" % (path, name, value, real))
    assert wrong == []


def test_the_role_names_the_labels_and_annotations_as_the_code_does():
    role_vars = load("roles", "mig_node", "vars", "main.yml")
    assert {
        "__mig_node_label_config": k8s_objects.LABEL_CONFIG,
        "__mig_node_label_state": k8s_objects.LABEL_STATE,
        "__mig_node_operand_label_prefix": k8s_objects.LABEL_DEPLOY_PREFIX,
        "__mig_node_paused_value": k8s_objects.PAUSED_VALUE,
        "__mig_node_cordoned_annotation": k8s_objects.ANNOTATION_CORDONED,
        "__mig_node_evict_label": k8s_objects.LABEL_EVICT,
        "__mig_node_smoke_label": k8s_objects.LABEL_SMOKE_TEST,
    } == dict((name, role_vars[name]) for name in (
        "__mig_node_label_config", "__mig_node_label_state", "__mig_node_operand_label_prefix",
        "__mig_node_paused_value", "__mig_node_cordoned_annotation", "__mig_node_evict_label",
        "__mig_node_smoke_label"))


def test_the_restore_paths_have_one_default():
    role = load("roles", "mig_node", "defaults", "main.yml")
    expected = {"config_dir": boot_restore.DEFAULT_CONFIG_DIR, "lib_dir": boot_restore.DEFAULT_ENGINE_DIR,
                "script": boot_restore.DEFAULT_SCRIPT, "unit_dir": boot_restore.DEFAULT_UNIT_DIR}
    assert dict((name, role["mig_node_persist_" + name]) for name in expected) == expected
    module_docs = yaml.safe_load(boot_restore_module.DOCUMENTATION)["options"]
    assert dict((name, module_docs[name]["default"]) for name in expected) == expected
    with open(os.path.join(ROOT, "tools", "gpuops-mig-restore")) as handle:
        assert 'DEFAULT_ENGINE_DIR = "%s"' % boot_restore.DEFAULT_ENGINE_DIR in handle.read()
    assert boot_restore.DEFAULT_DESIRED == os.path.join(boot_restore.DEFAULT_CONFIG_DIR, boot_restore.DESIRED_FILE)
