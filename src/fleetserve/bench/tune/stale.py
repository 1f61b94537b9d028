"""Which models the server's background tuner (``--tune auto``) should tune, and why.

A model is tuned when it runs on the rules or on another class's profile (a
fallback), and tuned again when its own profile was written by another fleetserve
version, for other weights, or by a quick search only (then the full search refines
it). Bundled profiles ship tuned: they are kept. A profile for another class is not
found at all (profiles are looked up by class), so a changed class tunes afresh.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ... import __version__
from ...catalog import ModelSpec
from ...catalog.profiles import Choice

SAMPLE = 1 << 16  # bytes hashed from each end of each weights file


def model_digest(spec: ModelSpec, path: Path) -> str:
    """What identifies the model tuned: its files' names and sizes and the first and
    last 64 KiB of each (a fine-tune of the same architecture has the same sizes;
    reading gigabytes would cost more than the tune). Where they sit is left out, so
    that workers with other cache paths agree."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    h = hashlib.sha256(json.dumps([spec.id, spec.family]).encode())
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.relative_to(path) if f != path else f.name}:{size}\n".encode())
        with f.open("rb") as fh:
            h.update(fh.read(SAMPLE))
            if size > 2 * SAMPLE:
                fh.seek(-SAMPLE, 2)
                h.update(fh.read(SAMPLE))
    return h.hexdigest()[:16]


def why_tune(choice: Choice, digest: str, *, refine: bool = True) -> str | None:
    """Why the background tuner should tune a model served by ``choice`` (``None``:
    it should not); ``digest`` is :func:`model_digest` of what is served; ``refine``:
    a quick search's profile is refined by a full one."""
    if choice.how in ("rule", "fallback"):
        return f"it runs on a {choice.how}"
    if choice.how != "tuned" or choice.bundled:
        return None  # declared in its spec, or shipped tuned with the package
    prov = choice.provenance
    if prov.get("fleetserve") != __version__:
        return f"its profile was written by fleetserve {prov.get('fleetserve', '?')}"
    if prov.get("model_digest") not in (None, digest):
        return "its weights changed since it was tuned"
    if prov.get("quick") and refine:
        return "its profile came from a quick search"
    return None


__all__ = ["model_digest", "why_tune"]
