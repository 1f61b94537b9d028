"""The catalog: bundled specs, validation, profiles, overrides and offline sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.catalog import DEFAULT_MODEL, Catalog, ModelSpec, Profile, is_present, resolve
from fleetserve.catalog.spec import CostModel
from fleetserve.wire import ModelNotFound

MINIMAL: dict[str, Any] = {"id": "org/m", "sources": ["/nowhere"]}


def test_bundled_catalog_has_minilm_with_cpu_budgets() -> None:
    cat = Catalog.load()
    assert DEFAULT_MODEL == "sentence-transformers/all-MiniLM-L6-v2"
    assert DEFAULT_MODEL in cat
    spec = cat.get(DEFAULT_MODEL)
    assert (spec.family, spec.runtime, spec.pooling) == ("dense", "torch", "mean")
    assert spec.dimensions == 384 and spec.normalize is True
    assert spec.profiles == {}  # bundled specs declare no profile: tuned files and rules do
    cpu = Profile.from_dict("cpu", spec.budgets["cpu"])
    assert "precision" not in spec.budgets["cpu"]  # the rules choose it
    assert cpu.max_batch_tokens > 0 and cpu.max_batch_size > 0
    assert any(s.startswith("package:") for s in spec.sources)


def test_from_dict_defaults_and_single_source_string() -> None:
    spec = ModelSpec.from_dict({"id": "a/b", "source": "/w"})
    assert spec.sources == ("/w",)
    assert (spec.family, spec.runtime, spec.pooling, spec.max_seq_len) == (
        "dense",
        "torch",
        "mean",
        512,
    )
    assert spec.dimensions is None and spec.pinned is False and spec.profiles == {}


def test_from_dict_reads_profiles_and_cost() -> None:
    spec = ModelSpec.from_dict(
        {
            **MINIMAL,
            "pooling": "cls",
            "profiles": {
                "cuda": {
                    "precision": "bf16",
                    "max_batch_tokens": 4096,
                    "max_batch_size": 128,
                    "cost": {"fixed_ms": 2, "per_token_ms": 0.5},
                },
                "cpu": None,
            },
        }
    )
    assert spec.pooling == "cls"
    cuda = spec.profiles["cuda"]
    assert (cuda.precision, cuda.max_batch_tokens, cuda.max_batch_size) == ("bf16", 4096, 128)
    assert cuda.cost == CostModel(fixed_ms=2.0, per_token_ms=0.5)
    assert spec.profiles["cpu"] == Profile(hardware="cpu")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"sources": ["/w"]}, "missing 'id'"),
        ({"id": "x"}, "source"),
        ({"id": "x", "sources": []}, "source"),
        ({**MINIMAL, "pooling": "max"}, "pooling"),
        ({**MINIMAL, "profiles": {"cpu": {"precision": "int4"}}}, "precision"),
        ({**MINIMAL, "profiles": {"cpu": {"max_batch_size": 0}}}, "max_batch_size"),
        ({**MINIMAL, "profiles": {"cpu": {"max_batch_size": "8"}}}, "max_batch_size"),
        ({**MINIMAL, "profiles": {"cpu": {"pooing": "mean"}}}, "unknown field 'pooing'"),
        ({**MINIMAL, "profiles": {"cpu": {"cost": {"fixed": 1}}}}, "cost"),
        ({**MINIMAL, "budgets": {"cpu": {"precision": "fp8"}}}, "budgets.cpu"),
    ],
)
def test_from_dict_validation(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_dict(data)


def test_cost_model_predicts_padding() -> None:
    c = CostModel(fixed_ms=1.0, per_token_ms=0.5, per_padded_token_ms=0.25)
    assert c.predict_ms(tokens=10, max_len=8, batch_size=2) == 1.0 + 5.0 + 4.0


def write(d: Path, data: dict[str, Any], name: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    f = d / (name or data["id"].replace("/", "__") + ".yaml")
    f.write_text(yaml.safe_dump(data))
    return f


def test_get_unknown_lists_the_known_models() -> None:
    cat = Catalog([ModelSpec.from_dict({**MINIMAL, "id": i}) for i in ("b/two", "a/one")])
    assert len(cat) == 2 and "a/one" in cat and "nope" not in cat
    with pytest.raises(ModelNotFound) as info:
        cat.get("nope")
    assert info.value.field == "model"
    assert "'nope'" in info.value.message and "a/one, b/two" in info.value.message
    with pytest.raises(ModelNotFound, match="none"):
        Catalog().get("x")


def test_restrict() -> None:
    cat = Catalog([ModelSpec.from_dict({**MINIMAL, "id": i}) for i in ("a", "b", "c")])
    assert [s.id for s in cat.restrict(["c", "a"])] == ["c", "a"]
    with pytest.raises(ModelNotFound):
        cat.restrict(["a", "zzz"])


def test_extra_catalog_dir_adds_and_overrides(tmp_path: Path) -> None:
    write(tmp_path, {"id": DEFAULT_MODEL, "sources": ["/mine"], "dimensions": 7})
    write(tmp_path, {"id": "mine/extra", "sources": ["/x"]}, name="extra.yml")
    (tmp_path / "notes.txt").write_text("not a spec")
    bundled = Catalog.load()
    cat = Catalog.load([tmp_path])
    assert len(cat) == len(bundled) + 1
    assert cat.get(DEFAULT_MODEL).dimensions == 7 and cat.get(DEFAULT_MODEL).sources == ("/mine",)
    assert "mine/extra" in cat
    only = Catalog.load([tmp_path], bundled=False)
    assert sorted(s.id for s in only) == sorted([DEFAULT_MODEL, "mine/extra"])


@pytest.mark.parametrize(
    ("text", "match"), [("- a\n- b\n", "mapping"), ("id: x\npooling: max\nsource: /w\n", "pooling")]
)
def test_bad_spec_file_names_the_file(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "broken.yaml").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        Catalog.load([tmp_path], bundled=False)
    assert "broken.yaml" in str(info.value)


# -- sources ---------------------------------------------------------------------------


def weights(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    return d


def test_resolve_local_dir_and_file_url(tmp_path: Path) -> None:
    w = weights(tmp_path / "w")
    hf = tmp_path / "hf"
    assert resolve("m", (str(w),), hf) == w
    assert resolve("m", (f"file://{w}",), hf) == w
    assert is_present((str(w),), hf) and not is_present((str(tmp_path / "none"),), hf)


def test_resolve_skips_missing_and_empty_sources_in_order(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    first, second = weights(tmp_path / "first"), weights(tmp_path / "second")
    got = resolve(
        "m", (str(tmp_path / "missing"), str(empty), str(second), str(first)), tmp_path / "hf"
    )
    assert got == second


def test_resolve_package_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "fleetserve_fake_weights_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    w = weights(pkg / "model")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    got = resolve("m", ("package:fleetserve_fake_weights_pkg/model",), tmp_path / "hf")
    assert got.resolve() == w.resolve()
    assert is_present(("package:fleetserve_fake_weights_pkg/model",), tmp_path / "hf")


def hf_snapshot(cache: Path, repo: str, rev: str, *, ref: bool = True) -> Path:
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = weights(root / "snapshots" / rev)
    if ref:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text(rev + "\n")
    return snap


def test_resolve_hf_cache_follows_refs_main(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    hf_snapshot(cache, "org/name", "bbbb", ref=False)
    want = hf_snapshot(cache, "org/name", "aaaa")  # refs/main points here, not the newest name
    assert resolve("org/name", ("hf:org/name",), cache) == want
    assert is_present(("hf:org/name",), cache)


def test_resolve_hf_cache_without_refs_takes_a_snapshot(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snap = hf_snapshot(cache, "org/name", "0123abc", ref=False)
    assert resolve("org/name", ("hf:org/name",), cache) == snap


def test_missing_model_lists_where_it_looked(tmp_path: Path) -> None:
    sources = ("package:fleetserve_no_such_pkg/model", "hf:org/absent", str(tmp_path / "local"))
    with pytest.raises(ModelNotFound) as info:
        resolve("org/absent", sources, tmp_path / "hub")
    msg = info.value.message
    assert info.value.field == "model" and "'org/absent'" in msg
    assert "package:fleetserve_no_such_pkg/model (not installed)" in msg
    assert str(tmp_path / "hub" / "models--org--absent" / "snapshots") in msg
    assert str(tmp_path / "local") in msg
    assert not is_present(sources, tmp_path / "hub")


def test_every_bundled_spec_names_a_known_family_and_runtime() -> None:
    from fleetserve.families import FAMILIES
    from fleetserve.runtimes import RUNTIMES

    cat = Catalog.load()
    families = {s.family for s in cat}
    assert families <= set(FAMILIES)
    assert {s.runtime for s in cat} <= set(RUNTIMES)
    # the bundled real models and documented hub entries are all listed
    for model in (
        "sentence-transformers/all-MiniLM-L6-v2",
        "BAAI/bge-small-en-v1.5",
        "intfloat/e5-small-v2",
        "thenlper/gte-small",
        "BAAI/bge-reranker-base",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
    ):
        assert model in cat, model  # fmt: skip
    for family in (
        "dense",
        "sparse",
        "multivector",
        "cross_encoder",
        "ner",
        "span_ner",
        "zero_shot",
        "image",
        "generate",
    ):
        assert family in families, family  # fmt: skip
    # only the embedded default loads at start; every other model loads on first use
    assert [s.id for s in cat if s.pinned] == ["sentence-transformers/all-MiniLM-L6-v2"]


def test_fleetserve_models_shows_family_runtime_size_and_presence(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "fleetserve", "models", "--hf-cache", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    lines = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if "│" in line}
    minilm = lines["sentence-transformers/all-MiniLM-L6-v2"]
    assert "dense" in minilm and "yes" in minilm and "MiB" in minilm
    assert any(f"{rt} " in minilm for rt in ("torch", "onnx", "openvino"))  # what it runs on
    bge = lines["BAAI/bge-small-en-v1.5"]
    assert "no" in bge and "33M params" in bge and "hf:BAAI/bge-small-en-v1.5" in bge
