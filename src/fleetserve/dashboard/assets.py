"""The page and its static files, shipped as package data in ``dashboard/static/``.

Everything is read once, at start, and served from memory with an ETag. The page
loads nothing from elsewhere; its Content-Security-Policy says so to the browser too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
}
CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
SCRIPTS_MARKER = "<!-- view scripts -->"
CORE_SCRIPTS = ("core.js", "charts.js")


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: bytes
    etag: bytes

    @classmethod
    def of(cls, name: str, body: bytes) -> Asset:
        ext = name[name.rfind(".") :]
        digest = hashlib.sha256(body).hexdigest()[:16]
        return cls(body, TYPES.get(ext, b"application/octet-stream"), f'"{digest}"'.encode())

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", self.content_type),
            (b"etag", self.etag),
            (b"cache-control", b"no-cache"),
            *SECURITY_HEADERS,
        ]


def load_static() -> dict[str, Asset]:
    """Every file in ``static/`` but the page template, by name."""
    root = resources.files("fleetserve.dashboard") / "static"
    return {
        f.name: Asset.of(f.name, f.read_bytes())
        for f in root.iterdir()
        if f.is_file() and f.name != "index.html" and f.name[:1] != "."
    }


def render_page(static: dict[str, Asset], view_scripts: list[str]) -> Asset:
    """``index.html`` with a ``<script>`` for the core and for each view, in order.
    Each URL carries its file's hash, so a browser never runs a stale mix."""
    template = (resources.files("fleetserve.dashboard") / "static" / "index.html").read_text()
    tags = []
    for name in (*CORE_SCRIPTS, *view_scripts):
        asset = static.get(name)
        if asset is None:
            raise FileNotFoundError(f"dashboard script {name} is not in dashboard/static/")
        version = asset.etag.decode().strip('"')
        tags.append(f'<script src="/dashboard/static/{name}?v={version}" defer></script>')
    css = static["dashboard.css"].etag.decode().strip('"')
    html = template.replace(SCRIPTS_MARKER, "\n    ".join(tags)).replace("{css_version}", css)
    return Asset.of("index.html", html.encode())


__all__ = ["Asset", "load_static", "render_page"]
