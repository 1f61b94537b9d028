"""The dashboard app and the tuning view without a server: routing, views, edge cases."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from fleetserve.bench.tune.runs import RunStore
from fleetserve.dashboard import Dashboard, default_views
from fleetserve.dashboard.added import AddedView
from fleetserve.dashboard.fleet import FleetView
from fleetserve.dashboard.tuning import TuningView
from fleetserve.settings import Settings
from fleetserve.wire import NotFound, Unauthorized

from . import rundocs


async def call(app: Dashboard, path: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    """Status and JSON body of one request to ``app`` (plain ASGI, no server)."""
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "method": method, "path": path, "headers": []}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(dict(msg))

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body[:1] == b"{" else {}


class BrokenView:
    """A view whose data fails unexpectedly (a bug), and one with its own data."""

    name = "broken"
    prefix = "/v1/broken/"
    script = "tuning.js"

    async def version(self) -> str:
        raise RuntimeError("boom")

    async def data(self, subpath: str) -> Any:
        if subpath == "ok":
            return {"fine": True}
        raise RuntimeError("a secret detail")


def test_the_run_store_is_tune_dir_with_home_expanded() -> None:
    fleet, view, added = default_views(Settings(tune_dir="~/runs-here"))  # the fleet first
    assert isinstance(view, TuningView) and isinstance(fleet, FleetView)
    assert view.store.root == Path.home() / "runs-here"
    assert isinstance(added, AddedView) and added.reports == Path.home() / "runs-here/reports"


def test_a_missing_store_is_an_empty_list(tmp_path: Path) -> None:
    view = TuningView(RunStore(tmp_path / "absent"))
    assert view.summaries() == []
    assert view.version_now() == view.version_now()
    with pytest.raises(NotFound, match="no tuning run 'x'"):
        view.run("x")


def test_the_version_changes_on_write_and_on_removal(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    view = TuningView(store)
    empty = view.version_now()
    rundocs.write(store, rundocs.older_run(), rundocs.running_run())
    two = view.version_now()
    assert two != empty
    store.path(rundocs.OLDER_ID).unlink()  # the older one: the newest mtime stays
    assert view.version_now() not in (two, empty)
    assert [s["id"] for s in view.summaries()] == [rundocs.RUNNING_ID]


def test_malformed_fields_still_summarize(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rundocs.write(store, {"id": "odd", "candidates": 7, "model": {"not": "a string"}})
    (out,) = TuningView(store).summaries()
    assert out["candidates"] == 0 and out["model"] == {"not": "a string"}


def test_routes_belong_to_the_dashboard() -> None:
    app = Dashboard(default_views(Settings()))
    for path in ("/dashboard", "/dashboard/", "/dashboard/events", "/v1/tuning/runs"):
        assert app.handles(path), path
    for path in ("/dashboardx", "/v1/models", "/v1/encode/x", "/metrics"):
        assert not app.handles(path), path


async def test_a_failing_view_is_a_500_without_details(tmp_path: Path) -> None:
    app = Dashboard([TuningView(RunStore(tmp_path)), BrokenView()])
    assert await call(app, "/v1/broken/ok") == (200, {"fine": True})
    status, body = await call(app, "/v1/broken/other")
    assert status == 500
    assert body == {"error": {"code": "internal_error", "message": "internal error", "field": None}}
    # a failing version keeps the stream going for the others
    assert await app.versions() == {
        "tuning": TuningView(RunStore(tmp_path)).version_now(),
        "broken": "",
    }


async def test_authorize_guards_data_and_events_not_the_page(tmp_path: Path) -> None:
    def deny(scope: Any) -> None:
        raise Unauthorized("no", field="authorization")

    app = Dashboard([TuningView(RunStore(tmp_path))], authorize=deny)
    for path in ("/v1/tuning/runs", "/dashboard/events"):
        status, body = await call(app, path)
        assert status == 401 and body["error"]["field"] == "authorization"
    assert (await call(app, "/dashboard"))[0] == 200
    assert (await call(app, "/dashboard/static/tuning.js"))[0] == 200
