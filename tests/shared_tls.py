"""One TLS context for the tests' ``httpx.get``, ``httpx.post`` and the other verbs.

Each of those calls builds a Client, and each Client an SSL context that reads the
whole CA bundle: about 20 ms of CPU per call on a 2-core EPYC, and the suite makes
thousands of them (every poll of a server's readiness is one), some 100 CPU-seconds
in all (py-spy over the parallel run). The tests speak plain HTTP to loopback, so the
context is never used; they share one, built the same way. A call that passes its
own ``verify`` keeps it."""

from __future__ import annotations

import functools

import httpx
import pytest

VERBS = ("request", "stream", "get", "options", "head", "post", "put", "patch", "delete")


def pytest_configure(config: pytest.Config) -> None:
    context = httpx.create_ssl_context()
    for verb in VERBS:
        original = getattr(httpx, verb)
        if not isinstance(original, functools.partial):  # once per process
            setattr(httpx, verb, functools.partial(original, verify=context))
