"""The cross-encoder family on a tiny random BERT, against sentence-transformers' CrossEncoder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from fleetserve.catalog import ModelSpec
from fleetserve.families.cross_encoder import CrossEncoderFamily
from fleetserve.runtimes import create_runtime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task

from ..tiny_rerank import build_cross_encoder
from .worker_like import run_like_worker

MAX_LEN = 24
QUERY = "the quick brown fox"
DOCS = [
    "the lazy dog sat on the mat",
    "river bank money finance " * 12,  # far longer than the window
    "a cat",
    "open vector search for the fleet",
    "water",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("ce") / "model")


def make_family(path: Path, runtime: str = "torch", **options: Any) -> CrossEncoderFamily:
    spec = ModelSpec(
        id="tiny/cross-encoder",
        family="cross_encoder",
        runtime=runtime,
        sources=(str(path),),
        max_seq_len=MAX_LEN,
        options=options,
    )
    rt = create_runtime(runtime, device="cpu", precision="fp32", cache_dir=path.parent / "cache")
    adapter = CrossEncoderFamily(spec, rt, path)
    adapter.load()
    adapter.warmup()
    return adapter


@pytest.fixture(scope="module")
def adapter(model_dir: Path) -> CrossEncoderFamily:
    return make_family(model_dir)


def envelope(task: Task, enc: Encoding = Encoding.JSON) -> Envelope:
    return Envelope("r1", "tiny/cross-encoder", task, enc, enc, 1, time.time() + 60)


def call(a: CrossEncoderFamily, task: Task, body: dict[str, Any], enc: Encoding = Encoding.JSON):
    env = envelope(task, enc)
    raw = msgspec.msgpack.encode(body) if enc is Encoding.MSGPACK else json.dumps(body).encode()
    reply, prepared = run_like_worker(a, env, raw)
    dec = msgspec.msgpack.decode(reply) if enc is Encoding.MSGPACK else json.loads(reply)
    return dec, prepared


def reference(path: Path, activation: Any = None) -> np.ndarray:
    import torch
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(path), max_length=MAX_LEN, device="cpu")
    kw = {} if activation is None else {"activation_fn": activation}
    with torch.inference_mode():
        return np.asarray(ce.predict([(QUERY, d) for d in DOCS], **kw), dtype=np.float64)


@pytest.mark.parametrize("activation", ["default", "none"])
def test_scores_equal_sentence_transformers(model_dir: Path, activation: str) -> None:
    import torch

    if activation == "default":
        a, want = make_family(model_dir), reference(model_dir)
    else:
        a, want = (
            make_family(model_dir, activation="none"),
            reference(model_dir, torch.nn.Identity()),
        )
    got, _ = call(a, Task.SCORE, {"query": QUERY, "items": DOCS})
    assert np.abs(np.asarray(got["scores"]) - want).max() < 1e-5
    assert got["ranking"] == [int(i) for i in np.argsort(-want, kind="stable")]
    assert np.ptp(want) > 1e-2  # the documents really score differently


@pytest.mark.parametrize("runtime", ["torch", "onnx", "openvino"])
def test_each_runtime_equals_sentence_transformers(model_dir: Path, runtime: str) -> None:
    if runtime == "onnx":
        pytest.importorskip("fleetserve.runtimes.onnx", reason="runtimes/onnx.py is not there yet")
    a = make_family(model_dir, runtime)
    assert a.runtime.name == runtime
    got, _ = call(a, Task.SCORE, {"query": QUERY, "items": DOCS})
    assert np.abs(np.asarray(got["scores"]) - reference(model_dir)).max() < 1e-5


def test_segment_ids_reach_the_model(model_dir: Path, adapter: CrossEncoderFamily) -> None:
    assert adapter.use_types  # BERT: type_vocab_size 2
    without = make_family(model_dir, token_type_ids=False)
    a, _ = call(adapter, Task.SCORE, {"query": QUERY, "items": DOCS})
    b, _ = call(without, Task.SCORE, {"query": QUERY, "items": DOCS})
    assert np.abs(np.asarray(a["scores"]) - np.asarray(b["scores"])).max() > 1e-3


def test_long_document_is_cut_and_query_survives(adapter: CrossEncoderFamily) -> None:
    from transformers import AutoTokenizer

    _, prepared = call(adapter, Task.SCORE, {"query": QUERY, "items": DOCS})
    ids, types = prepared.items[1]
    assert len(ids) == MAX_LEN == prepared.lengths[1]
    tok = AutoTokenizer.from_pretrained(str(adapter.path))
    q = tok(QUERY, add_special_tokens=False)["input_ids"]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    assert ids[: len(q) + 2] == [cls, *q, sep]  # the whole query, then the document
    assert ids[-1] == sep
    assert types == [0] * (len(q) + 2) + [1] * (MAX_LEN - len(q) - 2)
    want = tok(QUERY, DOCS[1], truncation="only_second", max_length=MAX_LEN)
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    # short pairs are not cut
    assert prepared.items[2][0] == tok(QUERY, DOCS[2])["input_ids"]
    assert prepared.tokens == sum(prepared.lengths)


def test_long_query_is_cut_to_max_query_tokens(model_dir: Path) -> None:
    a = make_family(model_dir, max_query_tokens=6)
    long_query = "hello world " * 10
    _, prepared = call(a, Task.SCORE, {"query": long_query, "items": ["a cat", DOCS[1]]})
    for ids, types in prepared.items:
        assert sum(1 for t in types if t == 0) == 6 + 2  # [CLS], 6 query tokens, [SEP]
        assert len(ids) <= MAX_LEN
    assert len(prepared.items[1][0]) == MAX_LEN
    with pytest.raises(ValueError, match="max_query_tokens"):
        make_family(model_dir, max_query_tokens=MAX_LEN)


def test_truncate_false_names_the_item(adapter: CrossEncoderFamily) -> None:
    with pytest.raises(InvalidInput) as err:
        call(adapter, Task.SCORE, {"query": QUERY, "items": DOCS, "truncate": False})
    assert err.value.field == "items[1]"
    with pytest.raises(InvalidInput) as err:
        call(adapter, Task.SCORE, {"query": "fox " * 40, "items": ["a"], "truncate": False})
    assert err.value.field == "query"
    got, _ = call(adapter, Task.SCORE, {"query": QUERY, "items": ["a cat"], "truncate": False})
    assert len(got["scores"]) == 1


@pytest.mark.parametrize(
    ("task", "body", "field"),
    [
        (Task.SCORE, {"query": QUERY, "items": []}, "items"),
        (Task.RERANK, {"model": "m", "query": QUERY, "documents": []}, "documents"),
        (Task.SCORE, {"query": "", "items": ["a"]}, "query"),
        (Task.SCORE, {"query": QUERY, "items": ["a", ""]}, "items[1]"),
        (Task.SCORE, {"query": QUERY}, "items"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    adapter: CrossEncoderFamily, task: Task, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        call(adapter, task, body)
    assert err.value.field == field


@pytest.mark.parametrize("enc", [Encoding.JSON, Encoding.MSGPACK])
def test_rerank_is_cohere_shaped(adapter: CrossEncoderFamily, enc: Encoding) -> None:
    scores, _ = call(adapter, Task.SCORE, {"query": QUERY, "items": DOCS}, enc)
    docs = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]
    body = {"model": "m", "query": QUERY, "documents": docs, "top_n": 3, "return_documents": True}
    got, _ = call(adapter, Task.RERANK, body, enc)
    results = got["results"]
    assert [r["index"] for r in results] == scores["ranking"][:3]
    for r in results:
        assert r["relevance_score"] == pytest.approx(scores["scores"][r["index"]], abs=1e-6)
        assert r["document"] == {"text": DOCS[r["index"]]}
        assert 0.0 < r["relevance_score"] < 1.0  # sigmoid by default
    assert got["usage"]["total_tokens"] > 0 and got["model"] == "tiny/cross-encoder"
    plain, _ = call(adapter, Task.RERANK, {"model": "m", "query": QUERY, "documents": DOCS}, enc)
    assert len(plain["results"]) == len(DOCS) and "document" not in plain["results"][0]


def test_two_labels_softmax_and_label_index(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = build_cross_encoder(tmp_path / "two", num_labels=2, seed=3)
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    enc = tok([QUERY] * len(DOCS), DOCS, truncation="only_second", max_length=MAX_LEN,
              padding=True, return_tensors="pt")  # fmt: skip
    with torch.inference_mode():
        logits = model(**enc).logits.double()
    cases: list[tuple[dict[str, Any], Any]] = [
        ({}, logits.softmax(-1)[:, 1]),  # default: softmax, the second label
        ({"activation": "none", "label_index": 0}, logits[:, 0]),
    ]
    for options, want in cases:
        got, _ = call(make_family(path, **options), Task.SCORE, {"query": QUERY, "items": DOCS})
        assert np.abs(np.asarray(got["scores"]) - want.numpy()).max() < 1e-5
    three = build_cross_encoder(tmp_path / "three", num_labels=3)
    with pytest.raises(ValueError, match="label_index"):
        make_family(three)
    with pytest.raises(ValueError, match="activation"):
        make_family(path, activation="relu")


def test_http_score_and_rerank(
    model_dir: Path, adapter: CrossEncoderFamily, tmp_path: Path
) -> None:
    import httpx

    from ..conftest import ServerThread, tiny_settings
    from ..tinymodels import write_spec

    write_spec(tmp_path, "tiny/rerank", model_dir, family="cross_encoder", max_seq_len=MAX_LEN)
    srv = ServerThread(tiny_settings(tmp_path, models="tiny/rerank")).start()
    want, _ = call(adapter, Task.SCORE, {"query": QUERY, "items": DOCS})
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/v1/score/tiny/rerank", json={"query": QUERY, "items": DOCS})
            assert r.status_code == 200, r.text
            got = r.json()
            assert np.allclose(got["scores"], want["scores"], atol=1e-6)
            assert got["ranking"] == want["ranking"] and got["model"] == "tiny/rerank"
            body = {"model": "tiny/rerank", "query": QUERY, "documents": DOCS, "top_n": 2}
            mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
            r = c.post("/v1/rerank", content=msgspec.msgpack.encode(body), headers=mp)
            assert r.status_code == 200, r.text
            results = msgspec.msgpack.decode(r.content)["results"]
            assert [x["index"] for x in results] == want["ranking"][:2]
            r = c.post("/v1/score/tiny/rerank", json={"query": QUERY, "items": []})
            assert r.status_code == 400 and r.json()["error"]["field"] == "items"
            r = c.post("/v1/encode/tiny/rerank", json={"inputs": ["a"]})
            assert r.status_code == 400  # a cross-encoder does not embed
    finally:
        srv.stop()
