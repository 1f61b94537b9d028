"""The dashboard's HTTP routes against a real server: runs, the page, its files, events."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetserve.bench.tune.runs import RunStore, summary

from ..conftest import ServerThread, tiny_settings
from . import rundocs
from .conftest import KEY


def get(srv: ServerThread, path: str, **headers: str) -> httpx.Response:
    return httpx.get(srv.url + path, headers=headers, timeout=30)


def error(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "field"}, body
    return dict(body["error"])


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, object]]]:
    """(event, data) pairs from an SSE response's lines; comments are skipped."""
    name, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def test_list_is_newest_first_with_summaries(dash_server: ServerThread, store: RunStore) -> None:
    r = get(dash_server, "/v1/tuning/runs")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "list"
    ids = [run["id"] for run in body["data"]]
    assert ids[:4] == [rundocs.RUNNING_ID, rundocs.FAILED_ID, rundocs.BARE_ID, rundocs.OLDER_ID]
    by_id = {run["id"]: run for run in body["data"]}
    assert by_id[rundocs.OLDER_ID] == summary(store.get(rundocs.OLDER_ID))
    assert by_id[rundocs.OLDER_ID]["winner"] == "torch-fp32"
    assert by_id[rundocs.RUNNING_ID]["candidates"] == 4
    assert by_id[rundocs.BARE_ID]["family"] is None  # missing optional fields are null


def test_get_returns_the_whole_document(dash_server: ServerThread, store: RunStore) -> None:
    r = get(dash_server, f"/v1/tuning/runs/{rundocs.OLDER_ID}")
    assert r.status_code == 200
    assert r.json() == store.get(rundocs.OLDER_ID)
    assert r.headers["cache-control"] == "no-store"


def test_unknown_run_is_404_naming_it(dash_server: ServerThread) -> None:
    r = get(dash_server, "/v1/tuning/runs/no-such-run")
    assert r.status_code == 404
    assert error(r) == {
        "code": "not_found",
        "message": "no tuning run 'no-such-run'",
        "field": "id",
    }
    for bad in ("..%2Fsecret", ".hidden", "a%20b"):
        r = get(dash_server, f"/v1/tuning/runs/{bad}")
        assert r.status_code == 404 and error(r)["field"] == "id"
    r = get(dash_server, "/v1/tuning/other")
    assert r.status_code == 404 and error(r)["code"] == "not_found"
    r = httpx.post(dash_server.url + "/v1/tuning/runs", json={})
    assert r.status_code == 404 and error(r)["message"] == "no route for POST /v1/tuning/runs"


def test_unreadable_and_foreign_files_are_left_out(
    dash_server: ServerThread, store: RunStore
) -> None:
    (store.root / "a-list.json").write_text("[1, 2]")
    (store.root / "other-name.json").write_text(json.dumps({"id": "not-its-file-name"}))
    (store.root / ".tmp.json").write_text(json.dumps({"id": ".tmp"}))
    ids = {run["id"] for run in get(dash_server, "/v1/tuning/runs").json()["data"]}
    assert not ids & {"broken", "a-list", "other-name", "not-its-file-name", ".tmp"}
    r = get(dash_server, "/v1/tuning/runs/broken")
    assert r.status_code == 404
    assert error(r)["message"] == "tuning run 'broken' is unreadable"


def test_a_run_rewritten_mid_read_keeps_its_last_good_version(
    dash_server: ServerThread, store: RunStore
) -> None:
    run = rundocs.running_run()
    run["id"] = "20261201T100000-midread-cpu-aaaaaa"
    rundocs.write(store, run)
    first = get(dash_server, f"/v1/tuning/runs/{run['id']}").json()
    assert first["status"] == "running"
    # a writer that does not rename: the reader sees half a document
    path = store.path(run["id"])
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    r = get(dash_server, f"/v1/tuning/runs/{run['id']}")
    assert r.status_code == 200 and r.json() == first
    listed = {s["id"] for s in get(dash_server, "/v1/tuning/runs").json()["data"]}
    assert run["id"] in listed
    done = rundocs.finished(run)
    rundocs.write(store, done)
    assert get(dash_server, f"/v1/tuning/runs/{run['id']}").json()["status"] == "succeeded"


