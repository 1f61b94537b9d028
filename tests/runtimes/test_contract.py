"""One contract for every local runtime: each head/output pair on tiny random BERTs agrees
with transformers computed directly, padding is invisible, and memory is reported."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.catalog.names import RUNTIMES
from fleetserve.runtimes import Head, Output, Runtime, create_runtime

from ..tiny_onnx import NUM_LABELS, batch, build_head, head_output, model_class

RUNTIME_NAMES = ["torch", "onnx", "openvino"]
CASES = [
    (Head.BASE, Output.MEAN),
    (Head.BASE, Output.CLS),
    (Head.BASE, Output.HIDDEN),
    (Head.MASKED_LM, Output.LOGITS),
    (Head.MASKED_LM, Output.SPLADE),
    (Head.SEQUENCE_CLASSIFICATION, Output.LOGITS),
    (Head.TOKEN_CLASSIFICATION, Output.LOGITS),
]
TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world", "a cat sat on the mat"]
PAIRS = ["river bank", "money and finance in the bank of the river", "dog"]
PER_TOKEN = {Output.HIDDEN, Output.LOGITS}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[Head, Path]:
    root = tmp_path_factory.mktemp("heads")
    return {h: build_head(root / h.value, h, seed=i) for i, h in enumerate(Head)}


@pytest.fixture(scope="module")
def loaded(
    models: dict[Head, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, Head], Runtime]:
    cache = tmp_path_factory.mktemp("cache")
    made: dict[tuple[str, Head], Runtime] = {}

    def get(name: str, head: Head) -> Runtime:
        if (name, head) not in made:
            rt = create_runtime(name, device="cpu", precision="fp32", cache_dir=cache)
            rt.load(models[head], head)
            made[name, head] = rt
        return made[name, head]

    return get


def inputs(path: Path, head: Head) -> dict[str, Any]:
    """Pairs (so token types matter) for sequence classification, single texts otherwise."""
    return batch(path, TEXTS, PAIRS if head is Head.SEQUENCE_CLASSIFICATION else None)


def reference(path: Path, head: Head, output: Output, x: dict[str, Any]) -> np.ndarray[Any, Any]:
    """What transformers gives, reduced here with numpy (independently of the runtimes)."""
    return head_output(model_class(head).from_pretrained(str(path)).eval(), head, output, x)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNTIME_NAMES)
@pytest.mark.parametrize(("head", "output"), CASES, ids=[f"{h}-{o}" for h, o in CASES])
def test_matches_transformers(
    name: str,
    head: Head,
    output: Output,
    models: dict[Head, Path],
    loaded: Callable[[str, Head], Runtime],
) -> None:
    rt = loaded(name, head)
    x = inputs(models[head], head)
    got = rt.run(x["ids"], x["mask"], output, token_type_ids=x["types"])
    want = reference(models[head], head, output, x)
    assert got.dtype == np.float32
    n, seq = x["ids"].shape
    shapes = {
        Output.MEAN: (n, 32),
        Output.CLS: (n, 32),
        Output.HIDDEN: (n, seq, 32),
        Output.SPLADE: (n, want.shape[-1]),
    }
    if output is Output.LOGITS:
        labels = NUM_LABELS.get(head, want.shape[-1])
        shapes[output] = (n, labels) if head is Head.SEQUENCE_CLASSIFICATION else (n, seq, labels)
    assert got.shape == shapes[output] == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
@pytest.mark.parametrize(("head", "output"), CASES, ids=[f"{h}-{o}" for h, o in CASES])
def test_padding_is_invisible(
    name: str,
    head: Head,
    output: Output,
    models: dict[Head, Path],
    loaded: Callable[[str, Head], Runtime],
) -> None:
    """Each item alone, unpadded, gives what its row of the padded batch gives."""
    rt = loaded(name, head)
    x = inputs(models[head], head)
    padded = rt.run(x["ids"], x["mask"], output, token_type_ids=x["types"])
    lengths = x["mask"].sum(1)
    assert len(set(lengths.tolist())) > 1, "the batch must have padding"
    for i, n in enumerate(lengths):
        one = rt.run(
            x["ids"][i : i + 1, :n], x["mask"][i : i + 1, :n], output, x["types"][i : i + 1, :n]
        )
        row = padded[i : i + 1, :n] if output in PER_TOKEN and one.ndim == 3 else padded[i : i + 1]
        np.testing.assert_allclose(one, row, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_token_types_default_to_zeros(
    name: str, models: dict[Head, Path], loaded: Callable[[str, Head], Runtime]
) -> None:
    rt = loaded(name, Head.BASE)
    x = inputs(models[Head.BASE], Head.BASE)
    zeros = rt.run(x["ids"], x["mask"], Output.MEAN, token_type_ids=np.zeros_like(x["ids"]))
    np.testing.assert_allclose(rt.run(x["ids"], x["mask"], Output.MEAN), zeros, rtol=1e-6)
    ones = rt.run(x["ids"], x["mask"], Output.MEAN, token_type_ids=np.ones_like(x["ids"]))
    assert not np.allclose(ones, zeros, atol=1e-3)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_protocol_and_memory(name: str, loaded: Callable[[str, Head], Runtime]) -> None:
    for head in (Head.BASE, Head.MASKED_LM):
        rt = loaded(name, head)
        assert isinstance(rt, Runtime)
        assert rt.name == name and name in RUNTIMES
        assert rt.device == "cpu" and rt.precision == "fp32"
        assert rt.memory_bytes() > 0
    # the masked LM carries a vocabulary projection on top of the same encoder
    assert loaded(name, Head.MASKED_LM).memory_bytes() > loaded(name, Head.BASE).memory_bytes()
