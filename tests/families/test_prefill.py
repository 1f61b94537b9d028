"""Chunked prefill in the generation engine: a long prompt is prefilled a chunk a step,
gives the tokens one forward pass gives, lets running sequences decode meanwhile, and
stops between chunks when cancelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetserve.families.generate.chat import GenItem
from fleetserve.runtimes import SamplingParams

from ..tiny_generate import build_llama, load_adapter

LONG = 300  # prompt tokens: several chunks of 64


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = build_llama(Path(tmp_path_factory.mktemp("tiny-llama")), max_positions=512)
    return load_adapter(path, max_seq_len=512)


def _seq(adapter: Any, n: int, max_tokens: int = 12) -> Any:
    prompt = [3 + (i * 37) % 250 for i in range(n)]
    return adapter.sequence(GenItem(prompt, SamplingParams(max_tokens=max_tokens, temperature=0)))


def _generate(adapter: Any, chunk: int, n: int) -> tuple[list[int], int]:
    engine = adapter.engine()
    engine.prefill_chunk = chunk
    s = _seq(adapter, n)
    engine.add(s)
    while not engine.idle:
        engine.step()
    return s.out, engine.steps


def test_a_chunked_prefill_gives_the_tokens_of_one_forward_pass(adapter: Any) -> None:
    whole, whole_steps = _generate(adapter, 10_000, LONG)
    chunked, chunked_steps = _generate(adapter, 64, LONG)
    assert len(whole) == 12 and chunked == whole
    # ceil(300 / 64) = 5 prefill steps, the last of which also decodes
    assert chunked_steps == whole_steps + 4


def test_running_sequences_decode_while_a_long_prompt_prefills(adapter: Any) -> None:
    engine = adapter.engine()
    engine.prefill_chunk = 64
    short = _seq(adapter, 10, max_tokens=40)
    engine.add(short)
    engine.step()
    assert len(short.out) == 2  # the prefill's token and one decoded
    long = _seq(adapter, LONG)
    engine.add(long)
    for _ in range(3):
        engine.step()
        assert engine.prefilling == [long] and long.out == []
    assert len(short.out) == 5  # it went on decoding, a token a step


def test_a_cancelled_long_prompt_stops_between_chunks(adapter: Any) -> None:
    engine = adapter.engine()
    engine.prefill_chunk = 64
    s = _seq(adapter, LONG)
    engine.add(s)
    engine.step()
    assert engine.prefilling == [s]
    s.cancelled = True
    steps = engine.steps
    assert engine.step() == [] and engine.idle
    assert engine.steps == steps  # no forward pass ran for it
    assert s.out == []


def test_a_prefill_chunk_must_be_positive(adapter: Any) -> None:
    from fleetserve.families.generate.engine import Engine

    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(adapter.model, eos_ids=[2], vocab_size=259, prefill_chunk=0)


def test_the_chunk_comes_from_the_spec_options(tmp_path: Path) -> None:
    path = build_llama(tmp_path / "m", max_positions=128)
    adapter = load_adapter(path, max_seq_len=128, prefill_chunk=32)
    assert adapter.engine().prefill_chunk == 32
