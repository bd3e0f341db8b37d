# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""One wrapper for the collection's filter plugins: a refusal from the logic becomes AnsibleFilterError."""

from __future__ import annotations

from typing import Any, Callable

from ansible.errors import AnsibleFilterError


def as_filter(function: Callable[..., Any],
              errors: type[BaseException] | tuple[type[BaseException], ...]) -> Callable[..., Any]:
    """``function`` as a filter: an exception of the ``errors`` types is raised as AnsibleFilterError (its message)."""
    def run(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except errors as e:
            raise AnsibleFilterError(str(e))
    run.__name__ = function.__name__
    run.__doc__ = function.__doc__
    return run
