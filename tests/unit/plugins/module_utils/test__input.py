"""The shared checks of input (plugins/module_utils/_input.py), issue 36: whole-string formats,
ASCII digits, finite numbers of seconds, and files looked at before they are opened."""

import math
import os
import re
import signal
import socket
from contextlib import contextmanager

import pytest

from ansible_collections.gpuops.mig.plugins.module_utils import _input as checks
from ansible_collections.gpuops.mig.plugins.module_utils._errors import ConfigError, RefusedError

HERE = os.path.dirname(__file__)
PLUGINS = os.path.abspath(os.path.join(HERE, "..", "..", "..", "..", "plugins"))


@contextmanager
def no_hang(seconds=5):
    """Fail the test, rather than hang it, when what runs inside blocks (a FIFO opened for
    reading)."""
    def expired(signum, frame):
        raise AssertionError("blocked for more than %d s" % seconds)
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refusal(path, limit=1024):
    with no_hang(), pytest.raises(checks.FileRefused) as raised:
        checks.read_file(path, "config_file", limit)
    assert isinstance(raised.value, ConfigError)     # what the modules' callers already catch
    return str(raised.value)


def test_a_regular_file_is_read(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n")
    assert checks.read_file(str(path), "config_file", 1024) == "version: v1\n"
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    assert checks.read_file(str(link), "config_file", 1024) == "version: v1\n"


def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    assert refusal(str(fifo)) == ("config_file %s is a FIFO (named pipe), not a regular file; "
                                  "nothing was read from it" % fifo)
    link = tmp_path / "link"
    link.symlink_to(fifo)
    assert "is a FIFO (named pipe), not a regular file" in refusal(str(link))


def test_a_socket_a_device_and_a_directory_are_refused(tmp_path):
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(path)
        assert refusal(path).endswith("is a socket, not a regular file; nothing was read from it")
    finally:
        server.close()
    assert refusal("/dev/zero") == ("config_file /dev/zero is a character device, not a regular "
                                    "file; nothing was read from it")
    assert "is a directory, not a regular file" in refusal(str(tmp_path))


def test_an_embedded_nul_byte_names_the_option_and_the_path():
    message = refusal("/etc/mig\x00.yaml")
    assert message.startswith("config_file '/etc/mig\\x00.yaml' cannot be read: "), message
    assert "null" in message


def test_missing_unreadable_large_and_binary_files_name_the_option_and_the_path(tmp_path):
    missing = tmp_path / "none.yaml"
    assert refusal(str(missing)) == ("config_file %s cannot be read: No such file or directory"
                                     % missing)
    big = tmp_path / "big.yaml"
    with open(str(big), "wb") as handle:    # sparse: the size is looked at, nothing is read
        handle.truncate(10 ** 12)
    assert refusal(str(big)) == ("config_file %s: %d bytes, more than the 1024 it may have"
                                 % (big, 10 ** 12))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe")
    assert refusal(str(binary)).startswith("config_file %s: not UTF-8 text (" % binary)
    if os.geteuid() != 0:      # root reads any file
        secret = tmp_path / "secret.yaml"
        secret.write_text("x")
        secret.chmod(0)
        assert refusal(str(secret)) == "config_file %s cannot be read: Permission denied" % secret
    for odd in ("", None, 5):
        assert refusal(odd).startswith("config_file: a path is needed, got ")


@pytest.mark.parametrize("value, expected", [
    (0, 0), (7, 7), ("0", 0), ("2", 2), ("9" * 18, int("9" * 18)),
    (" 2", None), ("2 ", None), ("2\n", None), ("\t2", None), ("+2", None), ("-1", None),
    (-1, None), ("\u0661", None), ("\uff11", None), ("1\u0662", None), ("\u00b2", None),
    ("9" * 19, None), ("", None),
    (True, None), (2.0, None), (None, None), ([2], None), ("0x10", None), ("1_000", None),
])
def test_counts_are_ascii_digits_and_nothing_else(value, expected):
    assert checks.count(value) == expected


@pytest.mark.parametrize("value, expected", [
    (0, 0), (30, 30), (-5, -5), (2.5, 2.5), ("30", 30), ("2.5", 2.5), ("-5", -5), ("0.0", 0.0),
    (" 30", None), ("30 ", None), ("30\n", None), ("\t30", None), ("+30", None), ("", None),
    ("\u0663\u0660", None), ("\uff13\uff10", None), ("3\u0660", None), ("\u22125", None),
    ("1_000", None), ("1e3", None), ("nan", None), ("NaN", None), ("inf", None), ("-inf", None),
    (".5", None), ("5.", None), ("0x10", None), (True, None), (None, None), ([30], None),
])
def test_numbers_are_ascii_decimal_text_or_numbers(value, expected):
    """Role variables and rendered rulebook options are text: only ASCII digits with a sign and
    a decimal point make a number (float() takes " 30\n", "\uff13\uff10", "1_000" and "nan")."""
    got = checks.number(value)
    assert got == expected and type(got) is type(expected), (value, got)


def test_a_number_may_still_be_nan_or_infinite_for_seconds_to_refuse():
    assert math.isnan(checks.number(math.nan)) and checks.number(math.inf) == math.inf
    for value in (math.nan, math.inf, -5):
        with pytest.raises(RefusedError):
            checks.seconds(checks.number(value), "settle_seconds")


def test_a_count_has_at_most_the_digits_asked_for():
    assert checks.count("9" * 9, 9) == 10 ** 9 - 1
    assert checks.count("1" + "0" * 9, 9) is None


def test_whole_matches_the_whole_value_only():
    profile = checks.pattern(r"[0-9]+g\.[0-9]+gb")
    assert checks.whole(profile, "1g.5gb")
    for odd in ("1g.5gb\n", "1g.5gb ", " 1g.5gb", "\u0661g.5gb", "1g.5gbx", 5, None, b"1g.5gb"):
        assert checks.whole(profile, odd) is None, odd
    assert checks.whole(checks.pattern(r"\d+"), "\u0661") is None      # \d is ASCII here
    assert checks.whole(checks.pattern(r"\s"), "\u00a0") is None


@pytest.mark.parametrize("value", [-5, -0.001, math.nan, math.inf, -math.inf, True, "10", None])
def test_seconds_refuse_negative_nan_and_infinite_values(value):
    with pytest.raises(RefusedError) as raised:
        checks.seconds(value, "force_timeout")
    assert str(raised.value).startswith("force_timeout must be a finite number of seconds, "
                                        "0 or more; got ")


def test_seconds_take_finite_values_within_bounds():
    assert checks.seconds(0, "force_timeout") == 0
    assert checks.seconds(10.5, "force_timeout") == 10.5
    with pytest.raises(RefusedError, match="reset_timeout must be a finite number of seconds, "
                                           "1 or more; got 0.5"):
        checks.seconds(0.5, "reset_timeout", least=1)
    with pytest.raises(RefusedError, match="from 1 to 2; got 3"):
        checks.seconds(3, "x", least=1, most=2)


def plugin_sources():
    for directory, _dirs, files in os.walk(PLUGINS):
        for name in files:
            if name.endswith(".py") and not name.endswith("_pb2.py"):
                path = os.path.join(directory, name)
                with open(path) as handle:
                    yield os.path.relpath(path, PLUGINS), handle.read()


def test_no_format_check_in_plugins_matches_less_than_the_whole_string():
    """Every pattern is compiled through _input.pattern (re.ASCII) and matched whole: no
    re.compile elsewhere, no $ anchor (which lets a trailing newline through), no .match() of a
    constant pattern, no isdigit()."""
    found = []
    for name, source in plugin_sources():
        if name == os.path.join("module_utils", "_input.py"):
            continue
        for number, line in enumerate(source.splitlines(), 1):
            code = line.split("#", 1)[0]
            if "re.compile(" in code:
                found.append("%s:%d re.compile (use _input.pattern)" % (name, number))
            if re.search(r"""\br"[^"]*\$"|\br'[^']*\$'""", code):
                found.append("%s:%d a $ anchor" % (name, number))
            if re.search(r"\bre\.match\(|\b_?[A-Z][A-Z_]*\.match\(", code):
                found.append("%s:%d .match() (use _input.whole)" % (name, number))
            if re.search(r"\.(isdigit|isdecimal|isnumeric)\(", code):
                found.append("%s:%d str digit test (use _input.count)" % (name, number))
    assert found == []
