"""In a running server, a spec over a checkpoint that lacks its head fails alone: its
requests get a 503 naming the missing pieces and the family that fits, with no random
scores, and the other models keep serving."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ..conftest import ServerThread, tiny_settings
from ..tiny_st import build_st
from ..tinymodels import write_spec


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("incomplete")
    st = build_st(root / "st", max_seq_length=64)
    cat = root / "catalog"
    write_spec(cat, "good/dense", st)
    write_spec(cat, "broken/rerank", st, family="cross_encoder", pooling="none")
    write_spec(cat, "broken/sparse", st, family="sparse", pooling="none", normalize=False)
    srv = ServerThread(tiny_settings(cat, models="good/dense,broken/*")).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        (
            "/v1/rerank",
            {"model": "broken/rerank", "query": "q", "documents": ["a", "b"]},
            "classifier (2 tensors) of the sequence-classification head",
        ),
        ("/v1/encode/broken/sparse", {"inputs": ["x"]}, "cls.predictions"),
    ],
)
def test_a_model_missing_its_head_fails_alone_in_one_line(
    server: ServerThread, path: str, body: dict[str, object], says: str
) -> None:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 503, r.text
    msg = r.json()["error"]["message"]
    assert says in msg and "its files fit family dense" in msg and "\n" not in msg, msg
    good = httpx.post(server.url + "/v1/encode/good/dense", json={"inputs": ["x"]}, timeout=60)
    assert good.status_code == 200, good.text
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
