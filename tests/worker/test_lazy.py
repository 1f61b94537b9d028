"""Lazy loading: models load on first use; pinned ones at start; missing weights are clear."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fleetserve.assembly import build_catalog
from fleetserve.catalog import Catalog

from ..conftest import ServerThread, tiny_settings
from ..tinymodels import build_bert, write_spec


@pytest.fixture(scope="module")
def lazy_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lazy")
    model = build_bert(root / "model")
    cat = root / "catalog"
    write_spec(cat, "tiny/pinned", model, pinned=True)
    write_spec(cat, "tiny/lazy", model)
    write_spec(cat, "tiny/absent", root / "no-such-dir", description="weights never installed")
    return cat


@pytest.fixture(scope="module")
def server(lazy_catalog: Path) -> ServerThread:
    settings = tiny_settings(lazy_catalog, models="")
    catalog = Catalog.load([lazy_catalog], bundled=False)
    srv = ServerThread(settings, catalog).start()
    yield srv  # type: ignore[misc]
    srv.stop()


def loaded(srv: ServerThread) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(srv.url + "/v1/models").json()["data"]}


def test_only_pinned_models_load_at_start_and_others_on_first_use(server: ServerThread) -> None:
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert loaded(server) == {"tiny/pinned": True, "tiny/lazy": False, "tiny/absent": False}
    r = httpx.post(server.url + "/v1/encode/tiny/lazy", json={"inputs": ["fox"]}, timeout=30)
    assert r.status_code == 200, r.text
    assert loaded(server)["tiny/lazy"] is True


def test_models_reports_presence(server: ServerThread) -> None:
    data = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert data["tiny/lazy"]["present"] is True
    assert data["tiny/absent"]["present"] is False
    assert {"encode", "embeddings"} <= set(data["tiny/lazy"]["tasks"])


def test_absent_weights_are_a_404_that_says_where_it_looked(
    server: ServerThread, lazy_catalog: Path
) -> None:
    r = httpx.post(server.url + "/v1/encode/tiny/absent", json={"inputs": ["fox"]}, timeout=30)
    assert r.status_code == 404
    err = r.json()["error"]
    assert "not present locally" in err["message"] and "no-such-dir" in err["message"]
    # the failure is not remembered, and the server keeps serving
    assert loaded(server)["tiny/absent"] is False
    ok = httpx.post(server.url + "/v1/encode/tiny/pinned", json={"inputs": ["fox"]}, timeout=30)
    assert ok.status_code == 200


def test_a_route_the_family_does_not_serve_is_a_400(server: ServerThread) -> None:
    body = {"inputs": ["fox"], "labels": ["animal"]}
    r = httpx.post(server.url + "/v1/extract/tiny/pinned", json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["field"] == "model" and "does not serve the extract route" in err["message"]


def test_unknown_route_and_empty_model_path(server: ServerThread) -> None:
    assert httpx.post(server.url + "/v1/frobnicate/x", json={}).status_code == 404
    r = httpx.post(server.url + "/v1/score/", json={"query": "a", "items": ["b"]})
    assert r.status_code == 400 and r.json()["error"]["field"] == "path"


def test_the_bundled_catalog_lists_every_model_without_loading_them() -> None:
    settings = tiny_settings(Path("/nonexistent"), models="")
    settings = type(settings).load(overrides={"catalog": "", "models": ""})
    catalog = build_catalog(settings)
    assert "sentence-transformers/all-MiniLM-L6-v2" in catalog
