"""The demonstration's data: zaragoza-construction-faq (CC-BY-4.0), 503 question-answer
pairs on Swedish building and tax law, in English and Swedish.

Each answer is a passage and its question the query. A question asked twice (with two
answers) is one query with two relevant passages. Questions are split, seeded, into
training and 120 held out: no question is in both.
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

FILES = {"en": "data/faq-en.jsonl", "sv": "data/faq.jsonl"}
HELD_OUT = 120


def rows(lang: str) -> list[dict[str, str]]:
    data = resources.files("zaragoza_construction_faq").joinpath(FILES[lang])
    return [json.loads(line) for line in data.read_text("utf-8").splitlines() if line.strip()]


def split(lang: str, seed: int = 42, held_out: int = HELD_OUT) -> tuple[list[dict[str, str]], ...]:
    """(training pairs, held-out pairs) as ``{query, positive}`` rows, split by question."""
    pairs = [{"query": r["q"], "positive": r["a"]} for r in rows(lang)]
    questions = sorted({p["query"] for p in pairs})
    random.Random(seed).shuffle(questions)
    out = set(questions[:held_out])
    return [p for p in pairs if p["query"] not in out], [p for p in pairs if p["query"] in out]


def write(lang: str, folder: Path, seed: int = 42) -> tuple[Path, Path, int, int]:
    """The two JSONL files of ``lang`` in ``folder``; their paths and pair counts."""
    train, held = split(lang, seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / f"faq-{lang}-train.jsonl", folder / f"faq-{lang}-heldout.jsonl"
    for path, part in zip(paths, (train, held), strict=True):
        path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in part))
    return paths[0], paths[1], len(train), len(held)
