# -*- coding: utf-8 -*-
# Copyright: Contributors to the gpuops.mig collection
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

"""Every Kubernetes call of the collection's own modules is bounded: a connect and a read timeout,
and a few retries with exponential backoff for 5xx answers and connection errors. kubernetes.core's
client sets neither (a hung API server hung the rollout for ever; 40 s of 500s failed it at the
first one).

Private to the collection; no Ansible imports."""

from __future__ import annotations

from typing import Any

CONNECT_TIMEOUT = 10  # seconds to open a connection to the API server
READ_TIMEOUT = 30  # seconds to wait for an answer to one request
RETRIES = 4  # tries after a 5xx or a connection error; backoff 1, 2, 4, 8 s
RETRY_STATUSES = (500, 502, 503, 504)


def retry_policy(retries: int = RETRIES) -> Any:
    """urllib3's Retry for the API: every method (a write carries the resourceVersion read, or is a
    create that answers 409 when an earlier try got through), 5xx answers, connect and read errors.
    """
    from urllib3.util.retry import Retry

    return Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        redirect=0,
        backoff_factor=1,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=None,
        raise_on_status=False,
        respect_retry_after_header=True,
    )


def install() -> None:
    """Bound every request of the kubernetes client in this process (a module's, or the worker's
    that runs one action): its REST client gets retry_policy() for its connection pools, and a
    request without its own _request_timeout gets (CONNECT_TIMEOUT, READ_TIMEOUT), read when it is
    made. Discovery's requests, made while kubernetes.core builds its client, are bounded too.
    Idempotent."""
    from kubernetes.client import rest

    cls = rest.RESTClientObject
    if getattr(cls, "_gpuops_mig_bounded", False):
        return
    init, request = cls.__init__, cls.request

    def bounded_init(self, configuration, *args, **kwargs):
        if getattr(configuration, "retries", None) is None:
            configuration.retries = retry_policy(RETRIES)
        init(self, configuration, *args, **kwargs)

    def bounded_request(self, method, url, *args, **kwargs):
        if not kwargs.get("_request_timeout"):
            kwargs["_request_timeout"] = (CONNECT_TIMEOUT, READ_TIMEOUT)
        return request(self, method, url, *args, **kwargs)

    cls.__init__, cls.request, cls._gpuops_mig_bounded = bounded_init, bounded_request, True


def bounded(get_api_client: Any, *args: Any, **kwargs: Any) -> Any:
    """kubernetes.core's get_api_client(*args, **kwargs), each request of it bounded (install)."""
    install()
    return get_api_client(*args, **kwargs)
