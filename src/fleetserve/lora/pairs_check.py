"""A file of training pairs checked as a stream: read a line at a time, each row
normalised and written out as it is read, in memory only what the answer needs.

:func:`check_pairs` reads JSONL from ``src`` and writes the kept rows (checked,
trimmed, deduplicated) to ``dst``. What it holds while it reads:

- one line (at most ``max_line_bytes``: a longer one is refused by its length, its
  bytes never copied whole or decoded);
- :class:`_Seen`, where each distinct (query, positive) was written: one 64-bit slot a
  row (a 28-bit tag of its hash and its offset in ``dst``), 12 bytes a line of the file
  at most. A tag that matches is checked against the start of the row read back from
  ``dst`` (no more bytes than the repeat has), so no two distinct pairs are merged;
- the negatives that repeats bring (unless a repeat is the very row again), up to
  :data:`MERGE_BUDGET`; those new to their row are merged in a second pass over
  ``dst`` into ``spare``;
- the first :data:`MAX_WARNINGS` warnings, the counts, and the first query (whether a
  second one exists is what holding queries out needs).
"""

from __future__ import annotations

import codecs
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..wire import InvalidInput

FIELDS = ("query", "positive", "negative")
MAX_LINE_BYTES = 1 << 20  # the default of train_max_line_bytes
MIN_ROW_BYTES = len('{"query":"a","positive":"b"}') + 1  # the shortest row and its newline
MAX_WARNINGS = 100  # warnings kept (a file's record holds these; the rest are counted)
MERGE_BUDGET = 16 << 20  # bytes of new negatives repeated rows may bring (held to merge)
_OFF_BITS, _TAG_BITS = 36, 28  # a slot: tag << 36 | (offset + 1); files up to 64 GiB
_OFF_MASK, _HASH_MASK = (1 << _OFF_BITS) - 1, (1 << 64) - 1
_STR_COST = 100  # what one held negative costs beyond its characters (str, dict entry)


@dataclass(frozen=True, slots=True)
class Checked:
    rows: int  # distinct pairs kept
    duplicates: int  # rows merged into an earlier one
    warnings: tuple[str, ...]  # the first MAX_WARNINGS: texts cut to max_chars, by line
    cut: int  # texts cut in all
    two_queries: bool  # at least two distinct queries (some can be held out)
    merged: bool  # the kept rows are in ``spare`` (repeats brought negatives), not ``dst``


