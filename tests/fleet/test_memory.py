"""fleet.memory: sizes, budgets, the resident set and trimming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleetserve.fleet.memory import (
    DEFAULT_FRACTION,
    default_budget,
    mib,
    parse_limit,
    parse_size,
    peak_bytes,
    process_limit_bytes,
    reset_peak,
    rss_bytes,
    rss_of,
    trim,
)

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", 0),
        ("  ", 0),
        ("2GiB", 2 * GIB),
        ("512MiB", 512 * 2**20),
        ("1.5G", int(1.5 * GIB)),
        ("800M", 800 * 2**20),
        ("800mb", 800 * 2**20),
        ("64k", 64 * 1024),
        ("123456", 123456),
        ("60%", int(0.6 * 10 * GIB)),
        ("100%", 10 * GIB),
    ],
)
def test_parse_size_reads_bytes_units_and_percents(text: str, want: int) -> None:
    assert parse_size(text, limit=10 * GIB) == want


@pytest.mark.parametrize("text", ["0", "0%", "-1G", "150%", "abc", "2 parsecs", "G", "1.2.3M"])
def test_parse_size_refuses_in_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_size(text, limit=10 * GIB)
    message = str(err.value)
    assert "--memory-budget" in message and "\n" not in message
    assert "2GiB" in message and "60%" in message


def test_parse_limit_is_the_one_reader_of_size_limits_that_may_be_off() -> None:
    """--request-memory and --train-memory-limit read sizes through one helper (before:
    each wrapped parse_size its own way, and "off" was 0 for one and an error for the
    other); its error names the flag it was given."""
    for off in ("", "0", " off ", "None"):
        assert parse_limit(off, "--x", limit=GIB, forms="a size") == 0
    assert parse_limit("256MiB", "--x", limit=0, forms="a size") == 256 * 2**20
    assert parse_limit("50%", "--x", limit=GIB, forms="a size") == GIB // 2
    with pytest.raises(ValueError, match=r"^--request-memory: cannot use 'lots'; give a size$"):
        parse_limit("lots", "--request-memory", limit=GIB, forms="a size")


def _root(tmp_path: Path, cgroup: str | None) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       24641536 kB\nMemFree: 1 kB\n")
    if cgroup is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/memory.max").write_text(cgroup + "\n")
    return tmp_path


def test_default_budget_is_a_fraction_of_the_cgroup_limit(tmp_path: Path) -> None:
    root = _root(tmp_path, str(16 * GIB))
    assert process_limit_bytes(root) == 16 * GIB
    n, why = default_budget("cpu", root=root)
    assert n == int(16 * GIB * DEFAULT_FRACTION)
    assert why == "70% of the cgroup limit (16.0 GiB)"


@pytest.mark.parametrize("cgroup", [None, "max", str(64 * GIB)])
def test_default_budget_is_a_fraction_of_physical_ram_without_a_tighter_cgroup(
    tmp_path: Path, cgroup: str | None
) -> None:
    root = _root(tmp_path, cgroup)
    n, why = default_budget("cpu", root=root)
    assert n == int(24641536 * 1024 * DEFAULT_FRACTION)
    assert why == "70% of physical RAM (23.5 GiB)"


def test_this_machine_has_a_limit_and_a_budget() -> None:
    limit = process_limit_bytes()
    assert limit > 256 * 2**20
    n, why = default_budget("cpu")
    assert 0 < n < limit and why.startswith("70% of ")


def test_mib_is_the_one_table_unit() -> None:
    assert mib(0) == "0.0 MiB"
    assert mib(int(123.4 * 2**20)) == "123.4 MiB"
    assert mib(3 * GIB) == "3072.0 MiB"


def test_rss_and_peak_are_sane() -> None:
    rss = rss_bytes()
    assert 10 * 2**20 < rss < process_limit_bytes()
    assert peak_bytes() >= rss
    assert rss_of(os.getpid()) > 0
    assert rss_of(2**22 + 12345) == 0  # no such process
    reset_peak()
    block = np.ones(64 * 2**20, dtype=np.uint8)  # touched: resident
    assert peak_bytes() >= rss_bytes() >= rss + 32 * 2**20
    del block


def test_trim_gives_freed_memory_back() -> None:
    trim()
    base = rss_bytes()
    # many small blocks live on the malloc heap, which free() alone keeps mapped
    blocks = [np.ones(4000, dtype=np.uint8) for _ in range(40_000)]
    grown = rss_bytes()
    assert grown > base + 100 * 2**20
    del blocks
    trim()
    assert rss_bytes() < base + 30 * 2**20, (base, grown, rss_bytes())


def test_frozen_imports_leave_the_collections_and_what_comes_later_is_collected() -> None:
    """``freeze_imports`` (in a fresh interpreter: it acts once per process) takes
    what lives out of every later collection; garbage made after it is still found."""
    code = """if True:
        import gc, json, time, weakref
        import asyncio, email.mime.multipart, http.server, xml.dom.minidom
        from fleetserve.fleet.memory import freeze_imports
        alive = len(gc.get_objects())
        freeze_imports()
        frozen = gc.get_freeze_count()
        more = [[i] for i in range(5000)]
        freeze_imports()  # once per process: these stay collectable
        class Node: ...
        a, b = Node(), Node()
        a.b, b.a = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        print(json.dumps({"alive": alive, "frozen": frozen, "again": gc.get_freeze_count(),
                          "tracked": len(gc.get_objects()), "collected": gone() is None}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["frozen"] >= 0.9 * got["alive"] and got["again"] == got["frozen"], got
    assert 5000 <= got["tracked"] < 10_000 and got["collected"], got
