"""Every family that takes adapters, served with one: the reply equals that of the
adapter merged into the base (PEFT ``merge_and_unload``) served as a model of its own.
Families that cannot take one answer a 400 that says so."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fleetserve.runtimes import Head
from tests.conftest import ServerThread, tiny_settings
from tests.lora.test_serving import upload
from tests.tiny_colbert import build_hf_colbert
from tests.tiny_extract import build_token_classifier
from tests.tiny_lora import make_lora, save_merged
from tests.tiny_onnx import build_head
from tests.tiny_rerank import build_cross_encoder
from tests.tinymodels import write_spec

TEXTS = ["the quick brown fox", "money in the river bank"]
QUERY, DOCS = "a fox", ["the quick brown fox", "a cat sat on the mat", "river bank"]

# family -> (builder, PEFT head, spec fields, route, body)
CASES: dict[str, tuple[Callable[[Path], Path], str, dict[str, Any], str, dict[str, Any]]] = {
    "sparse": (
        lambda p: build_head(p, Head.MASKED_LM),
        "masked_lm",
        {"family": "sparse", "pooling": "none", "normalize": False},
        "encode",
        {"inputs": TEXTS},
    ),
    "multivector": (
        build_hf_colbert,
        "base",
        {"family": "multivector"},
        "encode",
        {"inputs": TEXTS},
    ),
    "cross_encoder": (
        build_cross_encoder,
        "sequence_classification",
        {"family": "cross_encoder", "max_seq_len": 64},
        "score",
        {"query": QUERY, "items": DOCS},
    ),
    "ner": (
        build_token_classifier,
        "token_classification",
        {"family": "ner", "pooling": "none", "max_seq_len": 64},
        "extract",
        {"inputs": TEXTS},
    ),
}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerThread, dict[str, str]]]:
    root = tmp_path_factory.mktemp("lora-families")
    cat = root / "catalog"
    adapters: dict[str, Path] = {}
    for family, (build, head, spec, _, _) in CASES.items():
        base = build(root / family)
        path = make_lora(base, root / f"{family}-lora", seed=30, head=head, scale=0.2)
        adapters[family] = path
        write_spec(cat, f"tiny/{family}", base, **spec)
        merged = save_merged(base, path, head, root / f"{family}-m")
        write_spec(cat, f"tiny/{family}-merged", merged, **spec)
    write_spec(cat, "tiny/zero-shot", root / "ner", family="zero_shot")
    settings = tiny_settings(
        cat, models="tiny/*", cache_dir=str(root / "cache"),
        adapter_store=(root / "adapters").as_uri(),
    )  # fmt: skip
    srv = ServerThread(settings).start()
    ids = {}
    for family, path in adapters.items():
        r = upload(srv.url, path, family, base=f"tiny/{family}")
        assert r.status_code == 201, r.text
        ids[family] = r.json()["id"]
    yield srv, ids
    srv.stop()


def numbers(body: Any) -> list[float]:
    """Every number in a reply, in order (the shape of each family's reply differs)."""
    if isinstance(body, dict):
        return [x for k in sorted(body) if k not in ("model", "id") for x in numbers(body[k])]
    if isinstance(body, list):
        return [x for v in body for x in numbers(v)]
    if isinstance(body, bool | str) or body is None:
        return []
    return [float(body)]


@pytest.mark.parametrize("family", list(CASES))
def test_a_family_served_with_an_adapter_equals_the_merged_model(
    served: tuple[ServerThread, dict[str, str]], family: str
) -> None:
    srv, ids = served
    _, _, _, route, body = CASES[family]

    def call(model: str, adapter: str | None = None) -> Any:
        payload = {**body, "adapter": adapter} if adapter else body
        r = httpx.post(f"{srv.url}/v1/{route}/{model}", json=payload, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    with_adapter = call(f"tiny/{family}", ids[family])
    want = call(f"tiny/{family}-merged")
    base = call(f"tiny/{family}")
    np.testing.assert_allclose(numbers(with_adapter), numbers(want), atol=2e-4, rtol=1e-4)
    assert numbers(with_adapter) != numbers(base)


def test_rerank_takes_the_adapter_in_the_model_name(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    srv, ids = served
    body = {"query": QUERY, "documents": DOCS}
    got = httpx.post(
        f"{srv.url}/v1/rerank", json={**body, "model": f"tiny/cross_encoder:{ids['cross_encoder']}"}
    )
    want = httpx.post(f"{srv.url}/v1/rerank", json={**body, "model": "tiny/cross_encoder-merged"})
    assert got.status_code == 200, got.text
    a = {r["index"]: r["relevance_score"] for r in got.json()["results"]}
    b = {r["index"]: r["relevance_score"] for r in want.json()["results"]}
    assert a.keys() == b.keys()
    np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], atol=2e-4)


def test_zero_shot_cannot_take_an_adapter_and_says_so(
    served: tuple[ServerThread, dict[str, str]],
) -> None:
    srv, ids = served
    r = httpx.post(
        f"{srv.url}/v1/extract/tiny/zero-shot",
        json={"inputs": TEXTS, "labels": ["a", "b"], "adapter": ids["ner"]},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert (
        "zero_shot" in r.json()["error"]["message"] and "adapters" in r.json()["error"]["message"]
    )
