"""Files of training pairs: parsed, checked, deduplicated, split by query.

A file is JSONL, one ``{"query", "positive", "negative"?}`` object per line
(``negative``: a string or a list of strings). :func:`parse_pairs` refuses the whole
file at the first bad row, with an :class:`~fleetserve.wire.InvalidInput` whose
message and ``field`` name the line; nothing of a refused file is kept. Repeated
rows (the same query and positive) are merged. A text longer than ``max_chars``
(``train_max_chars``) is refused the same way, or, with ``truncate``, cut to
``max_chars`` and flagged in the warnings. Lines are read one at a time from the
bytes (never the whole file decoded or split at once), and a line over
``max_line_bytes`` (``train_max_line_bytes``) is refused before it is decoded or
parsed, truncate or not.

:func:`split_by_query` holds out a fraction of the *queries*, so that no question is
both trained on and measured with.
"""

from __future__ import annotations

import codecs
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..wire import InvalidInput
from ..wire.finetune import Pair

FIELDS = ("query", "positive", "negative")
MAX_LINE_BYTES = 1 << 20  # the default of train_max_line_bytes


@dataclass(frozen=True, slots=True)
class Parsed:
    pairs: tuple[Pair, ...]
    duplicates: int  # rows merged into an earlier one
    warnings: tuple[str, ...]  # texts cut to max_chars (truncate), by line

    @property
    def queries(self) -> int:
        return len({p.query for p in self.pairs})


def parse_pairs(
    raw: bytes,
    *,
    min_pairs: int = 1,
    max_chars: int = 2000,
    truncate: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Parsed:
    """The pairs of a JSONL file; ``InvalidInput`` naming the line of the first bad row
    (one over ``max_line_bytes``, or with a text over ``max_chars`` unless
    ``truncate``), or the file when it holds fewer than ``min_pairs`` pairs after
    deduplication."""
    seen: dict[tuple[str, str], int] = {}  # (query, positive) -> index in rows
    rows: list[tuple[str, str, list[str]]] = []
    warnings: list[str] = []
    duplicates = 0
    for n, row in _lines(raw, max_line_bytes):
        if not row.strip():
            continue
        query, positive, negatives = _row(row, n)
        fit = _Fit(n, max_chars, truncate, warnings)
        query, positive = fit("query", query), fit("positive", positive)
        negatives = [fit("negative", v) for v in negatives]
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


def _lines(raw: bytes, max_line: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of ``raw``, decoded one at a time; a line over
    ``max_line`` bytes is refused by its length, before it is copied or decoded."""
    start = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0  # not line 1's
    n = 0
    while start < len(raw):
        n += 1
        # lines end at \n only: U+2028 and friends are legal inside JSON strings
        end = raw.find(b"\n", start)
        end = len(raw) if end < 0 else end
        if end - start > max_line:
            raise _bad(
                n, f"is {end - start:,} bytes, over the limit of {max_line:,} "
                "(train_max_line_bytes); no row needs that much",
            )  # fmt: skip
        try:
            text = raw[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(n, "is not UTF-8 text") from None
        yield n, text.removesuffix("\r")
        start = end + 1


@dataclass(frozen=True, slots=True)
class _Fit:
    """One line's texts checked against ``max_chars``: over it, refused (a 400 naming
    the line), or with ``truncate`` cut to it and said in ``warnings``."""

    n: int
    max_chars: int
    truncate: bool
    warnings: list[str]

    def __call__(self, name: str, value: str) -> str:
        if len(value) <= self.max_chars:
            return value
        if not self.truncate:
            raise _bad(
                self.n, f"{name} is {len(value):,} characters, over the limit of "
                f"{self.max_chars:,} (train_max_chars): shorten it, or upload the file with "
                "truncate=true to cut long texts to the limit",
            )  # fmt: skip
        self.warnings.append(
            f"line {self.n}: {name} was {len(value):,} characters; cut to {self.max_chars:,} "
            "(truncate)"
        )
        return value[: self.max_chars].strip()


def _row(line: str, n: int) -> tuple[str, str, list[str]]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _bad(
            n, f"is not JSON ({exc.msg} at column {exc.colno}); the file must be JSONL"
        ) from None
    except RecursionError:  # "[[[[..." within the line limit: a 400, not a crash
        raise _bad(n, "is nested too deeply to be a row") from None
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
