"""Quality-gate passes kept on disk: the next process (or a reload) judges nothing
again for the same model, precision, engine, CPU and weights; a failure, other
weights, another library version or a torn file are judged again; a disk that refuses
the write costs one warning, not the load."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from fleetserve.assembly import build_catalog, build_profiles, build_runner
from fleetserve.bench.tune import gate as gate_mod
from fleetserve.bench.tune.gate import gate_at_load
from fleetserve.bench.tune.verdicts import Verdicts
from fleetserve.catalog import facts
from fleetserve.families import AnyFamily
from fleetserve.metrics import Metrics
from fleetserve.runtimes.cache import weights_fingerprint

from ...conftest import tiny_settings
from .conftest import MODEL
from .test_gate import factory


class Gate:
    """A process's gate over ``root``: counts the references it loads."""

    def __init__(self, catalog: Path, root: Path, *, noisy: bool = False) -> None:
        self.spec, self.make = factory(catalog, noisy=noisy)
        self.path = Path(self.spec.sources[0])
        self.refs = 0

        def reference() -> AnyFamily:
            self.refs += 1
            return self.make("fp32")  # type: ignore[no-any-return]

        self.gate = gate_at_load(
            self.spec, "bf16", reference, lambda: weights_fingerprint(self.path), Verdicts(root)
        )

    def load(self) -> Any:
        candidate = self.make("bf16")
        candidate.load()
        return self.gate(candidate)


def test_a_pass_holds_for_the_next_process(catalog: Path, tmp_path: Path) -> None:
    root = tmp_path / "gate"
    first = Gate(catalog, root)
    assert first.load().runtime.precision == "bf16" and first.refs == 1
    (kept,) = root.glob("*.json")
    body = json.loads(kept.read_text())
    assert body["passed"] is True and body["model"] == MODEL and body["precision"] == "bf16"
    assert body["metric"] == "min_cosine" and body["value"] >= 0.9999
    second = Gate(catalog, root)  # another process: nothing in memory
    assert second.load().runtime.precision == "bf16" and second.refs == 0
    elsewhere = Gate(catalog, tmp_path / "elsewhere")  # another cache: judged
    assert elsewhere.load().runtime.precision == "bf16" and elsewhere.refs == 1


def test_a_failure_is_judged_again(catalog: Path, tmp_path: Path) -> None:
    root = tmp_path / "gate"
    for _ in range(2):
        noisy = Gate(catalog, root, noisy=True)
        assert noisy.load().runtime.precision == "fp32" and noisy.refs == 1
    assert list(root.glob("*.json")) == []


@pytest.mark.parametrize("torn", ["", "{", '{"passed": true}', "[1]"])
def test_a_torn_verdict_is_judged_again_and_rewritten(
    catalog: Path, tmp_path: Path, torn: str
) -> None:
    root = tmp_path / "gate"
    Gate(catalog, root).load()
    (kept,) = root.glob("*.json")
    kept.write_text(torn)
    again = Gate(catalog, root)
    assert again.load().runtime.precision == "bf16" and again.refs == 1
    assert json.loads(kept.read_text())["passed"] is True
    assert [p.name for p in root.iterdir()] == [kept.name]  # no temporary file left


def test_a_disk_that_refuses_the_write_warns_once_and_the_load_goes_on(
    catalog: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    g = Gate(catalog, tmp_path / "file" / "gate")
    with caplog.at_level(logging.WARNING, logger="fleetserve.bench.tune"):
        for _ in range(2):
            assert g.load().runtime.precision == "bf16"
            g.gate._passed = None  # as if evicted under another fingerprint: judged again
    assert g.refs == 2
    assert caplog.text.count("cannot keep quality-gate verdicts") == 1


async def test_the_servers_runners_share_passes_through_their_cache_dir(
    catalog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule's bf16 on cpu-amx is gated at load: the second runner (as in the next
    process) loads no reference; a new library version is judged again."""
    settings = tiny_settings(catalog, models=MODEL, hardware_class="cpu-amx",
                             cache_dir=str(tmp_path / "cache"))  # fmt: skip
    spec = build_catalog(settings).get(MODEL)
    choice = build_profiles(settings).choose(spec)
    assert choice.how == "rule" and choice.profile.precision == "bf16"

    judged: list[str] = []
    check = gate_mod.check

    def counted(spec: Any, candidate: AnyFamily, reference: AnyFamily) -> Any:
        judged.append(spec.id)
        return check(spec, candidate, reference)

    monkeypatch.setattr(gate_mod, "check", counted)

    async def references() -> int:
        before = len(judged)
        runner = build_runner(spec, settings, Metrics(), choice)
        await runner.load()
        assert runner.profile.precision == "bf16"
        runner.unload()
        return len(judged) - before

    assert await references() == 1
    assert await references() == 0
    assert len(list((tmp_path / "cache" / "gate").glob("*.json"))) == 1
    monkeypatch.setattr(facts, "library_version", lambda runtime: "a newer one")
    assert await references() == 1
    assert len(list((tmp_path / "cache" / "gate").glob("*.json"))) == 2
