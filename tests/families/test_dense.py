"""Dense: output dtypes (float16, int8 with scales, packed bits), scoring by cosine."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.assembly import HF_CACHE
from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.sources import resolve
from fleetserve.families.dense import DenseFamily, _b64_rows
from fleetserve.families.quantize import quantize
from fleetserve.runtimes import create_runtime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task
from fleetserve.wire.codec import array_from_wire, dumps, loads

from ..conftest import REAL
from ..tinymodels import build_bert

MP, JS = Encoding.MSGPACK, Encoding.JSON
TEXTS = ["the quick brown fox", "money in the river bank", "a cat sat on the mat"]


@pytest.mark.parametrize("dim", [384, 32, 3, 5])
def test_b64_rows_equal_per_row_encoding(dim: int) -> None:
    arr = np.random.default_rng(0).standard_normal((7, dim)).astype("<f4")
    want = [base64.b64encode(r.tobytes()).decode() for r in arr]
    assert _b64_rows(arr) == want


def call(a: DenseFamily, task: Task, body: dict[str, Any], enc: Encoding = MP) -> Any:
    env = Envelope("r1", a.spec.id, task, enc, enc, 1, time.time() + 30)
    prepared = a.preprocess(env, dumps(body, enc))
    return loads(a.postprocess(env, prepared, list(a.forward(prepared.items))), enc)


def make(spec: ModelSpec, path: Path) -> DenseFamily:
    a = DenseFamily(spec, create_runtime("torch", device="cpu", precision="fp32"), path)
    a.load()
    a.warmup()
    return a


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> DenseFamily:
    path = build_bert(tmp_path_factory.mktemp("dense") / "model")
    spec = ModelSpec.from_dict(
        {"id": "tiny/dense", "source": str(path), "max_seq_len": 16, "dimensions": 32,
         "options": {"query_prefix": "query: ", "document_prefix": "passage: "}}
    )  # fmt: skip
    return make(spec, path)


def test_int8_codes_and_scales(tiny: DenseFamily) -> None:
    want = array_from_wire(call(tiny, Task.ENCODE, {"inputs": TEXTS})["embeddings"])
    for enc in (MP, JS):
        r = call(tiny, Task.ENCODE, {"inputs": TEXTS, "output_dtype": "int8"}, enc)
        codes, scales = array_from_wire(r["embeddings"]), array_from_wire(r["scales"])
        assert r["output_dtype"] == "int8" and codes.shape == (3, 32) and scales.shape == (3,)
        if enc is MP:
            assert codes.dtype == np.int8 and scales.dtype == np.float32
        assert (np.abs(codes).max(axis=1) == 127).all()  # the largest component is +-127
        np.testing.assert_allclose(scales, np.abs(want).max(axis=1) / 127, rtol=1e-6)
        np.testing.assert_allclose(codes * scales[:, None], want, atol=scales.max() / 2 + 1e-7)
        np.testing.assert_array_equal(codes, np.rint(want / np.abs(want).max(1)[:, None] * 127))


def test_binary_sign_bits_packed_big_endian(tiny: DenseFamily) -> None:
    want = array_from_wire(
        call(tiny, Task.ENCODE, {"inputs": TEXTS, "dimensions": 12})["embeddings"]
    )
    r = call(tiny, Task.ENCODE, {"inputs": TEXTS, "output_dtype": "binary", "dimensions": 12})
    packed = array_from_wire(r["embeddings"])
    assert r["dimensions"] == 12 and packed.dtype == np.uint8 and packed.shape == (3, 2)
    for row, vec in zip(packed, want, strict=True):
        bits = [(int(row[k // 8]) >> (7 - k % 8)) & 1 for k in range(16)]  # bit 7 first
        assert bits == [int(v > 0) for v in vec] + [0, 0, 0, 0]
    js = call(tiny, Task.ENCODE, {"inputs": TEXTS, "output_dtype": "binary", "dimensions": 12}, JS)
    assert js["embeddings"] == packed.tolist()


def test_float16_and_invalid_dtypes(tiny: DenseFamily) -> None:
    want = array_from_wire(call(tiny, Task.ENCODE, {"inputs": TEXTS})["embeddings"])
    half = array_from_wire(
        call(tiny, Task.ENCODE, {"inputs": TEXTS, "output_dtype": "float16"})["embeddings"]
    )
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, want, atol=1e-3)
    with pytest.raises(InvalidInput) as info:
        call(tiny, Task.ENCODE, {"inputs": TEXTS, "output_dtype": "uint4"})
    assert info.value.field == "output_dtype"
    body = {"model": "m", "input": TEXTS, "encoding_format": "int8"}
    with pytest.raises(InvalidInput) as info:
        call(tiny, Task.EMBEDDINGS, body, JS)
    assert info.value.field == "encoding_format"


def test_quantize_zero_vector_and_half_rounding() -> None:
    q, s = quantize(np.array([[0.0, 0.0], [0.5, -1.0]], dtype=np.float32), "int8")
    assert s is not None
    assert q.tolist() == [[0, 0], [64, -127]] and s.tolist() == [0.0, np.float32(1 / 127)]


def test_score_is_cosine_of_prefixed_embeddings(tiny: DenseFamily) -> None:
    reply = call(tiny, Task.SCORE, {"query": "brown fox", "items": TEXTS}, JS)
    q = array_from_wire(call(tiny, Task.ENCODE, {"inputs": "query: brown fox"})["embeddings"])
    d = array_from_wire(
        call(tiny, Task.ENCODE, {"inputs": [f"passage: {t}" for t in TEXTS]})["embeddings"]
    )
    np.testing.assert_allclose(reply["scores"], d @ q[0], atol=1e-5)
    assert reply["ranking"] == list(np.argsort(-np.asarray(reply["scores"])))
    assert reply["usage"]["tokens"] > 4
    docs = [{"text": t} for t in TEXTS]
    body = {"model": "tiny/dense", "query": "brown fox", "documents": docs, "top_n": 2}
    rr = call(tiny, Task.RERANK, body)
    assert [r["index"] for r in rr["results"]] == reply["ranking"][:2]
    assert "document" not in rr["results"][0]
    np.testing.assert_allclose(rr["results"][0]["relevance_score"], max(reply["scores"]))


def test_score_validation(tiny: DenseFamily) -> None:
    long = " ".join(["fox"] * 40)
    for task, body, field in [
        (Task.SCORE, {"query": "fox", "items": []}, "items"),
        (Task.SCORE, {"query": "", "items": ["a"]}, "query"),
        (Task.SCORE, {"query": "fox", "items": ["a", long], "truncate": False}, "items[1]"),
        (Task.SCORE, {"query": long, "items": ["a"], "truncate": False}, "query"),
        (Task.RERANK, {"model": "m", "query": "fox", "documents": ["a"], "top_n": 0}, "top_n"),
    ]:
        with pytest.raises(InvalidInput) as info:
            call(tiny, task, body)
        assert info.value.field == field


@pytest.mark.slow
def test_real_minilm_scores_the_relevant_document_first() -> None:
    spec = Catalog.load().get(REAL)
    a = make(spec, resolve(REAL, spec.sources, HF_CACHE))
    docs = [
        "The stock market fell sharply on Tuesday.",
        "Giant pandas feed almost entirely on bamboo shoots and leaves.",
        "Python is a popular programming language.",
    ]
    reply = call(a, Task.RERANK, {"model": REAL, "query": "What do pandas eat?", "documents": docs})
    assert reply["results"][0]["index"] == 1
    assert reply["results"][0]["relevance_score"] > reply["results"][1]["relevance_score"] + 0.2
