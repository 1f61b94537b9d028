"""Tests of LoRA training; shared here: synthetic pairs over the tiny vocabulary and a
training spec on a tiny BERT."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetserve.lora.train import TrainSpec
from fleetserve.wire.finetune import Hyperparameters, Pair
from tests.tinymodels import WORDS

TOPIC = WORDS[23:]  # hello ... water: words the tiny tokenizer knows whole


def synthetic_pairs(n: int, seed: int = 0) -> list[Pair]:
    """``n`` pairs with distinct queries of two words, each answered by a passage that
    repeats them among others; every fifth pair brings a negative of its own."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    seen: set[str] = set()
    while len(pairs) < n:
        a, b, c, d, e = rng.sample(TOPIC, 5)
        query = f"{a} {b}"
        if query in seen:
            continue
        seen.add(query)
        negatives = (f"{c} {d} {e} the",) if len(pairs) % 5 == 0 else ()
        pairs.append(Pair(query, f"the {a} and {b} with {c} {d}", negatives))
    return pairs


def tiny_spec(base: Path, **changes: Any) -> TrainSpec:
    """40 training and 10 validation pairs, 2 epochs of 5 steps (batch 8), rank 4."""
    pairs = synthetic_pairs(50)
    hp = Hyperparameters(rank=4, alpha=8.0, epochs=2, learning_rate=1e-3, batch_size=8,
                         hard_negatives=1)  # fmt: skip
    fields: dict[str, Any] = {
        "base_path": str(base),
        "pooling": "mean",
        "normalize": True,
        "max_seq_len": 16,
        "train": tuple(pairs[:40]),
        "validation": tuple(pairs[40:]),
        "hyperparameters": hp,
    }
    fields.update(changes)
    return TrainSpec(**fields)


class Events:
    """A ``report``/``on_event`` that keeps what it is given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.seen.append((kind, data))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.seen if k == kind]


@contextlib.contextmanager
def keeping_threads() -> Iterator[None]:
    """A run sets torch's threads process-wide: the block's caller gets its own back."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