def row_bound(size: int, newlines: int) -> int:
    """At most how many rows a file of ``size`` bytes and ``newlines`` newlines holds."""
    return min(newlines + 1, size // MIN_ROW_BYTES + 1)


def check_pairs(
    src: BinaryIO,
    dst: BinaryIO,
    spare: BinaryIO,
    *,
    rows: int,
    min_pairs: int = 1,
    max_chars: int = 2000,
    truncate: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Checked:
    """Check the JSONL in ``src`` (at most ``rows`` rows: :func:`row_bound`) and write
    its pairs to ``dst`` (and, when repeats bring negatives, merged into ``spare``; both
    empty, readable and writable); ``InvalidInput`` naming the line of the first bad
    row, or the file when it holds fewer than ``min_pairs`` pairs."""
    seen = _Seen(rows)
    extras: dict[int, dict[str, None]] = {}  # offset in dst -> negatives repeats brought
    warnings: list[str] = []
    budget, cut, kept, duplicates, at = MERGE_BUDGET, 0, 0, 0, 0
    first_query: str | None = None
    two_queries = False
    for n, line in _lines(src, max_line_bytes):
        if not line.strip():
            continue
        query, positive, negatives = _row(line, n)
        fit = _Fit(n, max_chars, truncate, warnings)
        query, positive = fit("query", query), fit("positive", positive)
        negatives = list(dict.fromkeys(fit("negative", v) for v in negatives))
        if len(warnings) > MAX_WARNINGS:
            cut += len(warnings) - MAX_WARNINGS
            del warnings[MAX_WARNINGS:]
        head, row = _encode(n, query, positive, [v for v in negatives if v != positive])
        h = hash((query, positive)) & _HASH_MASK
        off, got = None, b""
        for o in seen.candidates(h):  # as long as the row at most: a repeat reads no more
            got = _read(dst, o, len(row), at)
            if got.startswith(head) and got[len(head) : len(head) + 1] in (b"}", b","):
                off = o  # the same query and positive (what follows them: } or ,)
                break
        if off is None:
            dst.write(row)
            seen.add(h, at)
            at, kept = at + len(row), kept + 1
            if first_query is None:
                first_query = query
            two_queries = two_queries or query != first_query
            continue
        duplicates += 1
        if not negatives or got == row:
            continue  # nothing to merge: no negatives, or the very row again
        added = extras.setdefault(off, {})
        for v in negatives:  # what is new to the row itself: seen in the second pass
            if v != positive and v not in added:
                added[v] = None
                budget -= len(v) + _STR_COST
        if budget < 0:
            raise _bad(
                n, "repeats an earlier row's query and positive with other negatives, and "
                f"the file's repeats bring more than {MERGE_BUDGET >> 20} MiB of them: "
                "merge repeated rows into one row each",
            )  # fmt: skip
    if not kept:
        raise InvalidInput("the file holds no pairs: it is empty (line 1)", field="line 1")
    if kept < min_pairs:
        raise InvalidInput(
            f"the file holds {kept} distinct pairs (after {duplicates} repeats were "
            f"merged); a fine-tuning job needs at least {min_pairs} (train_min_pairs)",
            field="file",
        )
    if extras:
        _merge(dst, spare, extras)
    cut += len(warnings)
    return Checked(kept, duplicates, tuple(warnings), cut, two_queries, bool(extras))


class _Seen:
    """Open addressing over one array of 64-bit slots (two thirds full at most)."""

    def __init__(self, rows: int) -> None:
        self.cap = max(8, rows * 3 // 2 + 1)
        self.slots = array("Q", [0]) * self.cap
        self._free, self.used = 0, 0

    def candidates(self, h: int) -> Iterator[int]:
        """The offsets of the rows whose slot tag matches hash ``h``'s; once they are all
        given, :meth:`add` fills the free slot found after them."""
        slots, cap, tag = self.slots, self.cap, h >> (64 - _TAG_BITS)
        i = h % cap
        while v := slots[i]:
            if v >> _OFF_BITS == tag:
                yield (v & _OFF_MASK) - 1
            i = i + 1 if i + 1 < cap else 0
        self._free = i

    def add(self, h: int, offset: int) -> None:
        if offset >= _OFF_MASK:
            raise InvalidInput("the file is too large to check", field="file")
        self.used += 1
        if self.used >= self.cap:  # never: ``rows`` bounds them (or a probe would not end)
            raise RuntimeError(f"more than the {self.cap - 1} rows bounded")
        self.slots[self._free] = (h >> (64 - _TAG_BITS)) << _OFF_BITS | (offset + 1)


def _read(dst: BinaryIO, off: int, size: int, end: int) -> bytes:
    """``size`` bytes of ``dst`` from ``off`` (its end: ``end``, where writing goes on)."""
    dst.seek(off)
    got = dst.read(size)
    dst.seek(end)
    return got


def _merge(dst: BinaryIO, spare: BinaryIO, extras: dict[int, dict[str, None]]) -> None:
    """``dst``'s rows into ``spare``, each with the new negatives its repeats brought."""
    dst.seek(0)
    at = 0
    for line in iter(dst.readline, b""):
        more = extras.get(at)
        at += len(line)
        if more is not None:
            row = json.loads(line)
            had = row.get("negative", [])
            have = set(had)
            new = [v for v in more if v not in have]
            if new:
                row["negative"] = [*had, *new]
                line = json.dumps(row, ensure_ascii=False).encode() + b"\n"
        spare.write(line)


def _encode(n: int, query: str, positive: str, negatives: list[str]) -> tuple[bytes, bytes]:
    """(the row's bytes up to its query and positive, the row as a file keeps it)."""
    try:
        base = json.dumps({"query": query, "positive": positive}, ensure_ascii=False).encode()
        if not negatives:
            return base[:-1], base + b"\n"
        more = json.dumps(negatives, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # "\ud800": a lone surrogate, legal JSON but not text
        raise _bad(n, "holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
    return base[:-1], base[:-1] + b', "negative": ' + more + b"}\n"


def _lines(src: BinaryIO, max_line: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of ``src``, read one at a time; a line over
    ``max_line`` bytes is refused by its length, read in pieces and never decoded."""
    if src.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:  # not line 1's
        src.seek(0)
    n = 0
    # lines end at \n only: U+2028 and friends are legal inside JSON strings
    while raw := src.readline(max_line + 1):
        n += 1
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        elif len(raw) > max_line:
            size = len(raw)
            while (more := src.readline(1 << 20)) and not more.endswith(b"\n"):
                size += len(more)
            size += max(0, len(more) - 1)
            raise _bad(
                n, f"is {size:,} bytes, over the limit of {max_line:,} "
                "(train_max_line_bytes); no row needs that much",
            )  # fmt: skip
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(n, "is not UTF-8 text") from None
        yield n, text.removesuffix("\r")


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
