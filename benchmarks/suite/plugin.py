"""The pytest side of ``python -m benchmarks suite``: when each test ran, in which process.

Loaded into every pytest the command starts (``PYTEST_ADDOPTS=-p benchmarks.suite.plugin``)
and idle unless ``SUITE_CPU_OUT`` names a folder. Each process appends JSON lines to a
file of its own there (``<pid>.jsonl``): a session's start and end (with its first
arguments, which tell the suite's phases apart, and its xdist worker id), and each test's
node id with its start and end times. The CPU itself is read from ``/proc`` by the bench
(benchmarks/suite/sampler.py), which puts each process's CPU on the test its worker ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

OUT_VAR = "SUITE_CPU_OUT"


def _write(record: dict[str, Any]) -> None:
    out = os.environ.get(OUT_VAR)
    if out:
        with (Path(out) / f"{os.getpid()}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_sessionstart(session: pytest.Session) -> None:
    _write({"session": os.getpid(), "at": time.time(), "event": "start",
            "argv": sys.argv[1:], "worker": _worker()})  # fmt: skip


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write({"session": os.getpid(), "at": time.time(), "event": "end", "worker": _worker()})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    t0 = time.time()
    try:
        return (yield)
    finally:
        _write({"test": item.nodeid, "pid": os.getpid(), "t0": t0, "t1": time.time()})
