"""The continuous-batching engine on a tiny random Llama: exactness, joins, leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve.families.generate.engine import Engine, Seq
from fleetserve.families.generate.sampling import TextStream
from fleetserve.runtimes import SamplingParams

from ..tiny_generate import EOS_ID, build_llama

PROMPTS = ["hello world", "a", "the quick brown fox jumps over", "xyz 123 {}", "zz"]
LENGTHS = [20, 7, 15, 30, 12]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_llama(Path(tmp_path_factory.mktemp("tiny-llama")))
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _engine(lm: tuple[Any, Any]) -> Engine:
    return Engine(lm[0], eos_ids=[EOS_ID], vocab_size=259, pad_id=EOS_ID)


def _seq(lm: tuple[Any, Any], prompt: str, n: int, **params: Any) -> Seq:
    tok = lm[1]
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    stream = TextStream(lambda x: tok.decode(x, skip_special_tokens=True), params.pop("stop", ()))
    params.setdefault("temperature", 0.0)
    return Seq(ids, SamplingParams(max_tokens=n, **params), stream)


def _run(engine: Engine, seqs: list[Seq]) -> None:
    for s in seqs:
        engine.add(s)
    while not engine.idle:
        engine.step()


def _alone(lm: tuple[Any, Any]) -> list[list[int]]:
    out = []
    for prompt, n in zip(PROMPTS, LENGTHS, strict=True):
        s = _seq(lm, prompt, n)
        _run(_engine(lm), [s])
        out.append(s.out)
    return out


@pytest.mark.slow
def test_one_sequence_matches_transformers_generate(lm: tuple[Any, Any]) -> None:
    import torch

    model, tok = lm
    for prompt, n, got in zip(PROMPTS, LENGTHS, _alone(lm), strict=True):
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            ref = model.generate(
                ids, max_new_tokens=n, do_sample=False, eos_token_id=EOS_ID, pad_token_id=EOS_ID
            )
        assert got == ref[0, ids.shape[1] :].tolist()


def test_batched_greedy_equals_one_at_a_time_with_staggered_joins(lm: tuple[Any, Any]) -> None:
    alone = _alone(lm)
    engine = _engine(lm)
    seqs = [_seq(lm, p, n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    engine.add(seqs[0])
    engine.step()
    engine.step()
    engine.add(seqs[1])
    engine.add(seqs[2])  # two newcomers prefilled together, left padded
    engine.step()
    engine.add(seqs[3])
    for _ in range(3):
        engine.step()
    engine.add(seqs[4])
    while not engine.idle:
        engine.step()
    assert [s.out for s in seqs] == alone
    assert all(s.finish_reason in ("length", "stop") for s in seqs)


def test_a_newcomer_decodes_with_the_running_and_the_finished_leave(lm: tuple[Any, Any]) -> None:
    engine = _engine(lm)
    long, short = _seq(lm, "hello world", 40), _seq(lm, "the fox", 3)
    engine.add(long)
    for _ in range(5):
        engine.step()
    before = len(long.out)
    engine.add(short)
    changed = engine.step()  # prefill the newcomer, then one decode for both
    assert {id(s) for s in changed} >= {id(short)}
    assert len(short.out) == 2 and len(long.out) == before + 1
    assert len(engine.running) == 2
    engine.step()
    assert short.finish_reason == "length" and long.finish_reason is None
    assert engine.running == [long]  # the finished one left at once
    assert engine._cache.layers[0].keys.shape[0] == 1
    assert engine._mask is not None and engine._mask.shape[1] == long.pos
    while not engine.idle:
        engine.step()
    assert long.out == _alone_one(lm, "hello world", 40)


def _alone_one(lm: tuple[Any, Any], prompt: str, n: int) -> list[int]:
    s = _seq(lm, prompt, n)
    _run(_engine(lm), [s])
    return s.out


def test_a_cancelled_sequence_stops_at_the_next_step(lm: tuple[Any, Any]) -> None:
    engine = _engine(lm)
    a, b = _seq(lm, "hello", 30), _seq(lm, "world", 30)
    engine.add(a)
    engine.add(b)
    engine.step()
    a.cancelled = True
    engine.step()
    assert engine.running == [b]
    n = len(a.out)
    while not engine.idle:
        engine.step()
    assert len(a.out) == n and len(b.out) == 30


def test_tiny_top_p_is_greedy_and_a_seed_repeats(lm: tuple[Any, Any]) -> None:
    greedy = _alone_one(lm, "hello world", 12)
    nucleus = _seq(lm, "hello world", 12, temperature=1.0, top_p=1e-6, seed=1)
    _run(_engine(lm), [nucleus])
    assert nucleus.out == greedy
    runs = []
    for seed, other in ((5, "other"), (5, "a different batch mate"), (6, "other")):
        s = _seq(lm, "hello world", 12, temperature=1.0, seed=seed)
        _run(_engine(lm), [s, _seq(lm, other, 5, temperature=1.0)])
        runs.append(s.out)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_text_stream_holds_back_a_possible_stop_string_and_cuts_at_it() -> None:
    parts: list[str] = []
    s = TextStream(lambda ids: "".join(parts[: len(ids)]), ["STOP"])
    out = []
    for i, piece in enumerate(["Hel", "lo S", "T", "O", "P more"]):
        parts.append(piece)
        delta, stopped = s.update(list(range(i + 1)))
        out.append(delta)
        if stopped:
            break
    assert out == ["Hel", "lo ", "", "", ""]
    assert stopped and s.text == "Hello " and s.flush() == ""


def test_text_stream_releases_a_false_alarm_and_waits_for_whole_characters() -> None:
    texts = ["ab S", "ab Sx", "ab Sx\ufffd", "ab Sxé"]
    s = TextStream(lambda ids: texts[len(ids) - 1], ["STOP"])
    got = [s.update(list(range(i + 1)))[0] for i in range(len(texts))]
    assert got == ["ab ", "Sx", "", "é"]
