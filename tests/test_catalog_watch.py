"""The catalog directory's watcher, one poll at a time, over a recording fake of the
process's models: what appears is adopted, what changes is served anew, what leaves
is forgotten, and a file that does not parse is passed over until it changes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from fleetserve.catalog import ModelSpec
from fleetserve.catalog_watch import CatalogWatch

from .tinymodels import write_spec


class Recorder:
    """``catalog_watch.Changes``: serves what it adopts, records every call."""

    def __init__(self) -> None:
        self.served: dict[str, ModelSpec] = {}
        self.calls: list[tuple[str, str]] = []

    def serves(self, spec: ModelSpec) -> bool:
        return self.served.get(spec.id) == spec

    async def adopt(self, spec: ModelSpec, where: object) -> bool:
        self.calls.append(("adopt", spec.id))
        if spec.id in self.served:
            return False
        self.served[spec.id] = spec
        return True

    async def forget(self, model: str) -> bool:
        self.calls.append(("forget", model))
        return self.served.pop(model, None) is not None


def _touch_later(f: Path) -> None:
    """A new mtime even on a coarse clock (the watch compares mtime and size)."""
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_files_that_appear_change_and_leave(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cat = tmp_path / "catalog"
    start = write_spec(cat, "at/start", tmp_path)
    models = Recorder()
    watch = CatalogWatch(cat, models, poll_s=0.01)

    async def go() -> None:
        await watch.step()
        assert models.calls == []  # the files there at start are served already
        f = write_spec(cat, "new/one", tmp_path)
        (cat / "broken.yaml").write_text("id: x\nfamilly: dense\n")
        (cat / ".hidden.yaml.tmp").write_text("not: a spec\n")  # a writer's temporary file
        await watch.step()
        assert models.calls == [("adopt", "new/one")] and "new/one" in models.served
        assert "familly" in caplog.text and "broken.yaml" in caplog.text
        await watch.step()  # nothing changed: nothing done, the broken file not re-read
        assert len(models.calls) == 1 and caplog.text.count("familly") == 1
        write_spec(cat, "new/one", tmp_path, max_seq_len=12)
        _touch_later(f)
        await watch.step()
        assert models.calls[1:] == [("forget", "new/one"), ("adopt", "new/one")]
        assert models.served["new/one"].max_seq_len == 12
        f.unlink()
        start.unlink()
        await watch.step()
        assert sorted(models.calls[3:]) == [("forget", "at/start"), ("forget", "new/one")]
        assert "new/one" not in models.served

    asyncio.run(go())


def test_a_file_that_changes_id_removes_the_old_one(tmp_path: Path) -> None:
    cat = tmp_path / "catalog"
    f = write_spec(cat, "first/id", tmp_path)
    models = Recorder()
    watch = CatalogWatch(cat, models)

    async def go() -> None:
        f.write_text(f.read_text().replace("first/id", "second/id"))
        _touch_later(f)
        await watch.step()

    asyncio.run(go())
    assert models.calls == [("forget", "first/id"), ("adopt", "second/id")]
