"""A model's weights before it loads: what an earlier load of the same weights on the
same engine measured (kept on disk), else the files' size."""

from __future__ import annotations

from pathlib import Path

from fleetserve.catalog.facts import Facts
from fleetserve.fleet.drift import FLOOR
from fleetserve.worker.estimate import KeptWeights

MIB = 1 << 20
FILES = 16 * MIB


def kept(tmp_path: Path, key: str | None = "k", precision: str = "fp32") -> KeptWeights:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    with open(d / "model.safetensors", "wb") as f:
        f.truncate(FILES)  # (sparse: only its size counts)
    return KeptWeights(Facts(tmp_path / "held", "weights"), lambda: key, lambda: d,
                       precision, "m/1")  # fmt: skip


def facts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "held").glob("*.json"))


def test_before_any_load_it_is_the_files_size_at_the_precision(tmp_path: Path) -> None:
    assert kept(tmp_path)() == FILES
    assert kept(tmp_path, precision="bf16")() == FILES // 2


def test_what_a_load_measured_is_the_next_processs_estimate(tmp_path: Path) -> None:
    kept(tmp_path).remember(2 * FILES)  # an engine that holds twice its files
    assert kept(tmp_path)() == 2 * FILES  # another process, the same key
    assert kept(tmp_path, key="other")() == FILES  # other weights or engine: the files


def test_a_load_within_the_noise_of_the_files_or_below_them_keeps_nothing(
    tmp_path: Path,
) -> None:
    kept(tmp_path).remember(FILES + FLOOR)  # a torch model: what its files say
    kept(tmp_path).remember(FILES // 2)  # a mapped file, half touched: it will hold all
    assert facts(tmp_path) == [] and kept(tmp_path)() == FILES


def test_a_kept_figure_is_written_again_only_past_the_noise_and_5_percent(
    tmp_path: Path,
) -> None:
    k = kept(tmp_path)
    k.remember(4 * FILES)
    (fact,) = facts(tmp_path)
    before = fact.stat().st_mtime_ns
    k.remember(4 * FILES + FLOOR)  # 6 %, but within the noise
    k.remember(4 * FILES - 3 * MIB)
    assert fact.stat().st_mtime_ns == before and k() == 4 * FILES
    k.remember(3 * FILES)
    assert k() == 3 * FILES
    k.remember(FILES // 2)  # kept as measured, but never reserved below the files
    assert k() == FILES


def test_weights_that_cannot_be_keyed_keep_nothing(tmp_path: Path) -> None:
    k = kept(tmp_path, key=None)
    k.remember(2 * FILES)
    assert k() == FILES and not (tmp_path / "held").exists()


def test_a_torn_fact_counts_as_none(tmp_path: Path) -> None:
    kept(tmp_path).remember(2 * FILES)
    (fact,) = facts(tmp_path)
    fact.write_text('{"key": "k", "bytes')
    assert kept(tmp_path)() == FILES
