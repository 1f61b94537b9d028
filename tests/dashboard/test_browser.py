"""The dashboard in a real headless Chromium, against a real server on loopback.

It renders a running tuning run, then follows it live (no reload) to its end; renders
the edge cases (a failed run, a bare one, an unknown id) without a script error; works
at a phone's width; falls back to polling; and asks for the API key when one is set.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetserve.bench.tune.runs import RunStore

from ..browser import Browser, find_chromium
from ..conftest import TINY, ServerThread
from . import rundocs
from .conftest import KEY

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; make test does)"
)


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None
    with Browser(CHROMIUM, width=1280, height=900) as b:
        yield b


def js(value: object) -> str:
    return json.dumps(value)


def check_png(data: bytes, size: tuple[int, int]) -> None:
    """A real PNG of ``size`` that is not blank."""
    from PIL import Image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(io.BytesIO(data))
    assert img.format == "PNG" and img.size == size
    colours = img.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) >= 16, "the screenshot looks blank"


def open_dashboard(b: Browser, url: str) -> None:
    b.goto(url)
    b.wait_for("!!document.querySelector('.run-title')")


def test_it_renders_a_run_and_follows_it_live(
    browser: Browser, dash_server: ServerThread, store: RunStore, tmp_path: Path
) -> None:
    rundocs.write(store, rundocs.running_run())
    open_dashboard(browser, dash_server.url + "/dashboard#/tuning")
    assert browser.text(".run-title") == TINY
    assert browser.wait_for("document.getElementById('live').dataset.state === 'live'")
    rows = browser.evaluate("[...document.querySelectorAll('.cand-table tbody tr')].length")
    assert rows == 4
    assert "min_cosine 0.9100 < 0.999" in browser.text("tr[data-candidate='onnx-int8']")
    assert "14% slower" in browser.text("tr[data-candidate='torch-fp32']")
    assert "still measuring" in browser.text(".chosen")
    # the older run in the list shows its winner
    older = browser.text(f"a[data-run='{rundocs.OLDER_ID}']")
    assert "winner: torch-fp32" in older
    check_png(browser.screenshot(tmp_path / "running.png"), (1280, 900))

    browser.evaluate("window.__noReload = true")
    rundocs.write(store, rundocs.finished(rundocs.running_run()))
    browser.wait_for("document.querySelector('.winner-id')?.textContent === 'torch-fp16'")
    assert browser.evaluate("window.__noReload") is True  # updated in place
    assert browser.text(".run-head .badge") == "succeeded"
    assert browser.evaluate("document.querySelectorAll('.cand-table tbody tr').length") == 6
    assert browser.text("tr.cand-won .cand-id") == "torch-fp16"
    assert "fp16" in browser.text(".chosen .profile")
    # the knee plot: two charts with lines, the knee marked
    assert browser.evaluate("document.querySelectorAll('.knee svg polyline').length") == 3
    assert "knee 40.0 rps" in browser.text(".knee")
    assert "winner: torch-fp16" in browser.text(f"a[data-run='{rundocs.RUNNING_ID}']")
    check_png(browser.screenshot(tmp_path / "succeeded.png"), (1280, 900))
    assert browser.errors == []


def test_edge_cases_render_without_errors(
    browser: Browser, dash_server: ServerThread, store: RunStore, tmp_path: Path
) -> None:
    open_dashboard(browser, dash_server.url + "/dashboard#/tuning")
    scripts = browser.evaluate("document.scripts.length")

    browser.click(f"a[data-run='{rundocs.FAILED_ID}']")
    browser.wait_for("!!document.querySelector('.run-error')")
    assert "<script>alert(1)</script>" in browser.text(".run-error pre")  # text, not markup
    assert browser.evaluate("document.scripts.length") == scripts
    assert "the run failed" in browser.text(".chosen")
    assert browser.text(".knee .empty") == "Not measured."

    browser.click(f"a[data-run='{rundocs.BARE_ID}']")
    browser.wait_for(f"document.querySelector('.run-title')?.textContent === {js('tiny/bare')}")
    assert browser.text(".candidates .empty") == "No candidates tried yet."

    browser.evaluate("location.hash = '#/tuning/no-such-run'")
    browser.wait_for("document.querySelector('.run-detail')?.innerText.includes('no-such-run')")

    browser.set_viewport(390, 844)
    browser.evaluate(f"location.hash = '#/tuning/{rundocs.RUNNING_ID}'")
    browser.wait_for(f"document.querySelector('.run-id')?.textContent === {js(rundocs.RUNNING_ID)}")
    width = browser.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways at 390 px: {width}"
    check_png(browser.screenshot(tmp_path / "narrow.png"), (390, 844))
    assert browser.errors == []


def test_polling_is_the_fallback(
    browser: Browser, dash_server: ServerThread, store: RunStore
) -> None:
    open_dashboard(browser, dash_server.url + "/dashboard?live=poll#/tuning")
    assert browser.wait_for("document.getElementById('live').dataset.state === 'polling'")
    run = rundocs.bare_run()
    run.update(
        id="20261202T000000-polled-cpu-dddddd",
        model="tiny/polled",
        started_at="2026-12-02T00:00:00Z",
    )
    rundocs.write(store, run)
    browser.wait_for(f"document.querySelector('.run-title')?.textContent === {js('tiny/polled')}")
    assert browser.errors == []


def test_with_a_key_the_page_asks_for_it(
    browser: Browser, keyed_dash_server: ServerThread, keyed_store: RunStore
) -> None:
    browser.goto(keyed_dash_server.url + "/dashboard#/tuning")
    browser.wait_for("!document.getElementById('key-form').hidden")
    assert browser.evaluate("document.querySelectorAll('.run-list a').length") == 0
    submit = (
        "document.getElementById('key-input').value = {key};"
        "document.getElementById('key-form').requestSubmit();"
    )
    browser.evaluate(submit.format(key=js("wrong")))
    browser.wait_for("document.getElementById('key-error').textContent.includes('refused')")
    browser.evaluate(submit.format(key=js(KEY)))
    browser.wait_for("!!document.querySelector('.run-title')")
    assert browser.evaluate("document.getElementById('key-form').hidden") is True
    assert browser.wait_for("document.getElementById('live').dataset.state === 'live'")
    # live updates carry the key too (fetch streaming, not EventSource)
    rundocs.write(keyed_store, rundocs.finished(rundocs.running_run()))
    browser.wait_for("document.querySelector('.winner-id')?.textContent === 'torch-fp16'")
    # the key lives in this tab's sessionStorage: a reload needs no prompt
    browser.goto(keyed_dash_server.url + "/dashboard#/tuning")
    browser.wait_for("!!document.querySelector('.winner-id')")
    assert browser.evaluate("document.getElementById('key-form').hidden") is True
    assert browser.errors == []
    assert browser.network_errors and all("401" in e for e in browser.network_errors)
