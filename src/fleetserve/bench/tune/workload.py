"""The workload: real texts of known token lengths, and the requests built from them.

Texts, for ``fleetserve bench knee``, the tuner and ``benchmarks/``: ``sentences`` of
an exact token length for a given tokenizer, and ``mix``, a realistic length mix drawn
from a real corpus. Requests, what the tuner sends: ``requests`` of the family's main
task built from those texts, ``batch`` texts each; tokens are counted with the model's
own tokenizer, truncated as served. (The simulator's requests carry token counts, not
text: ``bench/sim/synthetic.py``.)
"""

from __future__ import annotations

import importlib.resources
import json
import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...catalog import ModelSpec
from ...wire import Task
from .harness import Request
from .quality import ENTITY_LABELS, LABELS, images

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_WORDS = " ".join(
    [
        "the quick brown fox jumps over a lazy dog while several people watch from far",
        "away small models serve many tasks on hardware you own and each task gets its",
        "right model search ranking extraction vectors queries documents latency queue",
    ]
).split()


def _tokenizer(path: Path) -> Tokenizer:
    """The model's own tokenizer (``tokenizers`` comes with each runtime's extra)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def sentences(tokenizer_dir: Path, n: int, tokens: int = 64, seed: int = 0) -> list[str]:
    """``n`` distinct sentences that each tokenize to exactly ``tokens`` ids (specials included)."""
    tok = _tokenizer(tokenizer_dir)
    tok.no_truncation()
    tok.no_padding()
    rng = random.Random(seed)
    out: dict[str, None] = {}  # distinct, in order
    for _ in range(1000 * n):
        if len(out) == n:
            break
        words: list[str] = []
        while True:
            words.append(rng.choice(_WORDS))
            length = len(tok.encode(" ".join(words)).ids)
            if length == tokens:
                out[" ".join(words)] = None
                break
            if length > tokens:
                break
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} distinct sentences of {tokens} tokens found")
    return list(out)


# The mix: questions (short queries), whole answers, and passages cut from a category's
# answers run together (long documents), in these shares.
MIX_KINDS = ("question", "answer", "passage")
MIX_SHARES = (0.4, 0.3, 0.3)
CORPUS = "zaragoza_construction_faq"  # PyPI zaragoza-construction-faq, CC-BY-4.0


def corpus(lang: str = "en") -> list[dict[str, str]]:
    """The 503 question-answer pairs of zaragoza-construction-faq (``en`` or ``sv``)."""
    name = "data/faq-en.jsonl" if lang == "en" else "data/faq.jsonl"
    try:
        text = importlib.resources.files(CORPUS).joinpath(name).read_text("utf-8")
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            "the mix workload reads the zaragoza-construction-faq package: install it "
            "(pip install zaragoza-construction-faq), or use --workload sentences"
        ) from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def mix(
    tokenizer_dir: Path, n: int, *, lo: int = 8, hi: int = 256, seed: int = 0, lang: str = "en"
) -> tuple[list[str], list[int]]:
    """``n`` texts of a realistic length mix, ``lo`` to ``hi`` tokens (specials included)
    of this tokenizer, drawn from the corpus; returns them and their token counts."""
    tok = _tokenizer(tokenizer_dir)
    tok.no_truncation()
    tok.no_padding()
    specials = len(tok.encode("").ids)
    rows = corpus(lang)
    docs: dict[str, list[str]] = {}
    for r in rows:
        docs.setdefault(r["category"], []).append(r["a"])
    documents = [_Document(tok, " ".join(v)) for v in docs.values()]
    rng = random.Random(seed)
    texts: list[str] = []
    lengths: list[int] = []
    for _ in range(50 * n):
        if len(texts) == n:
            break
        kind = rng.choices(MIX_KINDS, MIX_SHARES)[0]
        if kind == "passage":
            # log-uniform in [4 lo, hi]: passages are the long end of the mix
            want = round(math.exp(rng.uniform(math.log(4 * lo), math.log(hi))))
            text = rng.choice(documents).cut(want - specials, rng)
        else:
            text = rng.choice(rows)["q" if kind == "question" else "a"]
        length = len(tok.encode(text).ids)
        if lo <= length <= hi:
            texts.append(text)
            lengths.append(length)
    if len(texts) < n:
        raise RuntimeError(f"only {len(texts)} of {n} corpus texts fit {lo} to {hi} tokens")
    return texts, lengths


SENTENCE_END = re.compile(r"[.?!] ")  # a sentence starts where one of these ends


class _Document:
    """A category's answers run together: tokenized at its first cut, and its sentence
    starts found in one pass (each model load measures its activation peak on a mix,
    so this is on the load's path)."""

    def __init__(self, tok: Tokenizer, text: str) -> None:
        self.tok, self.text = tok, text
        self._words: list[int | None] = []
        self._offsets: list[tuple[int, int]] = []
        self._starts: list[int] = []

    def _tokenize(self) -> None:
        enc = self.tok.encode(self.text, add_special_tokens=False)
        self._words, self._offsets = enc.word_ids, enc.offsets
        ends = {m.end() for m in SENTENCE_END.finditer(self.text)}
        self._starts = [i for i, (at, _) in enumerate(self._offsets) if i == 0 or at in ends]

    def cut(self, tokens: int, rng: random.Random) -> str:
        """A passage of at most ``tokens`` tokens, from a sentence's start to a word's
        end."""
        if not self._starts:
            self._tokenize()
        words, offsets = self._words, self._offsets
        room = [s for s in self._starts if s + tokens <= len(words)] or self._starts[:1]
        s = rng.choice(room)
        e = min(s + tokens, len(words))
        while s + 1 < e < len(words) and words[e] == words[e - 1]:
            e -= 1  # don't split the last word
        return self.text[offsets[s][0] : offsets[e - 1][1]]


def length_stats(lengths: list[int]) -> dict[str, float]:
    """min, median, p90 and max of token counts (nearest rank)."""
    s = sorted(lengths)
    if not s:
        return {}

    def at(q: float) -> float:
        return float(s[min(len(s) - 1, round(q * (len(s) - 1)))])

    mean = sum(s) / len(s)
    return {"min": s[0], "median": at(0.5), "p90": at(0.9), "max": s[-1], "mean": mean}


WORKLOADS = ("mix", "sentences")


def texts(kind: str, path: Path, n: int, seed: int = 0) -> list[str]:
    if kind == "sentences":
        return sentences(path, n, 64, seed=seed)
    if kind == "mix":
        return mix(path, n, seed=seed)[0]
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
    tok = _tokenizer(path)
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)

    def count(text: str) -> int:
        return len(tok.encode(text).ids)

    return count


__all__ = [
    "CORPUS",
    "MIX_KINDS",
    "MIX_SHARES",
    "WORKLOADS",
    "corpus",
    "length_stats",
    "mix",
    "requests",
    "sentences",
    "texts",
    "token_counter",
]
