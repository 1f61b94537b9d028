"""The SDK beyond float embeddings: int8 and binary, score, rerank, multi-vector, sparse,
extract; against a real server with a tiny dense model and a tiny ColBERT."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

import fleetserve
from fleetserve import AsyncClient, Client
from fleetserve.sdk import Quantized, RerankResult, SparseVector, unpack_bits
from fleetserve.wire import Encoding
from fleetserve.wire.codec import array_to_wire, dumps, loads

from ..conftest import TINY, ServerThread, tiny_settings
from ..tiny_colbert import build_hf_colbert
from ..tinymodels import build_bert, write_spec

COLBERT = "tiny/colbert"
TEXTS = ["the quick brown fox", "money in the river bank", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("sdk")
    cat = root / "catalog"
    write_spec(cat, TINY, build_bert(root / "dense"))
    write_spec(cat, COLBERT, build_hf_colbert(root / "colbert"), family="multivector")
    srv = ServerThread(tiny_settings(cat, models=f"{TINY},{COLBERT}")).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[Client]:
    with Client(server.url, max_retries=0) as c:
        yield c


def test_int8_binary_and_dequantize(client: Client) -> None:
    floats = client.encode(TINY, TEXTS)
    q = client.encode(TINY, TEXTS, output_dtype="int8")
    assert isinstance(q, Quantized) and q.dtype == "int8" and len(q) == 3
    assert q.values.dtype == np.int8 and q.values.shape == (3, 32) and q.scales is not None
    assert q.scales.shape == (3,)
    np.testing.assert_allclose(q.dequantize(), floats, atol=float(q.scales.max()) / 2 + 1e-7)
    direct = client.encode(TINY, TEXTS, output_dtype="int8", dequantize=True)
    assert isinstance(direct, np.ndarray) and direct.dtype == np.float32
    np.testing.assert_array_equal(direct, q.dequantize())
    b = client.encode(TINY, TEXTS, output_dtype="binary", dimensions=12)
    assert b.values.dtype == np.uint8 and b.values.shape == (3, 2) and b.dimensions == 12
    np.testing.assert_array_equal(b.unpack(), floats[:, :12] > 0)
    np.testing.assert_array_equal(unpack_bits(b.values)[:, :12], b.unpack())
    np.testing.assert_array_equal(b.dequantize(), np.where(floats[:, :12] > 0, 1.0, -1.0))
    with pytest.raises(ValueError, match="binary"):
        q.unpack()


def test_score_and_rerank_a_dense_model(client: Client) -> None:
    emb = client.encode(TINY, ["brown fox", *TEXTS])
    scores = client.score(TINY, "brown fox", TEXTS)
    np.testing.assert_allclose(scores, emb[1:] @ emb[0], atol=1e-5)
    ranked = client.rerank(TINY, "brown fox", TEXTS, top_n=2, return_documents=True)
    order = list(np.argsort(-np.asarray(scores)))
    assert [r.index for r in ranked] == order[:2]
    assert ranked[0] == RerankResult(order[0], ranked[0].relevance_score, TEXTS[order[0]])
    assert all(r.document is None for r in client.rerank(TINY, "fox", TEXTS))
    with pytest.raises(fleetserve.InvalidInput) as info:
        client.score(TINY, "fox", ["a", ""])
    assert info.value.field == "items[1]"


def test_multivector_encode_and_maxsim_score(client: Client) -> None:
    docs = client.encode_multivector(COLBERT, TEXTS)
    assert [d.shape[1] for d in docs] == [16, 16, 16]
    [query] = client.encode_multivector(COLBERT, "brown fox", is_query=True)
    assert query.shape == (8, 16)  # query_length of the tiny checkpoint, [MASK]-expanded
    np.testing.assert_allclose(np.linalg.norm(docs[0], axis=1), 1.0, atol=1e-5)
    want = [float((query @ d.T).max(axis=1).sum()) for d in docs]
    np.testing.assert_allclose(client.score(COLBERT, "brown fox", TEXTS), want, rtol=1e-5)
    [cut] = client.encode_multivector(COLBERT, TEXTS[0], max_tokens=4)
    assert cut.shape == (4, 16)
    quant = client.encode_multivector(COLBERT, TEXTS, output_dtype="int8")
    for qm, d in zip(quant, docs, strict=True):
        assert isinstance(qm, Quantized) and qm.values.shape == d.shape
        np.testing.assert_allclose(qm.dequantize(), d, atol=1 / 127)


async def test_async_client_scores_reranks_and_quantizes(server: ServerThread) -> None:
    with Client(server.url) as sync:
        want_scores = sync.score(TINY, "river", TEXTS)
        want_q = sync.encode(TINY, TEXTS, output_dtype="int8")
        want_mv = sync.encode_multivector(COLBERT, TEXTS[:1])
    async with AsyncClient(server.url) as c:
        np.testing.assert_allclose(await c.score(TINY, "river", TEXTS), want_scores, atol=1e-6)
        ranked = await c.rerank(TINY, "river", TEXTS, top_n=1)
        assert ranked[0].index == int(np.argmax(want_scores))
        q = await c.encode(TINY, TEXTS, output_dtype="int8")
        np.testing.assert_array_equal(q.values, want_q.values)
        mv = await c.encode_multivector(COLBERT, TEXTS[:1])
        np.testing.assert_allclose(mv[0], want_mv[0], atol=1e-6)


# -- the protocol boundary for families served elsewhere (sparse, extract) --------------


def reply(body: object) -> httpx.Response:
    content = dumps(body, Encoding.MSGPACK)
    return httpx.Response(200, content=content, headers={"content-type": "application/msgpack"})


def test_sparse_and_extract_requests_and_decoding() -> None:
    seen: list[httpx.Request] = []
    idx, vals = np.array([3, 17], dtype=np.uint32), np.array([0.5, 1.25], dtype=np.float32)
    bodies: dict[str, object] = {
        "/v1/encode/org/splade": {
            "embeddings": [
                {"indices": array_to_wire(idx), "values": array_to_wire(vals), "tokens": ["a", "b"]}
            ]
        },
        "/v1/extract/org/ner": {"results": [[{"start": 0, "end": 5, "label": "PER"}], []]},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return reply(bodies[request.url.path])

    with Client("http://fleet.test", transport=httpx.MockTransport(handler)) as c:
        [sv] = c.encode_sparse("org/splade", "hello", top_k=2, return_tokens=True)
        found = c.extract("org/ner", ["Alice went", "nothing"], labels=["person"])
    assert isinstance(sv, SparseVector) and sv.tokens == ["a", "b"]
    assert sv.to_dict() == {3: 0.5, 17: 1.25}
    assert sv.dense(20)[17] == 1.25 and sv.dense(20).sum() == 1.75
    assert found == [[{"start": 0, "end": 5, "label": "PER"}], []]
    sparse_body, extract_body = (loads(r.content, Encoding.MSGPACK) for r in seen)
    assert sparse_body == {"inputs": "hello", "top_k": 2, "return_tokens": True}
    assert extract_body == {"inputs": ["Alice went", "nothing"], "labels": ["person"]}


def test_score_and_rerank_request_bodies() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/rerank":
            return reply({"results": [{"index": 1, "relevance_score": 0.9}]})
        return reply({"scores": [0.1, 0.9], "ranking": [1, 0]})

    with Client("http://fleet.test", transport=httpx.MockTransport(handler)) as c:
        assert c.score("a/b", "q", ["x", "y"], truncate=False) == [0.1, 0.9]
        assert c.rerank("a/b", "q", ["x", "y"]) == [RerankResult(1, 0.9, None)]
    assert seen[0].url.raw_path == b"/v1/score/a/b"
    assert loads(seen[1].content, Encoding.MSGPACK) == {
        "model": "a/b",
        "query": "q",
        "documents": ["x", "y"],
        "return_documents": False,
    }


def test_unpack_bits_order() -> None:
    assert unpack_bits(np.array([[0b10100000]], dtype=np.uint8), 3).tolist() == [[1, 0, 1]]
