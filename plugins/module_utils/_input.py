# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Checks of input shared by the modules (on the GPU hosts) and the controller's actions: formats,
numbers of seconds, and files named by an option.

A check matches the whole value or nothing: ``re.match("^...$")`` also takes a value with a
trailing newline ("1g.5gb\\n"), and ``\\d``, ``str.isdigit()`` and ``int()`` take the digits of
every script (Arabic-Indic "\\u0661", fullwidth "\\uff11"). Patterns are compiled here with
re.ASCII and matched with fullmatch; counts are strings of ASCII digits, with no sign and no
space around them, and numbers given as text (role variables, a rulebook's options) ASCII digits
with a sign and a decimal point at most. A file is looked at before it is opened: only a regular
file is read (a FIFO would block the read for ever, a device never ends), and never past a limit.

Private to the collection; no Ansible imports (the boot-time restore runs it too).
"""

from __future__ import annotations

import math
import os
import re
import stat
from typing import Any

from ansible_collections.gpuops.mig.plugins.module_utils._errors import (
    ConfigError,
    RefusedError,
    excerpt,
)

__all__ = ["pattern", "whole", "count", "number", "seconds", "read_file", "FileRefused",
           "LABEL_VALUE"]

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?[0-9]{1,18}(?:\.[0-9]{1,18})?", re.ASCII)
# A Kubernetes label value (and a ConfigMap key): 1 to 63 characters, letters and digits at
# both ends.
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)


def pattern(regex: str, flags: int = 0) -> re.Pattern[str]:
    """``regex`` compiled for whole() (ASCII classes: \\d is 0-9, \\s ASCII white space only)."""
    return re.compile(regex, flags | re.ASCII)


def whole(compiled: re.Pattern[str], value: Any) -> re.Match[str] | None:
    """The match of ``compiled`` over all of ``value``; None for a value that is not a string,
    or that the pattern does not match to its last character (a trailing newline included)."""
    return compiled.fullmatch(value) if isinstance(value, str) else None


def count(value: Any, most_digits: int = 18) -> int | None:
    """``value`` as a whole number of 0 or more: an int (not a bool) or a string of 1 to
    ``most_digits`` ASCII digits (extra vars, surveys and Kubernetes quantities give strings);
    None for anything else (" 2", "2\\n", "+2", "\\u0661", 2.0, True)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and len(value) <= most_digits and _DIGITS.fullmatch(value):
        return int(value)
    return None


def number(value: Any) -> int | float | None:
    """``value`` as a number: an int or a float (not a bool), or a string of ASCII digits with a
    sign and a decimal point at most ("30", "-5", "2.5": role variables, extra vars and a
    rulebook's rendered options are text); None for anything else (" 30", "30\\n",
    "\\u0663\\u0660", "\\uff13", "1_000", "1e3", "nan", "inf", True). A float given as a float may
    still be NaN or infinite, and a number negative: seconds() refuses those."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return float(value) if "." in value else int(value)
    return None


def seconds(value: Any, option: str, least: float = 0, most: float | None = None) -> float:
    """An option's number of seconds checked: finite, at least ``least`` (and at most ``most``);
    RefusedError naming the option otherwise (a negative, NaN or infinite value)."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value >= least and (most is None or value <= most))
    if not ok:
        bound = "%g or more" % least if most is None else "from %g to %g" % (least, most)
        raise RefusedError("%s must be a finite number of seconds, %s; got %s"
                           % (option, bound, excerpt(value)))
    return value


class FileRefused(ConfigError):
    """A file named by an option that is not there, not a regular file, not readable, too large
    or not UTF-8 text; the message names the option and the path."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def read_file(path: Any, option: str, limit: int) -> str:
    """The UTF-8 text of the regular file at ``path`` (an option's value), at most ``limit``
    bytes.

    What the path names is looked at first (os.stat, following links): anything but a regular
    file (a directory, a FIFO, a socket, a device) or a larger one is refused without opening
    it. The file is then opened without blocking and looked at again through its descriptor, in
    case something else took its place meanwhile. Every error of the read (OSError, a NUL byte
    in the path, text that is not UTF-8) is a FileRefused naming ``option`` and the path."""
    if not isinstance(path, str) or not path:
        raise FileRefused("%s: a path is needed, got %s" % (option, excerpt(path)))
    where = "%s %s" % (option, excerpt(path, 200, quote=False))
    try:
        _check_kind(os.stat(path), where, limit)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as handle:
            _check_kind(os.fstat(handle.fileno()), where, limit)
            data = handle.read(limit + 1)
    except FileRefused:
        raise
    except (OSError, ValueError) as e:   # ValueError: an embedded NUL byte
        raise FileRefused("%s cannot be read: %s" % (where, _reason(e)))
    if len(data) > limit:
        raise FileRefused("%s: more than %d bytes, the most it may have" % (where, limit))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileRefused("%s: not UTF-8 text (%s)" % (where, e))


def _check_kind(st, where, limit):
    if not stat.S_ISREG(st.st_mode):
        kind = next((name + ", not a regular file" for test, name in _KINDS if test(st.st_mode)),
                    "not a regular file")
        raise FileRefused("%s is %s; nothing was read from it" % (where, kind))
    if st.st_size > limit:
        raise FileRefused("%s: %d bytes, more than the %d it may have"
                          % (where, st.st_size, limit))


def _reason(error):
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)
