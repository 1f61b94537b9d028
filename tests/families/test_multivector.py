"""Multi-vector: real MiniLM token vectors, MaxSim, tiny ColBERT checkpoints in both layouts."""

from __future__ import annotations

import functools
import string
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModel

from fleetserve.assembly import HF_CACHE
from fleetserve.catalog import Catalog, ModelSpec
from fleetserve.catalog.sources import resolve
from fleetserve.families.multivector import MultiVectorFamily, maxsim
from fleetserve.runtimes import create_runtime
from fleetserve.wire import Encoding, Envelope, InvalidInput, Task
from fleetserve.wire.codec import array_from_wire, dumps, loads

from ..tiny_colbert import DOC_LENGTH, QUERY_LENGTH, build_hf_colbert, build_pylate_colbert

MINILM = "sentence-transformers/all-MiniLM-L6-v2-multivector"
MP, JS = Encoding.MSGPACK, Encoding.JSON


def call(a: MultiVectorFamily, task: Task, body: dict[str, Any], enc: Encoding = MP) -> Any:
    env = Envelope("r1", a.spec.id, task, enc, enc, 1, time.time() + 30)
    prepared = a.preprocess(env, dumps(body, enc))
    return loads(a.postprocess(env, prepared, list(a.forward(prepared.items))), enc)


def matrices(reply: Any) -> list[np.ndarray[Any, Any]]:
    return [np.asarray(array_from_wire(m), dtype=np.float32) for m in reply["embeddings"]]


def adapter(spec: ModelSpec, path: Path, runtime: str = "torch") -> MultiVectorFamily:
    rt = create_runtime(runtime, device="cpu", precision="fp32", cache_dir=path.parent / "cache")
    a = MultiVectorFamily(spec, rt, path)
    a.load()
    a.warmup()
    return a


def unit(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True))


# -- real MiniLM token vectors ---------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> MultiVectorFamily:
    spec = Catalog.load().get(MINILM)
    return adapter(spec, resolve(MINILM, spec.sources, HF_CACHE))


@pytest.mark.slow
def test_minilm_token_vectors_are_the_hidden_rows_of_kept_tokens(
    minilm: MultiVectorFamily,
) -> None:
    texts = ["Hello, world! Late interaction keeps one vector per token.", "pandas eat bamboo"]
    raw = matrices(call(minilm, Task.ENCODE, {"inputs": texts, "normalize": False}))
    unit_js = call(minilm, Task.ENCODE, {"inputs": texts}, JS)["embeddings"]
    tok = Tokenizer.from_file(str(minilm.path / "tokenizer.json"))
    tok.no_padding()
    model = minilm.runtime.model  # type: ignore[attr-defined]  # the same weights, called directly
    for text, got, got_unit in zip(texts, raw, unit_js, strict=True):
        enc = tok.encode(text)
        with torch.inference_mode():
            hidden = model(torch.tensor([enc.ids])).last_hidden_state[0].numpy()
        drop = {"[CLS]", "[SEP]", *string.punctuation}
        kept = [i for i, t in enumerate(enc.tokens) if t not in drop]
        assert 0 < len(kept) < len(enc.ids)
        assert got.shape == (len(kept), 384)
        np.testing.assert_allclose(got, hidden[kept], atol=2e-4)
        np.testing.assert_allclose(got_unit, unit(hidden[kept]), atol=2e-5)


@pytest.mark.slow
def test_minilm_maxsim_ranks_the_relevant_document_first(minilm: MultiVectorFamily) -> None:
    query = "What do giant pandas eat?"
    docs = [
        "The stock market fell sharply on Tuesday.",
        "Giant pandas feed almost entirely on bamboo shoots and leaves.",
        "Python is a popular programming language.",
    ]
    reply = call(minilm, Task.SCORE, {"query": query, "items": docs}, JS)
    assert reply["ranking"][0] == 1
    # the scores are MaxSim over the vectors the encode route returns
    q = matrices(call(minilm, Task.ENCODE, {"inputs": query, "is_query": True}))[0]
    d = matrices(call(minilm, Task.ENCODE, {"inputs": docs}))
    want = [float((q @ m.T).max(axis=1).sum()) for m in d]
    np.testing.assert_allclose(reply["scores"], want, rtol=1e-4)
    rr = call(minilm, Task.RERANK, {"model": MINILM, "query": query, "documents": docs,
                                    "top_n": 1, "return_documents": True}, JS)  # fmt: skip
    assert [(r["index"], r["document"]["text"]) for r in rr["results"]] == [(1, docs[1])]


