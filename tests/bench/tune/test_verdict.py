"""When the background tuner swaps a model to what its run found, and when a model is
tuned (again) at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetserve import __version__
from fleetserve.bench.tune.stale import model_digest, why_tune
from fleetserve.bench.tune.verdict import verdict
from fleetserve.catalog import ModelSpec, Profile
from fleetserve.catalog.profiles import Choice

RULE = Choice(Profile("cpu-avx2", "fp32", "torch", 2048, 64), "rule", "rule: torch fp32")


def found(tps: float, runtime: str = "openvino", **prov: Any) -> Choice:
    p = Profile("cpu-avx2", "fp32", runtime, 4096, 64)
    figures = {"tokens_per_s": tps}
    return Choice(p, "tuned", "tuned", "/p.yaml", {"figures": figures, "run": "r", **prov})


def run(noise: float, *points: tuple[str, int, float]) -> dict[str, Any]:
    cands = [
        {"runtime": rt, "precision": "fp32", "max_batch_tokens": tokens, "max_batch_size": 64,
         "processes": 1, "tokens_per_s": tps}
        for rt, tokens, tps in points
    ]  # fmt: skip
    return {"noise": noise, "candidates": cands}


def test_a_winner_beyond_the_noise_of_the_running_profiles_own_point_swaps() -> None:
    r = run(0.05, ("torch", 2048, 1000.0), ("openvino", 4096, 1300.0))
    v = verdict(r, RULE, found(1300.0), "torch")
    assert v.swap and v.before == 1000.0 and v.after == 1300.0 and "+30.0%" in v.why


TUNED = Choice(Profile("cpu-avx2", "fp32", "torch", 2048, 64), "tuned", "tuned", "/t.yaml")


def test_a_winner_within_the_noise_is_not_swapped_in() -> None:
    r = run(0.08, ("torch", 2048, 1000.0), ("openvino", 4096, 1050.0))
    v = verdict(r, TUNED, found(1050.0), "torch")
    assert not v.swap and "within the noise (8.0%)" in v.why


def test_a_tie_with_a_rules_profile_goes_to_the_tuned_one() -> None:
    """A rule's profile has the family's default cost model, so no interactive cap:
    the 110M model's OpenVINO fp32 on cpu-avx2 served 355 tokens/s on it and 543 on
    the same engine with a tuned profile's. A quick search that found the running
    engine within the noise of its winner left the model on the rule for 10 minutes."""
    r = run(0.16, ("torch", 2048, 1000.0), ("openvino", 4096, 1059.0))
    v = verdict(r, RULE, found(1059.0), "torch")
    assert v.swap and "a tie goes to the tuned one" in v.why, v.why
    fallback = Choice(RULE.profile, "fallback", "fallback")
    assert verdict(r, fallback, found(1059.0), "torch").swap
    slower = run(0.16, ("torch", 2048, 1000.0), ("openvino", 4096, 950.0))
    assert not verdict(slower, RULE, found(950.0), "torch").swap  # never for a loss


def test_the_best_of_the_running_engine_stands_in_for_a_batch_the_run_did_not_try() -> None:
    r = run(0.05, ("torch", 1024, 900.0), ("torch", 8192, 1250.0), ("openvino", 4096, 1300.0))
    assert not verdict(r, TUNED, found(1300.0), "torch").swap  # 1300 vs 1250: +4%


def test_an_engine_the_run_never_measured_is_kept() -> None:
    running = Choice(Profile("cpu-avx2", "bf16", "openvino"), "fallback", "fallback")
    v = verdict(run(0.05, ("torch", 2048, 1000.0)), running, found(1000.0, "torch"), "torch")
    assert not v.swap and v.before is None and "did not measure" in v.why


def test_a_run_that_repeated_nothing_still_needs_a_gain_beyond_the_floor() -> None:
    r = run(0.0, ("torch", 2048, 1000.0), ("openvino", 4096, 1010.0))
    assert not verdict(r, TUNED, found(1010.0), "torch").swap  # +1% < the 2% floor


def test_the_same_profile_is_never_swapped_for_itself() -> None:
    same = found(1000.0, "torch")
    running = Choice(same.profile, "tuned", "tuned")
    assert not verdict(run(0.0, ("torch", 4096, 1000.0)), running, same, "torch").swap


def test_what_is_tuned_in_the_background(tmp_path: Path) -> None:
    spec = ModelSpec.from_dict({"id": "o/m", "sources": [str(tmp_path)], "family": "dense"})
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    digest = model_digest(spec, tmp_path)
    mine = {"fleetserve": __version__, "model_digest": digest}
    assert why_tune(RULE, digest) == "it runs on a rule"
    assert why_tune(found(1.0, **mine), digest) is None
    assert "fleetserve 0.0.1" in str(
        why_tune(found(1.0, **{**mine, "fleetserve": "0.0.1"}), digest)
    )
    quick = found(1.0, **mine, quick=True)
    assert why_tune(quick, digest) == "its profile came from a quick search"
    assert why_tune(quick, digest, refine=False) is None
    bundled = Choice(RULE.profile, "tuned", "bundled", "/b.yaml", {"fleetserve": "0.0.1"}, True)
    assert why_tune(bundled, digest) is None  # shipped tuned
    (tmp_path / "model.safetensors").write_bytes(b"x" * 11)  # other weights
    assert why_tune(found(1.0, **mine), model_digest(spec, tmp_path)) == (
        "its weights changed since it was tuned"
    )


def test_the_search_screens_the_nearest_classes_winner_and_its_neighbours_first() -> None:
    from fleetserve.bench.tune.candidates import nearest_first

    pairs = [("openvino", "bf16"), ("openvino", "fp16"), ("openvino", "fp32"),
             ("torch", "bf16"), ("torch", "fp16"), ("torch", "fp32")]  # fmt: skip
    got = nearest_first(pairs, ("openvino", "bf16"))
    assert got[:2] == [("torch", "fp32"), ("openvino", "bf16")]
    assert set(got[2:5]) == {("openvino", "fp16"), ("openvino", "fp32"), ("torch", "bf16")}
    assert got[5] == ("torch", "fp16")


def test_a_precision_the_cpu_would_emulate_is_screened_after_every_native_one() -> None:
    """The 110M model's full tune on cpu-avx2 spent half its budget on torch bf16 and
    fp16 (emulated there) before it reached ONNX Runtime int8."""
    from fleetserve.bench.tune.candidates import nearest_first
    from fleetserve.catalog.evidence import runs_natively

    pairs = [
        (rt, prec)
        for rt, precs in (
            ("onnx", "fp32 int8"),
            ("openvino", "bf16 fp16 fp32"),
            ("torch", "bf16 fp16 fp32"),
        )
        for prec in precs.split()
    ]
    got = nearest_first(pairs, ("torch", "fp32"), lambda p: not runs_natively(p, {"avx2", "fma"}))
    assert got[:4] == [("torch", "fp32"), ("onnx", "fp32"), ("openvino", "fp32"), ("onnx", "int8")]
    assert got[4:6] == [("torch", "bf16"), ("torch", "fp16")]  # its neighbours first
    assert set(got[6:]) == {("openvino", "bf16"), ("openvino", "fp16")}
