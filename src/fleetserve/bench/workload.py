"""Benchmark workloads: sentences of an exact token length for a given tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer

_WORDS = " ".join(
    [
        "the quick brown fox jumps over a lazy dog while several people watch from far",
        "away small models serve many tasks on hardware you own and each task gets its",
        "right model search ranking extraction vectors queries documents latency queue",
    ]
).split()


def sentences(tokenizer_dir: Path, n: int, tokens: int = 64, seed: int = 0) -> list[str]:
    """``n`` distinct sentences that each tokenize to exactly ``tokens`` ids (specials included)."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        words: list[str] = []
        while True:
            words.append(rng.choice(_WORDS))
            length = len(tok.encode(" ".join(words)).ids)
            if length == tokens:
                out.append(" ".join(words))
                break
            if length > tokens:
                break
    return out
