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
        ({**MINIMAL, "famly": "dense"}, r"unknown key 'famly' \(did you mean 'family'\?\)"),
        ({**MINIMAL, "pooing": "cls"}, r"unknown key 'pooing' \(did you mean 'pooling'\?\)"),
        ({**MINIMAL, "colour": 1}, r"unknown key 'colour'; allowed: id, family"),
        ({**MINIMAL, "family": "densee"}, r"unknown family 'densee' \(did you mean 'dense'\?\)"),
        ({**MINIMAL, "family": 3}, "key 'family': unknown family 3; allowed: dense"),
        ({**MINIMAL, "runtime": "tensorrt"}, "unknown runtime 'tensorrt'; allowed: torch"),
        ({**MINIMAL, "pooling": "max"}, "allowed: mean, cls, none"),
        ({**MINIMAL, "id": 7}, "key 'id' must be a non-empty string"),
        ({**MINIMAL, "id": ""}, "key 'id' must be a non-empty string"),
        ({**MINIMAL, "id": "llama3:8b"}, "has a ':', which calls an adapter"),
        ({**MINIMAL, "max_seq_len": "abc"}, "key 'max_seq_len' must be an integer >= 1, not 'abc'"),
        ({**MINIMAL, "max_seq_len": 0}, "key 'max_seq_len' must be an integer >= 1"),
        ({**MINIMAL, "dimensions": 1.5}, "key 'dimensions' must be an integer"),
        ({**MINIMAL, "pinned": "maybe"}, "key 'pinned' must be true or false, not 'maybe'"),
        ({**MINIMAL, "normalize": 1}, "key 'normalize' must be true or false"),
        ({**MINIMAL, "description": 5}, "key 'description' must be a string"),
        ({**MINIMAL, "options": [1]}, "key 'options' must be a mapping"),
        ({**MINIMAL, "profiles": ["cpu"]}, "key 'profiles' must be a mapping"),
        ({**MINIMAL, "sources": [1]}, "key 'sources' must be a source or a list"),
        ({**MINIMAL, "source": "/w"}, "'sources' and 'source' both given"),
        ({**MINIMAL, "keep_alive": "soon"}, "keep_alive must be a number of seconds or a dur"),
        ({**MINIMAL, "keep_alive": -1}, "keep_alive must not be negative"),
        ({**MINIMAL, "keep_alive": "2d"}, "keep_alive must be a number of seconds"),
        ({**MINIMAL, "keep_alive": "48h"}, "keep_alive is enormous"),
        ({**MINIMAL, "keep_alive": True}, "keep_alive must be a number"),
        ([MINIMAL], "a model spec must be a mapping"),
    ],
)
def test_from_dict_validation(data: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        ModelSpec.from_dict(data)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 0.0), (0, 0.0), (45, 45.0), ("250ms", 0.25), ("5m", 300.0)]
)
def test_keep_alive_takes_seconds_or_a_duration(value: object, seconds: float) -> None:
    data = {**MINIMAL} if value is None else {**MINIMAL, "keep_alive": value}
    assert ModelSpec.from_dict(data).keep_alive == seconds


def test_optional_keys_may_be_null() -> None:
    spec = ModelSpec.from_dict(
        {**MINIMAL, "dimensions": None, "description": None, "options": None, "profiles": None}
    )
    assert spec.dimensions is None and spec.description == "" and spec.options == {}


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
    with pytest.raises(ModelNotFound, match=r"'one'; did you mean 'a/one'\? known models: "):
        cat.get("one")


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
    ("text", "match"),
    [
        ("- a\n- b\n", "mapping"),
        ("id: x\npooling: max\nsource: /w\n", "pooling"),
        ("", "the file is empty"),
        ("id: x\nfamly: dense\nsource: /w\n", "unknown key 'famly'"),
        ("id: x\nfamily: dense\n  source: /w\n", "line 3, column 9: invalid YAML: mapping values"),
        ("id: x\nsources: [/w\n", "line 3, column 1: invalid YAML"),
        ("id: x\nsource: /w\nprofiles:\n  cpu:\n    pooing: 1\n", "unknown field 'pooing'"),
    ],
)
def test_bad_spec_file_names_the_file(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "broken.yaml").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        Catalog.load([tmp_path], bundled=False)
    assert str(info.value).startswith(f"{tmp_path / 'broken.yaml'}: ")
    assert "\n" not in str(info.value)


def test_catalog_dir_must_exist_and_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as info:
        Catalog.load([tmp_path / "nope"])
    assert str(tmp_path / "nope") in str(info.value) and "--catalog" in str(info.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        Catalog.load([tmp_path / "file"])
    assert len(Catalog.load([tmp_path])) == len(Catalog.load())  # an empty dir adds nothing


def test_catalog_dir_expands_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / "cat", {"id": "mine/home", "sources": ["/x"]})
    assert "mine/home" in Catalog.load([Path("~/cat")], bundled=False)


