"""The added-models view's data: ``GET /v1/added/models`` and ``GET
/v1/added/models/{id}``, the reports ``fleetserve add`` writes
(``<tune_dir>/reports/add-<id>.json``, see ``add/report.py``).

Read defensively, as the tuning view reads its runs: a report that does not parse is
left out of the list (and is a 404 naming it), and documents pass through as written.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ..wire import NotFound

PREFIX = "add-"


class AddedView:
    """Every model ``fleetserve add`` added: its family and why, the reference check,
    the tune against torch fp32, its footprint."""

    name = "added"
    prefix = "/v1/added/"
    script = "added.js"

    def __init__(self, reports: Path) -> None:
        self.reports = reports

    async def version(self) -> str:
        return await asyncio.to_thread(self.version_now)

    async def data(self, subpath: str) -> object:
        if subpath == "models":
            return {"object": "list", "data": await asyncio.to_thread(self.summaries)}
        if subpath.startswith("models/"):
            return await asyncio.to_thread(self.report, subpath[len("models/") :])
        raise NotFound(f"no route for GET {self.prefix}{subpath}", field="path")

    def version_now(self) -> str:
        stats = [f.stat() for f in self._files()]
        newest = max((st.st_mtime_ns for st in stats), default=0)
        return f"{len(stats)}-{newest}-{sum(st.st_size for st in stats)}"

    def summaries(self) -> list[dict[str, object]]:
        """One line per readable report, newest first."""
        files = sorted(self._files(), key=lambda f: f.stat().st_mtime_ns, reverse=True)
        return [_summary(doc) for f in files if (doc := _read(f)) is not None]

    def report(self, model: str) -> dict[str, object]:
        """The whole report of ``model``, or ``NotFound`` naming it."""
        if not model or ".." in model or "\\" in model:
            raise NotFound(f"no report for {model!r}", field="id")
        doc = _read(self.reports / f"{PREFIX}{model.replace('/', '--')}.json")
        if doc is None:
            raise NotFound(f"no report of `fleetserve add` for {model!r}", field="id")
        return doc

    def _files(self) -> list[Path]:
        try:
            return [f for f in self.reports.glob(f"{PREFIX}*.json") if f.is_file()]
        except OSError:
            return []


def _read(file: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None


def _obj(v: object) -> dict[str, object]:
    return v if isinstance(v, dict) else {}


def _summary(doc: dict[str, object]) -> dict[str, object]:
    fields, evidence = _obj(doc.get("fields")), _obj(doc.get("evidence"))
    check, tuned = _obj(doc.get("check")), _obj(doc.get("tuned"))
    return {
        "model": doc["model"],
        "family": fields.get("family"),
        "family_why": evidence.get("family"),
        "hardware_class": doc.get("hardware_class"),
        "check": check.get("status"),
        "library": check.get("library"),
        "winner": tuned.get("winner"),
        "tokens_per_s": tuned.get("tokens_per_s"),
        "vs_torch_fp32": tuned.get("vs_torch_fp32"),
        "not_tuned": doc.get("not_tuned") or None,
        "resident_bytes": doc.get("resident_bytes"),
        "weights_bytes": doc.get("weights_bytes"),
        "seconds": _obj(doc.get("seconds")).get("total"),
        "spec_file": doc.get("spec_file"),
    }