# -- tiny ColBERT checkpoints ----------------------------------------------------------


@pytest.fixture(scope="module", params=["hf", "pylate"])
def colbert(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(request.param)
    build = build_hf_colbert if request.param == "hf" else build_pylate_colbert
    return build(root / "model")


@pytest.fixture(scope="module")
def tiny(colbert: Path) -> MultiVectorFamily:
    return adapter(tiny_spec(colbert), colbert)


def tiny_spec(path: Path, **options: Any) -> ModelSpec:
    return ModelSpec.from_dict(
        {"id": "tiny/colbert", "family": "multivector", "source": str(path),
         "max_seq_len": 32, "options": options}
    )  # fmt: skip


@functools.cache
def encoder(path: Path) -> Any:
    return AutoModel.from_pretrained(str(path)).eval()


def reference(path: Path, ids: list[int], attend: int) -> np.ndarray[Any, Any]:
    """projection(hidden) per position, with torch and safetensors, for one input."""
    model = encoder(path)
    mask = [1] * attend + [0] * (len(ids) - attend)
    with torch.inference_mode():
        h = model(torch.tensor([ids]), attention_mask=torch.tensor([mask])).last_hidden_state[0]
    dense = path / "1_Dense" / "model.safetensors"
    w = load_file(str(dense if dense.exists() else path / "model.safetensors"))
    out = h @ w["linear.weight"].T + w.get("linear.bias", torch.zeros(1))
    return out.numpy()


def test_tiny_colbert_loads_its_projection_and_markers(
    colbert: Path, tiny: MultiVectorFamily
) -> None:
    a = tiny
    assert a.checkpoint.layout == ("pylate" if (colbert / "modules.json").exists() else "hf")
    assert a.dim == 16
    tok = Tokenizer.from_file(str(colbert / "tokenizer.json"))
    vocab = tok.get_vocab()
    qm, dm = ("[Q] ", "[D] ") if a.checkpoint.layout == "pylate" else ("[unused0]", "[unused1]")
    cls, sep, mask = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]

    # a query: [CLS] marker words [SEP], then [MASK] up to query_length, not attended
    words = tok.encode("quick fox", add_special_tokens=False).ids
    ids = [cls, vocab[qm], *words, sep]
    ids += [mask] * (QUERY_LENGTH - len(ids))
    [got] = matrices(call(a, Task.ENCODE, {"inputs": ["quick fox"], "is_query": True}))
    np.testing.assert_allclose(got, unit(reference(colbert, ids, len(words) + 3)), atol=1e-5)

    # a document: [CLS] marker words [SEP], truncated to document_length, punctuation dropped
    text = "the lazy dog, the quick brown fox. it sat on the mat with a cat"
    words = tok.encode(text, add_special_tokens=False).ids[: DOC_LENGTH - 3]
    ids = [cls, vocab[dm], *words, sep]
    keep = [i for i, t in enumerate(ids) if t not in (vocab[","], vocab["."])]
    [got] = matrices(call(a, Task.ENCODE, {"inputs": text}))
    assert len(keep) == DOC_LENGTH - 2
    np.testing.assert_allclose(got, unit(reference(colbert, ids, len(ids))[keep]), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_openvino_gives_the_vectors_and_scores_of_torch(
    colbert: Path, tiny: MultiVectorFamily
) -> None:
    a = adapter(tiny_spec(colbert), colbert, "openvino")
    assert a.runtime.name == "openvino"
    docs = ["the quick brown fox", "money in the river bank, and a cat", "water"]
    for body in ({"inputs": docs}, {"inputs": ["brown fox"], "is_query": True}):
        got, want = matrices(call(a, Task.ENCODE, body)), matrices(call(tiny, Task.ENCODE, body))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
    score = {"query": "brown fox", "items": docs}
    np.testing.assert_allclose(
        call(a, Task.SCORE, score)["scores"], call(tiny, Task.SCORE, score)["scores"], rtol=1e-5
    )


def test_max_tokens_truncates_per_request(colbert: Path) -> None:
    a = adapter(tiny_spec(colbert, projection="none", query_expansion=False), colbert)
    assert a.dim == 32  # no projection: the hidden size
    text = "hello world the quick brown fox jumps"
    [cut] = matrices(call(a, Task.ENCODE, {"inputs": text, "max_tokens": 6}))
    [longer] = matrices(call(a, Task.ENCODE, {"inputs": text}))
    assert cut.shape == (6, 32) and longer.shape == (10, 32)
    tok = Tokenizer.from_file(str(colbert / "tokenizer.json"))
    ids = [tok.token_to_id("[CLS]"), a.tokenizer.markers[False] or 0]
    ids += [*tok.encode(text, add_special_tokens=False).ids[:3], tok.token_to_id("[SEP]")]
    h = encoder(colbert)(torch.tensor([ids])).last_hidden_state[0]
    np.testing.assert_allclose(cut, unit(h.detach().numpy()), atol=1e-5)
    [q] = matrices(call(a, Task.ENCODE, {"inputs": text, "is_query": True, "max_tokens": 5}))
    assert q.shape == (5, 32)  # no expansion here; truncated like a document
    with pytest.raises(InvalidInput) as info:
        call(a, Task.ENCODE, {"inputs": text, "max_tokens": 3})
    assert info.value.field == "max_tokens"
    with pytest.raises(InvalidInput) as info:
        call(a, Task.ENCODE, {"inputs": ["fox", text * 3], "truncate": False})
    assert info.value.field == "inputs[1]"


def test_score_and_encode_agree_and_dtypes(tiny: MultiVectorFamily) -> None:
    a = tiny
    docs = ["the quick brown fox", "money in the river bank", "a cat sat on a mat"]
    reply = call(a, Task.SCORE, {"query": "brown fox", "items": docs})
    q = matrices(call(a, Task.ENCODE, {"inputs": "brown fox", "is_query": True}))[0]
    d = matrices(call(a, Task.ENCODE, {"inputs": docs}))
    np.testing.assert_allclose(reply["scores"], [maxsim(q, m) for m in d], rtol=1e-5)
    assert reply["ranking"] == sorted(range(3), key=lambda i: -reply["scores"][i])
    i8 = call(a, Task.ENCODE, {"inputs": docs, "output_dtype": "int8"})
    assert i8["output_dtype"] == "int8"
    for codes, scales, want in zip(i8["embeddings"], i8["scales"], d, strict=True):
        c, s = array_from_wire(codes), array_from_wire(scales)
        assert c.dtype == np.int8 and c.shape == want.shape and s.shape == (len(want),)
        np.testing.assert_allclose(c * s[:, None], want, atol=float(s.max()) / 2 + 1e-7)
    b = call(a, Task.ENCODE, {"inputs": docs, "output_dtype": "binary"}, JS)
    assert b["dimensions"] == 16
    for packed, want in zip(b["embeddings"], d, strict=True):
        bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=1, bitorder="big")
        np.testing.assert_array_equal(bits[:, :16], want > 0)
    with pytest.raises(InvalidInput) as info:
        call(a, Task.ENCODE, {"inputs": docs, "output_dtype": "int4"})
    assert info.value.field == "output_dtype"


