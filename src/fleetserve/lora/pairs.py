"""Files of training pairs: parsed, checked, deduplicated, split by query.

A file is JSONL, one ``{"query", "positive", "negative"?}`` object per line
(``negative``: a string or a list of strings). :func:`check_file` (a file on disk,
as the server gets one) and :func:`parse_pairs` (bytes) refuse the whole file at the
first bad row, with an :class:`~fleetserve.wire.InvalidInput` whose message and
``field`` name the line; nothing of a refused file is kept. Repeated rows (the same
query and positive) are merged. A text longer than ``max_chars``
(``train_max_chars``) is refused the same way, or, with ``truncate``, cut to
``max_chars`` and flagged in the warnings. Lines are read one at a time (never the
whole file decoded or split at once), and a line over ``max_line_bytes``
(``train_max_line_bytes``) is refused before it is decoded or parsed, truncate or
not. The checking itself streams (:mod:`.pairs_check`): a file's rows are written
out as they are read, and what is held is a few bytes a row.

:func:`split_by_query` holds out a fraction of the *queries*, so that no question is
both trained on and measured with.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..wire import InvalidInput
from ..wire.finetune import Pair
from .pairs_check import MAX_LINE_BYTES, Checked, check_pairs, row_bound

SPOOL_PREFIX, SPOOL_SUFFIX = ".upload-", ".tmp"  # as the gateway's spool files: swept alike


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
    checked, kept = check_bytes(
        raw, min_pairs=min_pairs, max_chars=max_chars, truncate=truncate,
        max_line_bytes=max_line_bytes,
    )  # fmt: skip
    return Parsed(read_pairs(kept), checked.duplicates, checked.warnings)


def check_bytes(raw: bytes, **limits: Any) -> tuple[Checked, bytes]:
    """:func:`check_file` for a file in memory: (what was found, the JSONL kept)."""
    dst, spare = io.BytesIO(), io.BytesIO()
    rows = row_bound(len(raw), raw.count(b"\n"))
    checked = check_pairs(io.BytesIO(raw), dst, spare, rows=rows, **limits)
    return checked, (spare if checked.merged else dst).getvalue()


def check_file(src: Path, **limits: Any) -> tuple[Checked, Path]:
    """Check the JSONL file at ``src`` (``limits``: as :func:`parse_pairs` takes) and
    write its pairs, as a file keeps them, to a new file beside it: (what was found,
    that file's path; the caller moves or deletes it). Nothing is left of a refusal."""
    size, newlines = src.stat().st_size, _newlines(src)
    made: list[Path] = []
    try:
        with (
            src.open("rb") as f,
            _spool(src.parent, made) as dst,
            _spool(src.parent, made) as spare,
        ):
            checked = check_pairs(f, dst, spare, rows=row_bound(size, newlines), **limits)
        kept = made[1] if checked.merged else made[0]
        made.remove(kept)
        return checked, kept
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def _spool(root: Path, made: list[Path]) -> Iterator[BinaryIO]:
    fd, name = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=SPOOL_SUFFIX, dir=root)
    made.append(Path(name))
    with os.fdopen(fd, "w+b") as f:
        yield f


def _newlines(path: Path) -> int:
    count = 0
    with path.open("rb") as f:
        while block := f.read(1 << 18):
            count += block.count(b"\n")
    return count


def one_query() -> InvalidInput:
    """What :func:`split_by_query` says of pairs that ask one query."""
    return InvalidInput(
        "the pairs have one distinct query: holding some out needs two or more, "
        "or give a validation_file",
        field="validation_fraction",
    )


def split_by_query(
    pairs: Sequence[Pair], fraction: float, *, seed: int = 0, at_least: int = 1
) -> tuple[tuple[Pair, ...], tuple[Pair, ...]]:
    """(train, held out): ``fraction`` of the distinct queries (at least ``at_least``,
    never all) and every pair of each, chosen at random with ``seed``."""
    queries = sorted({p.query for p in pairs})
    if len(queries) < 2:
        raise one_query()
    random.Random(seed).shuffle(queries)
    held = min(len(queries) - 1, max(at_least, round(fraction * len(queries))))
    out = set(queries[:held])
    train = tuple(p for p in pairs if p.query not in out)
    return train, tuple(p for p in pairs if p.query in out)


def to_jsonl(pairs: Sequence[Pair]) -> bytes:
    """The pairs as the JSONL a file keeps (checked, deduplicated, trimmed)."""
    return b"".join(json.dumps(p.to_dict(), ensure_ascii=False).encode() + b"\n" for p in pairs)


def read_pairs(raw: bytes) -> tuple[Pair, ...]:
    """The pairs of a file as it is kept (:func:`to_jsonl`, :func:`check_file`)."""
    rows = (json.loads(line) for line in raw.split(b"\n") if line.strip())
    return tuple(Pair(r["query"], r["positive"], tuple(r.get("negative", ()))) for r in rows)