BAD_START = [
    ("family: densee\n", "bad.yaml", "unknown family 'densee' (did you mean 'dense'?)"),
    ("famly: dense\n", "bad.yaml", "unknown key 'famly' (did you mean 'family'?)"),
    ("pooing: mean\n", "bad.yaml", "unknown key 'pooing' (did you mean 'pooling'?)"),
    ("max_seq_len: abc\n", "bad.yaml", "key 'max_seq_len' must be an integer"),
    ("pinned: maybe\n", "bad.yaml", "key 'pinned' must be true or false"),
    ("keep_alive: soon\n", "bad.yaml", "keep_alive must be a number of seconds"),
    ("family: dense\n  x: [\n", "bad.yaml", "invalid YAML"),
]


def start(args: list[str], catalog: Path, home: Path) -> Any:
    """``fleetserve ARGS --catalog CATALOG`` as a user runs it (HOME apart: caches go there)."""
    import subprocess
    import sys

    home.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "fleetserve", *args, "--catalog", str(catalog)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=home,
    )


def assert_one_error_line(r: Any, *needles: str) -> None:
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("text", "file", "what"), BAD_START)
def test_serve_refuses_a_bad_catalog_at_start(
    tmp_path: Path, text: str, file: str, what: str
) -> None:
    (tmp_path / file).write_text("id: mine/bad\nsources: [/w]\n" + text)
    r = start(["serve", "--port", "0"], tmp_path, tmp_path / "home")
    assert_one_error_line(r, str(tmp_path / file), what)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["models"], ["worker"], ["gateway", "--port", "0"]])
def test_every_command_refuses_a_bad_catalog_at_start(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "bad.yaml").write_text("id: mine/bad\nsources: [/w]\nfamly: dense\n")
    if command[0] == "gateway":  # the gateway asks for NATS first; the catalog still fails
        command = [*command, "--nats", "nats://127.0.0.1:1"]
    r = start(command, tmp_path, tmp_path / "home")
    assert_one_error_line(r, str(tmp_path / "bad.yaml"), "unknown key 'famly'")


def test_serve_refuses_a_missing_catalog_dir(tmp_path: Path) -> None:
    r = start(["serve", "--port", "0"], tmp_path / "does-not-exist", tmp_path / "home")
    assert_one_error_line(r, str(tmp_path / "does-not-exist"), "does not exist")


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
    assert (
        "package:fleetserve_no_such_pkg/model (not installed: pip install fleetserve-no-such-pkg)"
        in msg
    )
    assert str(tmp_path / "hub" / "models--org--absent" / "snapshots") in msg
    assert str(tmp_path / "local") in msg
    assert not is_present(sources, tmp_path / "hub")


def test_every_bundled_spec_names_a_known_family_and_runtime() -> None:
    from fleetserve.catalog.names import RUNTIMES
    from fleetserve.families import FAMILIES

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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hardware_class", "bge_runs", "bge_size"),
    [  # 33M params: 2 bytes each at bf16, 4 at fp32
        ("cpu-amx", "openvino bf16 (rule)", "~62.9 MiB"),
        # nearest with tunes whose bf16 it runs: cpu-amx's (openvino bf16 won there)
        ("cpu-avx512bf16", "openvino bf16 (rule)", "~62.9 MiB"),
        ("cpu-avx512", "torch fp32 (rule)", "~125.9 MiB"),  # cpu-avx2's: onnx, not switched
    ],
)
def test_fleetserve_models_shows_family_runtime_size_and_presence(
    tmp_path: Path, hardware_class: str, bge_runs: str, bge_size: str
) -> None:
    """The class is pinned: an absent model's size follows its class's precision (this
    failed on cpu-avx512bf16, where the detected class runs bge at fp32)."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "fleetserve", "models", "--hf-cache", str(tmp_path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "COLUMNS": "250",
            "PATH": "/usr/bin:/bin",
            "FLEETSERVE_HARDWARE_CLASS": hardware_class,
        },
    )
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    minilm = lines["sentence-transformers/all-MiniLM-L6-v2"]
    assert "dense" in minilm and "cold" in minilm and "MiB" in minilm and "yes" in minilm
    assert any(f"{rt} " in minilm for rt in ("torch", "onnx", "openvino"))  # what it runs on
    bge = lines["BAAI/bge-small-en-v1.5"]  # absent: its declared size (33M params) in MiB
    assert bge_size in bge and bge_runs in bge and "hf:BAAI/bge-small-en-v1.5" in bge
    assert "no server on" in r.stderr  # piped: the data on stdout, notes beside it
