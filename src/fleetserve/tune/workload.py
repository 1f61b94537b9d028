"""What the tuner sends: requests of the family's main task, built from real text.

Texts come from ``bench``'s workloads: ``mix`` (a realistic length mix from a real
corpus) or ``sentences`` (64 tokens each). Each request carries ``batch`` texts;
tokens are counted with the model's own tokenizer, truncated as served.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..catalog import ModelSpec
from ..wire import Task
from .harness import Request
from .quality import ENTITY_LABELS, LABELS, images

WORKLOADS = ("mix", "sentences")


def texts(kind: str, path: Path, n: int, seed: int = 0) -> list[str]:
    from ..bench import workload

    if kind == "sentences":
        return workload.sentences(path, n, 64, seed=seed)
    if kind == "mix":
        return workload.mix(path, n, seed=seed)[0]
    raise ValueError(f"unknown workload {kind!r}; choose from {', '.join(WORKLOADS)}")


def requests(
    spec: ModelSpec, path: Path, kind: str = "mix", batch: int = 32, n: int = 16, seed: int = 0
) -> list[Request]:
    """``n`` requests of ``batch`` items for ``spec``'s family."""
    fam = spec.family
    if fam == "generate":
        prompts = [
            "Write a haiku about the sea.",
            "List three uses of copper.",
            "Explain what a queue is.",
            "Name a fruit and its colour.",
        ]
        return [
            Request(
                Task.GENERATE,
                json.dumps({"prompt": p, "max_tokens": 32, "temperature": 0.0}).encode(),
                -1,  # read from the reply
                1,
            )
            for p in prompts
        ]
    if fam == "image":
        pictures = _dump({"inputs": [{"image": im} for im in images(batch)]})
        return [Request(Task.ENCODE, pictures, batch * 49, batch)] * n
    pool = texts(kind, path, max(batch * n, 64), seed)
    count = token_counter(path, spec.max_seq_len)
    out = []
    for k in range(n):
        chunk = [pool[(k * batch + i) % len(pool)] for i in range(batch)]
        tokens = sum(count(t) for t in chunk)
        body: dict[str, object]
        if fam in ("sparse", "cross_encoder"):
            body = {"query": chunk[0], "items": chunk[1:]}
            out.append(Request(Task.SCORE, _dump(body), tokens, batch - 1))
        elif fam in ("ner", "zero_shot", "span_ner"):
            body = {"inputs": chunk}
            if fam != "ner":
                body["labels"] = LABELS if fam == "zero_shot" else ENTITY_LABELS
            out.append(Request(Task.EXTRACT, _dump(body), tokens, batch))
        else:
            out.append(Request(Task.ENCODE, _dump({"inputs": chunk}), tokens, batch))
    return out


def _dump(body: object) -> bytes:
    return json.dumps(body).encode()


def token_counter(path: Path, max_len: int) -> Callable[[str], int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)

    def count(text: str) -> int:
        return len(tok.encode(text).ids)

    return count


__all__ = ["WORKLOADS", "requests", "texts", "token_counter"]
