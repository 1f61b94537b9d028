"""CPU steal from ``/proc/stat``'s text: the aggregate line, the fraction between two
readings, and "unknown" where there is nothing to read."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.bench.tune import steal
from fleetserve.bench.tune.steal import CpuTimes

STAT = """\
cpu  195083 0 13232 907239 1128 0 383 3419 0 0
cpu0 97000 0 6600 453000 560 0 190 1700 0 0
cpu1 98083 0 6632 454239 568 0 193 1719 0 0
intr 123456 0 0
ctxt 987654
"""


def test_the_aggregate_cpu_line_is_parsed_steal_is_the_eighth_value() -> None:
    got = steal.parse(STAT)
    assert got == CpuTimes(total=195083 + 13232 + 907239 + 1128 + 383 + 3419, steal=3419)


def test_guest_time_is_not_counted_twice() -> None:
    # guest and guest_nice (9th and 10th) are already inside user and nice
    assert steal.parse("cpu  100 0 0 100 0 0 0 50 40 10\n") == CpuTimes(250, 50)


def test_a_kernel_without_a_steal_column_has_no_steal() -> None:
    assert steal.parse("cpu  100 5 20 875\n") == CpuTimes(1000, 0)


@pytest.mark.parametrize(
    "text", ["", "cpu0 1 2 3 4 5 6 7 8\n", "cpu  1 2 x 4 5 6 7 8\n", "cpu  1 2\n"]
)
def test_text_without_an_aggregate_line_reads_as_unknown(text: str) -> None:
    assert steal.parse(text) is None


def test_steal_is_a_fraction_of_the_cpu_time_between_two_readings() -> None:
    before = steal.parse("cpu  1000 0 0 1000 0 0 0 100 0 0\n")
    after = steal.parse("cpu  1900 0 0 1050 0 0 0 150 0 0\n")
    # 900 user + 50 idle + 50 steal elapsed: 5% of it stolen
    assert steal.fraction(before, after) == pytest.approx(0.05)
    assert steal.window(before, after) == CpuTimes(1000, 50)


def test_no_elapsed_time_or_an_unknown_reading_gives_no_fraction() -> None:
    a = CpuTimes(1000, 10)
    assert steal.fraction(a, a) is None
    assert steal.fraction(None, a) is None and steal.fraction(a, None) is None
    assert steal.window(CpuTimes(2000, 20), a) is None  # counters went backwards


def test_windows_add_up_to_the_runs_steal() -> None:
    total = CpuTimes(0, 0) + CpuTimes(1000, 0) + CpuTimes(1000, 100)
    assert total.fraction == pytest.approx(0.05)


def test_reading_a_file_and_a_machine_without_proc_stat(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    f.write_text(STAT)
    assert steal.read(f) == steal.parse(STAT)
    assert steal.read(tmp_path / "absent") is None


def test_the_description_says_unknown_and_when_the_machine_is_shared() -> None:
    assert "unknown" in steal.describe(None)
    assert steal.describe(0.002) == "CPU steal 0.2%"
    assert "being shared" in steal.describe(0.08)
    assert "shared" not in steal.describe(0.05)
