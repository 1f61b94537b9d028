"""Batch widths are rounded up to a multiple of 16 tokens (fewer shapes for the runtimes'
per-shape kernel caches), never past the model's limit, without changing the outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.catalog import ModelSpec
from fleetserve.families.base import PAD_MULTIPLE, pad_batch, padded_width
from fleetserve.families.dense import DenseFamily
from fleetserve.runtimes import create_runtime
from fleetserve.runtimes.base import Output

from ..tinymodels import build_bert

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"] * 4


def test_padded_width_rounds_up_within_the_limit() -> None:
    assert PAD_MULTIPLE == 16
    assert [padded_width(n, 512) for n in (1, 15, 16, 17, 33, 500)] == [16, 16, 16, 32, 48, 512]
    assert padded_width(70, 77) == 77  # capped at the model's limit, not 80
    assert padded_width(77, 77) == 77
    assert padded_width(9, 8) == 9  # never below the longest item
    assert [padded_width(n) for n in (1, 17, 33)] == [1, 17, 33]  # no limit: unchanged


def test_pad_batch_masks_the_added_positions() -> None:
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=0, limit=128)
    assert ids.shape == mask.shape == (2, 16)
    assert ids[0, :3].tolist() == [5, 6, 7] and ids[1, 0] == 8
    assert mask.sum(1).tolist() == [3, 1] and not ids[:, 3:].any()
    assert pad_batch([[5, 6, 7]], pad_id=0)[0].shape == (1, 3)


def make(tmp: Path, max_positions: int) -> tuple[DenseFamily, list[tuple[int, ...]]]:
    path = build_bert(tmp / "model", max_positions=max_positions)
    spec = ModelSpec.from_dict(
        {"id": "tiny/pad", "source": str(path), "max_seq_len": max_positions, "dimensions": 32}
    )
    runtime = create_runtime("torch", device="cpu", precision="fp32")
    shapes: list[tuple[int, ...]] = []
    run = runtime.run

    def spy(ids: Any, mask: Any, output: Output, token_type_ids: Any = None) -> Any:
        shapes.append(ids.shape)
        return run(ids, mask, output, token_type_ids)

    runtime.run = spy  # type: ignore[method-assign,assignment]
    a = DenseFamily(spec, runtime, path)
    a.load()
    shapes.clear()
    return a, shapes


@pytest.mark.parametrize("lengths", [(3, 9), (5, 17, 2), (31,)])
def test_dense_embeddings_do_not_change_with_the_padding(
    tmp_path: Path, lengths: tuple[int, ...]
) -> None:
    a, shapes = make(tmp_path, 128)
    items, _ = a.tokenizer.encode([" ".join(WORDS[:n]) for n in lengths], truncate=True)
    got = np.stack(list(a.forward(items)))
    longest = max(len(x) for x in items)
    assert shapes == [(len(items), -(-longest // 16) * 16)]
    ids, mask = pad_batch(items, a.tokenizer.pad_id)  # the exact width, as before
    assert ids.shape[1] == longest
    want = a.runtime.run(ids, mask, Output(a.spec.pooling))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_dense_never_pads_past_the_model_limit(tmp_path: Path) -> None:
    a, shapes = make(tmp_path, 20)  # 20 positions: rounding 18 up to 32 would fail
    items, _ = a.tokenizer.encode([" ".join(WORDS * 3)], truncate=True)
    assert len(items[0]) == 20
    out = list(a.forward([items[0][:18]]))
    assert shapes == [(1, 20)] and np.isfinite(out[0]).all()