def test_non_finite_numbers_become_null(dash_server: ServerThread, store: RunStore) -> None:
    run = rundocs.bare_run()
    run.update(id="20261201T110000-nan-cpu-bbbbbb", noise=float("nan"), elapsed_s=float("inf"))
    rundocs.write(store, run)
    assert "NaN" in store.path(run["id"]).read_text()
    body = get(dash_server, f"/v1/tuning/runs/{run['id']}").json()  # strict JSON parses
    assert body["noise"] is None and body["elapsed_s"] is None


def test_page_and_its_files(dash_server: ServerThread) -> None:
    r = get(dash_server, "/dashboard")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert [u.split("?")[0] for u in urls if u.endswith(".js") or ".js?" in u] == [
        "/dashboard/static/core.js",
        "/dashboard/static/charts.js",
        "/dashboard/static/fleet.js",  # the first tab: the page opens on the fleet
        "/dashboard/static/tuning.js",
        "/dashboard/static/added.js",
    ]
    for url in urls:
        assert url.startswith("/dashboard/static/") or url == "data:,", url
        if url.startswith("/"):
            f = get(dash_server, url)
            assert f.status_code == 200, url
            kind = "text/css" if ".css" in url else "text/javascript"
            assert f.headers["content-type"].startswith(kind)
            # nothing is fetched from elsewhere: the only URL is the SVG namespace
            assert set(re.findall(r"https?://[^\s\"'`)]+", f.text)) <= {
                "http://www.w3.org/2000/svg"
            }
            again = get(dash_server, url.split("?")[0], **{"if-none-match": f.headers["etag"]})
            assert again.status_code == 304
    assert get(dash_server, "/dashboard/").status_code == 200
    r = get(dash_server, "/dashboard/static/nope.js")
    assert r.status_code == 404 and error(r)["message"] == "no dashboard file 'nope.js'"
    assert get(dash_server, "/dashboard/elsewhere").status_code == 404


def test_events_say_when_the_store_changes(dash_server: ServerThread, store: RunStore) -> None:
    with httpx.stream("GET", dash_server.url + "/dashboard/events", timeout=20) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = sse_events(r.iter_lines())
        name, hello = next(events)
        assert name == "hello"
        versions = hello["versions"]
        assert isinstance(versions, dict) and set(versions) == {"tuning", "fleet", "added"}
        run = rundocs.running_run()
        run["id"] = "20261201T120000-events-cpu-cccccc"
        rundocs.write(store, run)
        name, change = next(events)
        assert name == "change" and change["view"] == "tuning"
        assert change["version"] != versions["tuning"]


def test_a_server_with_an_open_stream_stops_promptly(tiny_catalog: Path, tmp_path: Path) -> None:
    srv = ServerThread(tiny_settings(tiny_catalog, tune_dir=str(tmp_path))).start()
    opened = threading.Event()
    ended = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", srv.url + "/dashboard/events", timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("event: hello"):
                    opened.set()
        ended.set()

    client = threading.Thread(target=listen, daemon=True)
    client.start()
    assert opened.wait(20)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 10  # not the stream's 60 s lifetime
    assert ended.wait(10)


def test_with_a_key_data_and_events_need_it(keyed_dash_server: ServerThread) -> None:
    srv = keyed_dash_server
    for path in ("/v1/tuning/runs", f"/v1/tuning/runs/{rundocs.RUNNING_ID}", "/dashboard/events"):
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            r = get(srv, path, **headers)
            assert r.status_code == 401, (path, headers)
            assert error(r)["code"] == "unauthorized" and error(r)["field"] == "authorization"
    auth = {"authorization": f"Bearer {KEY}"}
    assert get(srv, "/v1/tuning/runs", **auth).json()["data"][0]["id"] == rundocs.RUNNING_ID
    assert get(srv, f"/v1/tuning/runs/{rundocs.RUNNING_ID}", **auth).status_code == 200
    with httpx.stream("GET", srv.url + "/dashboard/events", headers=auth, timeout=20) as r:
        assert r.status_code == 200
        assert next(sse_events(r.iter_lines()))[0] == "hello"
    # the page and its files hold no data: open, so that the page can ask for the key
    page = get(srv, "/dashboard")
    assert page.status_code == 200 and rundocs.RUNNING_ID not in page.text
    assert get(srv, "/dashboard/static/core.js").status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/v1/models"])
def test_the_gateway_routes_still_answer(dash_server: ServerThread, path: str) -> None:
    assert get(dash_server, path).status_code == 200
