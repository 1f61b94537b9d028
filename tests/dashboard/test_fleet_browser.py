"""The fleet view in a real headless Chromium, against a real embedded server serving
the whole bundled catalog (17 models) and a tiny one.

It opens ``/dashboard#/fleet``, drives traffic, and checks from the DOM and from the
screenshot (the pixels of the fleet section, with Pillow) that the figures moved,
live, without a reload; and that the page does not scroll sideways, wide or narrow.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..browser import Browser, find_chromium
from ..conftest import TINY, ServerThread, tiny_settings

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; make test does)"
)
SECTION = "section[data-view='fleet']"
TILE = "document.querySelector(\"[data-figure='{}'] .tile-value\")?.textContent"


@pytest.fixture(scope="module")
def catalog_server(
    tiny_catalog: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """The tiny model loaded at start, and every bundled model served (on first use)."""
    root = tmp_path_factory.mktemp("fleet-browser")
    settings = tiny_settings(
        tiny_catalog,
        models=f"{TINY},*",
        tune_dir=str(root / "tune"),
        adapter_store=(root / "adapters").as_uri(),
    )
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def section_pixels(b: Browser, path: Path) -> object:
    """The visible part of the fleet section, cropped from a screenshot of the page."""
    from PIL import Image

    box = b.evaluate(
        f"(() => {{ const r = document.querySelector({SECTION!r}).getBoundingClientRect();"
        " return [r.left, r.top, r.right, Math.min(r.bottom, window.innerHeight)]; })()"
    )
    img = Image.open(io.BytesIO(b.screenshot(path))).convert("RGB")
    return img.crop(tuple(round(v) for v in box))


def changed_share(a: object, b: object) -> float:
    from PIL import Image, ImageChops

    assert isinstance(a, Image.Image) and isinstance(b, Image.Image) and a.size == b.size
    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > 24 else 0)
    dark, lit = diff.histogram()[0], diff.histogram()[255]
    return lit / (dark + lit)


def no_sideways_scroll(b: Browser) -> None:
    width = b.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways: {width}"


def text(b: Browser, figure: str, model: str) -> str:
    return str(b.evaluate(js_text(figure, model)))


def test_the_fleet_view_follows_traffic_live(catalog_server: ServerThread, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    with Browser(CHROMIUM, width=1280, height=900) as b:
        b.goto(catalog_server.url + "/dashboard#/fleet")
        b.wait_for(f"document.querySelectorAll({SECTION + ' tr[data-model]'!r}).length >= 18")
        assert b.wait_for("document.getElementById('live').dataset.state === 'live'")
        assert b.evaluate(f"document.querySelector({SECTION!r}).hidden") is False
        assert b.text(".tab[aria-selected='true']") == "Fleet"
        assert b.evaluate(
            "!!document.querySelector(\"[data-worker] [data-resident='tiny/dense-bert']\")"
        )
        tier = b.text("[data-worker] .memtier")  # sleeping models' budget, beside the budget
        assert tier.startswith("asleep: 0 of a ") and "host tier" in tier, tier
        no_sideways_scroll(b)
        assert b.evaluate(TILE.format("requests")) == "0"
        before = section_pixels(b, tmp_path / "before.png")

        b.evaluate("window.__noReload = true")
        n = 15
        with httpx.Client(base_url=catalog_server.url, timeout=30) as client:
            for i in range(n):
                body = {"model": TINY, "input": ["a fleet of small models"] * (1 + i % 4)}
                assert client.post("/v1/embeddings", json=body).status_code == 200
        b.wait_for(f"{TILE.format('requests')} === '{n}'")
        b.wait_for(f"!['', '0', '—'].includes({js_text('rps', TINY)})")
        assert b.evaluate("window.__noReload") is True  # updated in place
        assert "ms" in b.text(f"tr[data-model='{TINY}']")  # its p50 and p99
        assert text(b, "rps", TINY) != "0" and text(b, "waiting", TINY) == "0 / 0"
        first = b.evaluate(f"document.querySelector({SECTION + ' tbody tr'!r}).dataset.model")
        assert first == TINY  # the busy model sorts first
        after = section_pixels(b, tmp_path / "after.png")
        share = changed_share(before, after)
        assert share > 0.003, f"only {share:.2%} of the fleet section's pixels changed"
        # the throughput chart drew a line
        assert b.evaluate("document.querySelectorAll('#fleet-charts polyline').length") >= 1

        b.set_viewport(390, 844)
        b.wait_for("window.innerWidth === 390")
        no_sideways_scroll(b)
        assert b.errors == []


def js_text(figure: str, model: str) -> str:
    sel = f"tr[data-model='{model}'] [data-figure='{figure}']"
    return f"(document.querySelector({sel!r})?.innerText ?? '').trim()"
