"""Files of training pairs: parsed, checked, deduplicated, split by query.

A file is JSONL, one ``{"query", "positive", "negative"?}`` object per line
(``negative``: a string or a list of strings). :func:`parse_pairs` refuses the whole
file at the first bad row, with an :class:`~fleetserve.wire.InvalidInput` whose
message and ``field`` name the line; nothing of a refused file is kept. Repeated
rows (the same query and positive) are merged; texts longer than ``max_chars`` are
kept but flagged, since training cuts them to the model's sequence length.

:func:`split_by_query` holds out a fraction of the *queries*, so that no question is
both trained on and measured with.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..wire import InvalidInput
from ..wire.finetune import Pair

FIELDS = ("query", "positive", "negative")


@dataclass(frozen=True, slots=True)
class Parsed:
    pairs: tuple[Pair, ...]
    duplicates: int  # rows merged into an earlier one
    warnings: tuple[str, ...]  # over-long texts, by line

    @property
    def queries(self) -> int:
        return len({p.query for p in self.pairs})


def parse_pairs(raw: bytes, *, min_pairs: int = 1, max_chars: int = 2000) -> Parsed:
    """The pairs of a JSONL file; ``InvalidInput`` naming the line of the first bad row,
    or the file when it holds fewer than ``min_pairs`` pairs after deduplication."""
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is not part of line 1
    except UnicodeDecodeError as exc:
        raise _bad(raw[: exc.start].count(b"\n") + 1, "is not UTF-8 text") from None
    seen: dict[tuple[str, str], int] = {}  # (query, positive) -> index in rows
    rows: list[tuple[str, str, list[str]]] = []
    warnings: list[str] = []
    duplicates = 0
    # lines end at \n only: U+2028 and friends are legal inside JSON strings
    for n, row in enumerate((r.removesuffix("\r") for r in text.split("\n")), start=1):
        if not row.strip():
            continue
        query, positive, negatives = _row(row, n)
        for name, value in (("query", query), ("positive", positive)):
            if len(value) > max_chars:
                warnings.append(_long(n, name, len(value), max_chars))
        for value in negatives:
            if len(value) > max_chars:
                warnings.append(_long(n, "negative", len(value), max_chars))
        key = (query, positive)
        if key in seen:
            duplicates += 1
            kept = rows[seen[key]][2]
            kept.extend(v for v in negatives if v not in kept)
            continue
        seen[key] = len(rows)
        rows.append((query, positive, list(dict.fromkeys(negatives))))
    if not rows:
        raise InvalidInput("the file holds no pairs: it is empty (line 1)", field="line 1")
    if len(rows) < min_pairs:
        raise InvalidInput(
            f"the file holds {len(rows)} distinct pairs (after {duplicates} repeats were "
            f"merged); a fine-tuning job needs at least {min_pairs} (train_min_pairs)",
            field="file",
        )
    pairs = tuple(Pair(q, p, tuple(x for x in neg if x != p)) for q, p, neg in rows)
    return Parsed(pairs, duplicates, tuple(warnings))


def _row(line: str, n: int) -> tuple[str, str, list[str]]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _bad(
            n, f"is not JSON ({exc.msg} at column {exc.colno}); the file must be JSONL"
        ) from None
    if not isinstance(row, dict):
        raise _bad(n, f"must be a JSON object with {FIELDS[0]} and {FIELDS[1]}")
    query = _text(row, "query", n)
    positive = _text(row, "positive", n)
    neg = row.get("negative")
    if neg is None:
        return query, positive, []
    values = neg if isinstance(neg, list) else [neg]
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise _bad(n, "negative must be a non-empty string or a list of non-empty strings")
    return query, positive, [v.strip() for v in values]


def _text(row: dict[str, object], name: str, n: int) -> str:
    value = row.get(name)
    if value is None:
        raise _bad(n, f"has no {name!r}: each row needs query and positive")
    if not isinstance(value, str) or not value.strip():
        raise _bad(n, f"{name} must be a non-empty string, not {json.dumps(value)[:40]}")
    return value.strip()


def _bad(n: int, what: str) -> InvalidInput:
    return InvalidInput(f"line {n} {what}", field=f"line {n}")


def _long(n: int, name: str, length: int, limit: int) -> str:
    return (
        f"line {n}: {name} is {length:,} characters, over {limit:,}; "
        "training cuts it to the model's sequence length"
    )


def split_by_query(
    pairs: Sequence[Pair], fraction: float, *, seed: int = 0, at_least: int = 1
) -> tuple[tuple[Pair, ...], tuple[Pair, ...]]:
    """(train, held out): ``fraction`` of the distinct queries (at least ``at_least``,
    never all) and every pair of each, chosen at random with ``seed``."""
    queries = sorted({p.query for p in pairs})
    if len(queries) < 2:
        raise InvalidInput(
            "the pairs have one distinct query: holding some out needs two or more, "
            "or give a validation_file",
            field="validation_fraction",
        )
    random.Random(seed).shuffle(queries)
    held = min(len(queries) - 1, max(at_least, round(fraction * len(queries))))
    out = set(queries[:held])
    train = tuple(p for p in pairs if p.query not in out)
    return train, tuple(p for p in pairs if p.query in out)


def to_jsonl(pairs: Sequence[Pair]) -> bytes:
    """The pairs as the JSONL a file keeps (checked, deduplicated, trimmed)."""
    return b"".join(json.dumps(p.to_dict(), ensure_ascii=False).encode() + b"\n" for p in pairs)
