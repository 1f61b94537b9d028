"""fleetserve.ops.capacity: a pool's KEDA lag thresholds from the tuned profiles."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from fleetserve.catalog.profiles import bundled_dir, read_profile_file, write_profile_file
from fleetserve.ops.capacity import (
    DEFAULT_MAX_TOKENS,
    consumer_name,
    lag_threshold,
    lag_thresholds,
    main,
    model_capacity,
)
from fleetserve.wire import Priority

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_capacity_is_the_tuned_knee() -> None:
    """Read from the bundled profiles: those whose tune swept a knee (a winner that runs
    one process) are priced by it."""
    kneed = [
        pf
        for f in sorted(bundled_dir().glob("*/*.yaml"))
        if (pf := read_profile_file(f)).provenance["figures"].get("knee_rps")
    ]
    assert kneed, "no bundled profile has a knee"
    for pf in kneed:
        model, cls = pf.model, pf.hardware_class
        cap = model_capacity(model, cls)
        assert cap.rps == pf.provenance["figures"]["knee_rps"]
        assert cap.hardware_class == cls and "knee_rps" in cap.source
        assert lag_thresholds([cap]) == {
            model: {"batch": math.ceil(cap.rps * 10), "interactive": math.ceil(cap.rps)}
        }


def test_without_a_knee_the_cost_model_decides(tmp_path: Path) -> None:
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{MINILM.replace('/', '--')}.yaml")
    prov = {**pf.provenance, "figures": {**pf.provenance["figures"], "knee_rps": None}}
    write_profile_file(tmp_path, MINILM, pf.profile, prov)
    cap = model_capacity(MINILM, "cpu-amx", tmp_path)
    p = pf.profile
    ms = p.cost.predict_ms(
        p.max_batch_tokens, p.max_batch_tokens // p.max_batch_size, p.max_batch_size
    )
    assert cap.rps == pytest.approx(p.max_batch_size / ms * 1e3)
    assert "cost model" in cap.source


def test_generation_counts_its_decode_not_only_the_prefill() -> None:
    from fleetserve.families.generate.family import DEFAULT_MAX_TOKENS as ADAPTERS

    assert DEFAULT_MAX_TOKENS == ADAPTERS
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{SMOL.replace('/', '--')}.yaml")
    p, figures = pf.profile, pf.provenance["figures"]
    assert figures["knee_rps"] is None  # not measured for generation
    prefill_only = p.max_batch_size / p.cost.predict_ms(p.max_batch_tokens, 2048, 4) * 1e3
    cap = model_capacity(SMOL, "cpu-amx")  # the spec's max_tokens: 512
    assert cap.rps == pytest.approx(figures["tokens_per_s"] / 512)
    assert cap.rps < prefill_only / 30 and "512 tokens per request" in cap.source
    short = model_capacity(SMOL, "cpu-amx", output_tokens=32)
    assert short.rps == pytest.approx(figures["tokens_per_s"] / 32)
    assert lag_thresholds([short])[SMOL] == {
        "batch": math.ceil(figures["tokens_per_s"] / 32 * 10),
        "interactive": math.ceil(figures["tokens_per_s"] / 32),
    }


def test_generation_without_measured_tokens_is_refused(tmp_path: Path) -> None:
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{SMOL.replace('/', '--')}.yaml")
    prov = {**pf.provenance, "figures": {**pf.provenance["figures"], "tokens_per_s": None}}
    write_profile_file(tmp_path, SMOL, pf.profile, prov)
    with pytest.raises(ValueError, match=r"generates.*not the decode steps.*--rps"):
        model_capacity(SMOL, "cpu-amx", tmp_path)


def test_no_knee_and_no_spec_is_refused(tmp_path: Path) -> None:
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{MINILM.replace('/', '--')}.yaml")
    prov = {**pf.provenance, "figures": {**pf.provenance["figures"], "knee_rps": None}}
    write_profile_file(tmp_path, "org/mine", pf.profile, prov)
    with pytest.raises(ValueError, match=r"org/mine: .*not in the catalog.*--catalog"):
        model_capacity("org/mine", "cpu-amx", tmp_path)


def test_your_profile_wins_over_the_bundled_one(tmp_path: Path) -> None:
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{MINILM.replace('/', '--')}.yaml")
    prov = {**pf.provenance, "figures": {**pf.provenance["figures"], "knee_rps": 7.5}}
    write_profile_file(tmp_path, MINILM, pf.profile, prov)
    assert model_capacity(MINILM, "cpu-amx", tmp_path).rps == 7.5
    # on cpu-avx512, a profile tuned for cpu-avx2 (in its fallback chain) stands in
    other = dataclasses.replace(pf.profile, hardware="cpu-avx2", precision="fp32")
    write_profile_file(tmp_path, MINILM, other, prov)
    cap = model_capacity(MINILM, "cpu-avx512", tmp_path)
    assert (cap.hardware_class, cap.rps) == ("cpu-avx2", 7.5)


def test_nothing_tuned_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match=r"no tuned profile for BAAI/bge-\S+ on cpu-avx2"):
        model_capacity("BAAI/bge-small-en-v1.5", "cpu-avx2")


def test_thresholds_are_at_least_one() -> None:
    assert lag_threshold(0.01, 1.0) == 1
    assert lag_threshold(22.35, 10.0) == 224
    assert consumer_name("a/b.c", Priority.INTERACTIVE) == "wi-a_2Fb_2Ec"


def test_cli_prints_a_pool(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--pool", "gen", "--hardware-class", "cuda-sm89", "--model", "org/*",
            "--model", "BAAI/bge-small-en-v1.5", "--rps", "BAAI/bge-small-en-v1.5=40"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "given with --rps" in out
    (entry,) = yaml.safe_load(out)["workerPools"]
    assert entry["device"] == "cuda" and entry["scaling"]["minReplicas"] == 0  # a cold pool
    assert entry["scaling"]["lagThresholds"] == {
        "BAAI/bge-small-en-v1.5": {"batch": 400, "interactive": 40}
    }


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--pin", MINILM, "--min-replicas", "0"], "cannot scale to zero"),
        (["--model", "org/*"], "at least one model id"),
        (["--pin", MINILM, "--rps", "nope"], "MODEL=REQUESTS_PER_SECOND"),
        (["--pin", MINILM, "--rps", f"{MINILM}=-1"], "MODEL=REQUESTS_PER_SECOND"),
        (["--pin", MINILM, "--rps", f"{MINILM}=nan"], "a finite number > 0"),
        (["--pin", MINILM, "--rps", f"{MINILM}=inf"], "a finite number > 0"),
        (["--pin", MINILM, "--rps", f"{MINILM}=1e400"], "a finite number > 0"),
        (["--pin", SMOL, "--output-tokens", f"{SMOL}=0"], "MODEL=TOKENS"),
        (["--pin", SMOL, "--output-tokens", f"{SMOL}=1.5"], "MODEL=TOKENS"),
        (["--pin", MINILM, "--batch-wait", "nan"], "--batch-wait nan"),
        (["--pin", MINILM, "--interactive-wait", "inf"], "--interactive-wait inf"),
        (["--pin", MINILM, "--max-replicas", "0"], "--max-replicas 0"),
    ],
)
def test_cli_errors(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pool", "p", "--hardware-class", "cpu-amx", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert err.startswith("error: ") and err.count("\n") == 1  # one line, no traceback


def test_cli_generation_pool(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--pool", "gen", "--hardware-class", "cpu-amx", "--pin", SMOL,
            "--output-tokens", f"{SMOL}=64", "--catalog", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "64 tokens per request (--output-tokens)" in out
    (entry,) = yaml.safe_load(out)["workerPools"]
    pf = read_profile_file(bundled_dir() / "cpu-amx" / f"{SMOL.replace('/', '--')}.yaml")
    rps = pf.provenance["figures"]["tokens_per_s"] / 64
    want = {"batch": math.ceil(rps * 10), "interactive": math.ceil(rps)}
    assert entry["scaling"]["lagThresholds"][SMOL] == want
