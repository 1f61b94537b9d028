"""The drop-in routes for TEI and infinity-emb users, against a real server (one tiny
model of each text family): their shapes, their errors, and the clients people use
(``huggingface_hub.InferenceClient`` against the TEI routes, OpenAI's against
infinity's ``/embeddings``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ..conftest import TINY, ServerThread, tiny_settings
from . import openapi_kit as kit
from .openapi_kit import RERANK, SPARSE

TEXTS = ["the quick brown fox", "jumps over the lazy dog"]


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> ServerThread:
    srv, _ = kit.shared(request)
    return srv


def post(srv: ServerThread, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=30)


def native(srv: ServerThread, model: str, texts: list[str]) -> np.ndarray:
    r = post(srv, f"/v1/encode/{model}", {"inputs": texts})
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def test_tei_embed_and_its_root_route_give_the_native_vectors(server: ServerThread) -> None:
    want = native(server, TINY, TEXTS)
    for path in ("/embed", "/"):
        r = post(server, path, {"inputs": TEXTS})  # no model: the one --models names first
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.asarray(r.json()), want, atol=1e-6)
    one = post(server, "/embed", {"inputs": TEXTS[0], "model": TINY, "normalize": False})
    assert len(one.json()) == 1 and abs(np.linalg.norm(one.json()[0]) - 1.0) > 1e-3


def test_tei_embed_sparse_rerank_and_predict(server: ServerThread) -> None:
    sparse = post(server, "/embed_sparse", {"inputs": TEXTS}).json()
    ref = post(server, f"/v1/encode/{SPARSE}", {"inputs": TEXTS}).json()["embeddings"]
    assert [[p["index"] for p in row] for row in sparse] == [e["indices"] for e in ref]
    assert [[p["value"] for p in row] for row in sparse] == [e["values"] for e in ref]
    r = post(server, "/rerank", {"query": "fox", "texts": TEXTS, "return_text": True})
    ranked = r.json()
    cohere = post(server, "/v1/rerank", {"model": RERANK, "query": "fox", "documents": TEXTS})
    results = cohere.json()["results"]
    assert [(x["index"], x["score"]) for x in ranked] == [
        (x["index"], x["relevance_score"]) for x in results
    ]
    assert ranked[0]["text"] == TEXTS[ranked[0]["index"]]
    first = next(x["relevance_score"] for x in results if x["index"] == 0)
    pair = post(server, "/predict", {"inputs": ["fox", TEXTS[0]]}).json()
    assert pair == [{"score": pytest.approx(first), "label": "LABEL_0"}]


def test_tei_errors_have_tei_shape_and_status(server: ServerThread) -> None:
    long = " ".join(["word"] * 200)  # past the tiny model's 16 tokens
    r = post(server, "/embed", {"inputs": long})  # TEI's truncate defaults to false
    assert r.status_code == 422 and r.json()["error_type"] == "Validation", r.text
    assert "token" in r.json()["error"]
    assert post(server, "/embed", {"inputs": long, "truncate": True}).status_code == 200
    r = post(server, "/embed", {"inputs": []})
    assert r.status_code == 422 and "`inputs`" in r.json()["error"]
    r = post(server, "/embed", {"inputs": "x", "truncation_direction": "Left"})
    assert r.status_code == 422 and "truncation_direction" in r.json()["error"]
    r = httpx.post(server.url + "/embed", content=b"{not json", timeout=10)
    assert r.status_code == 422 and r.json()["error_type"] == "Validation"
    r = post(server, "/predict", {"inputs": "one text"})
    assert r.status_code == 422 and "pair" in r.json()["error"]
    r = post(server, "/embed", {"inputs": "x", "model": "tiny/dense-bret"})
    assert r.status_code == 404 and "did you mean 'tiny/dense-bert'" in r.json()["error"]


def test_tei_info_names_the_embed_model(server: ServerThread) -> None:
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_id"] == TINY and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 16 and info["max_client_batch_size"] > 0


def test_huggingface_hub_inference_client_against_the_tei_routes(server: ServerThread) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=server.url)
    got = client.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(got)[0], native(server, TINY, TEXTS[:1])[0], atol=1e-6)


def test_infinity_routes(server: ServerThread) -> None:
    r = post(server, "/embeddings", {"model": TINY, "input": TEXTS})
    data = r.json()["data"]
    np.testing.assert_allclose(
        [d["embedding"] for d in data], native(server, TINY, TEXTS), atol=1e-6
    )
    body = {"model": RERANK, "query": "fox", "documents": TEXTS, "return_documents": True}
    r = post(server, "/rerank", body).json()
    assert r["object"] == "rerank" and {x["document"] for x in r["results"]} == set(TEXTS)
    models = httpx.get(server.url + "/models", timeout=10).json()
    assert models["object"] == "list" and TINY in [m["id"] for m in models["data"]]
    r = post(server, "/embeddings", {"model": TINY, "input": []})
    assert r.status_code == 400 and r.json()["error"]["field"] is not None


def test_the_openai_client_against_infinitys_embeddings(server: ServerThread) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url, api_key="unused")
    got = client.embeddings.create(model=TINY, input=TEXTS)
    vectors = [d.embedding for d in got.data]
    np.testing.assert_allclose(vectors, native(server, TINY, TEXTS), atol=1e-6)


def test_langchains_openai_embeddings_against_infinitys_route(server: ServerThread) -> None:
    from langchain_openai import OpenAIEmbeddings

    # texts as they are: its default counts tokens with tiktoken, whose files no hub serves
    emb = OpenAIEmbeddings(model=TINY, base_url=server.url, api_key="unused",  # type: ignore[arg-type]
                           check_embedding_ctx_length=False)  # fmt: skip
    np.testing.assert_allclose(emb.embed_documents(TEXTS), native(server, TINY, TEXTS), atol=1e-6)
    np.testing.assert_allclose(emb.embed_query(TEXTS[0]), native(server, TINY, TEXTS)[0], atol=1e-6)


def test_llamaindexs_openai_embedding_against_infinitys_route(server: ServerThread) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    # model_name: any served id (``model`` is an enum of OpenAI's own models)
    emb = OpenAIEmbedding(model_name=TINY, api_base=server.url, api_key="unused", max_retries=0)
    want = native(server, TINY, TEXTS)
    np.testing.assert_allclose(emb.get_text_embedding_batch(TEXTS), want, atol=1e-6)
    np.testing.assert_allclose(emb.get_query_embedding(TEXTS[0]), want[0], atol=1e-6)


def test_the_routes_need_a_key_where_keys_are_set(tiny_catalog: Path) -> None:
    srv = ServerThread(tiny_settings(tiny_catalog, api_key="compat-secret-key")).start()
    try:
        assert post(srv, "/embed", {"inputs": "x"}).status_code == 401
        assert httpx.get(srv.url + "/info", timeout=10).status_code == 401
        keyed = {"authorization": "Bearer compat-secret-key"}
        r = httpx.post(srv.url + "/embed", json={"inputs": "x"}, headers=keyed, timeout=30)
        assert r.status_code == 200 and len(r.json()) == 1
    finally:
        srv.stop()