def test_invalid_requests_and_options(colbert: Path, tiny: MultiVectorFamily) -> None:
    a = tiny
    for body, field in [
        ({"inputs": []}, "inputs"),
        ({"inputs": ["x", ""]}, "inputs[1]"),
        ({"inputs": "x", "pooling": "mean"}, "pooling"),
    ]:
        with pytest.raises(InvalidInput) as info:
            call(a, Task.ENCODE, body)
        assert info.value.field == field
    with pytest.raises(InvalidInput) as info:
        call(a, Task.RERANK, {"model": "m", "query": "fox", "documents": ["a", ""]})
    assert info.value.field == "documents[1]"
    with pytest.raises(ValueError, match="skip_clss"):
        adapter(tiny_spec(colbert, skip_clss=True), colbert)


def test_a_prefix_that_is_no_token_is_prepended_as_text(colbert: Path) -> None:
    opts = {"query_prefix": "river bank ", "document_prefix": "", "query_expansion": False}
    a = adapter(tiny_spec(colbert, **opts), colbert)
    [q] = matrices(call(a, Task.ENCODE, {"inputs": "fox", "is_query": True}))
    [d] = matrices(call(a, Task.ENCODE, {"inputs": "river bank fox"}))
    assert q.shape == (5, 16)  # [CLS] river bank fox [SEP]
    np.testing.assert_allclose(q, d, atol=1e-6)
