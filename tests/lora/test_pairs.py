"""Files of pairs: each rejection names its line; repeats merge; long texts are refused
or, with truncate, cut; the held-out split never shares a query with training."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from fleetserve.lora import pairs_check
from fleetserve.lora.pairs import check_file, parse_pairs, read_pairs, split_by_query, to_jsonl
from fleetserve.wire import InvalidInput
from fleetserve.wire.finetune import Pair


def jsonl(*rows: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_rows_are_read_with_their_negatives() -> None:
    raw = jsonl(
        {"query": "q1", "positive": "p1"},
        {"query": "q2", "positive": "p2", "negative": "n2"},
        {"query": "q3", "positive": "p3", "negative": ["n3", "n4"], "id": 7},
    )
    parsed = parse_pairs(raw)
    assert parsed.pairs == (
        Pair("q1", "p1"),
        Pair("q2", "p2", ("n2",)),
        Pair("q3", "p3", ("n3", "n4")),
    )
    assert parsed.duplicates == 0 and parsed.warnings == ()
    assert parse_pairs(to_jsonl(parsed.pairs)).pairs == parsed.pairs  # what a file keeps


@pytest.mark.parametrize(
    ("raw", "line", "words"),
    [
        (b'{"query": "q", "positive": "p"}\nnot json\n', 2, "is not JSON"),
        (b'{"query": "q", "positive": "p"}\n\n[1, 2]\n', 3, "JSON object"),
        (jsonl({"query": "q", "positive": "p"}, {"positive": "p"}), 2, "has no 'query'"),
        (jsonl({"query": "q"}), 1, "has no 'positive'"),
        (jsonl({"query": "  ", "positive": "p"}), 1, "query must be a non-empty string"),
        (jsonl({"query": "q", "positive": 3}), 1, "positive must be a non-empty string"),
        (jsonl({"query": "q", "positive": "p", "negative": [""]}), 1, "negative must be"),
        (jsonl({"query": "q", "positive": "p", "negative": []}), 1, "negative must be"),
        (b'{"query": "q", "positive": "p"}\n{"query": "\xff"}\n', 2, "not UTF-8"),
    ],
)
def test_each_rejection_names_its_line(raw: bytes, line: int, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_pairs(raw)
    assert err.value.field == f"line {line}"
    assert f"line {line}" in err.value.message and words in err.value.message


def test_an_empty_file_and_one_below_the_minimum_are_refused() -> None:
    for empty in (b"", b"\n\n"):
        with pytest.raises(InvalidInput, match="empty") as err:
            parse_pairs(empty)
        assert err.value.field == "line 1"
    rows = jsonl(*({"query": f"q{i}", "positive": "p"} for i in range(3)))
    with pytest.raises(InvalidInput, match=r"holds 3 distinct pairs.*at least 4") as err:
        parse_pairs(rows + jsonl({"query": "q0", "positive": "p"}), min_pairs=4)
    assert err.value.field == "file"
    assert len(parse_pairs(rows, min_pairs=3).pairs) == 3


def test_repeats_merge_and_keep_their_negatives() -> None:
    raw = jsonl(
        {"query": "q", "positive": "p", "negative": "a"},
        {"query": " q ", "positive": "p", "negative": ["a", "b"]},
        {"query": "q", "positive": "other"},
        {"query": "q2", "positive": "p2", "negative": "p2"},  # the positive as a negative
    )
    parsed = parse_pairs(raw)
    assert parsed.duplicates == 1
    assert parsed.pairs == (Pair("q", "p", ("a", "b")), Pair("q", "other"), Pair("q2", "p2"))
    assert parsed.queries == 2


def test_a_text_over_max_chars_is_refused_naming_its_line() -> None:
    """Today such texts are kept and only flagged in the warnings (a 50 MiB one too)."""
    ok = {"query": "q", "positive": "p"}
    for row, name in (
        ({"query": "q2", "positive": "x" * 30}, "positive"),
        ({"query": "q" * 31, "positive": "p"}, "query"),
        ({"query": "q2", "positive": "p", "negative": ["n", "n" * 30]}, "negative"),
    ):
        with pytest.raises(InvalidInput) as err:
            parse_pairs(jsonl(ok, row), max_chars=29)
        assert err.value.field == "line 2"
        msg = err.value.message
        assert msg.startswith(f"line 2 {name} is ") and "over the limit of 29" in msg, msg
        assert "train_max_chars" in msg and "truncate=true" in msg


def test_truncate_cuts_long_texts_and_says_so() -> None:
    """Today there is no truncate; long texts were kept whole."""
    raw = jsonl(
        {"query": "q", "positive": "x" * 30, "negative": "y" * 40},
        {"query": "q" * 31, "positive": "p"},
    )
    parsed = parse_pairs(raw, max_chars=29, truncate=True)
    assert parsed.pairs == (Pair("q", "x" * 29, ("y" * 29,)), Pair("q" * 29, "p"))
    assert parsed.warnings == (
        "line 1: positive was 30 characters; cut to 29 (truncate)",
        "line 1: negative was 40 characters; cut to 29 (truncate)",
        "line 2: query was 31 characters; cut to 29 (truncate)",
    )


def test_a_50_mib_line_is_refused_by_its_length_unread() -> None:
    """Today the file is decoded and split whole and the line parsed (about 200 MiB
    for a 50 MiB line), then kept; the training child then grew to 5.9 GB."""
    raw = jsonl({"query": "q", "positive": "p"}) + b'{"query": "q", "positive": "'
    raw += b"x" * (50 << 20) + b'"}\n'
    for truncate in (False, True):
        tracemalloc.start()
        try:
            with pytest.raises(InvalidInput) as err:
                parse_pairs(raw, truncate=truncate, max_line_bytes=1 << 20)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert err.value.field == "line 2"
        assert "over the limit of 1,048,576 (train_max_line_bytes)" in err.value.message
        assert peak < 4 << 20, peak  # nothing of the line was copied or decoded


def test_a_line_nested_too_deeply_is_a_400() -> None:
    """Today json.loads raises RecursionError: a 500, not a 400 naming the line."""
    with pytest.raises(InvalidInput, match="line 1 is nested too deeply"):
        parse_pairs(b"[" * 200_000 + b"\n")


def test_the_split_holds_out_whole_queries() -> None:
    pairs = [Pair(f"q{i % 10}", f"p{i}") for i in range(40)]  # 10 queries, 4 pairs each
    train, held = split_by_query(pairs, 0.2, seed=3)
    assert {p.query for p in train}.isdisjoint({p.query for p in held})
    assert len({p.query for p in held}) == 2 and len(held) == 8 and len(train) == 32
    assert split_by_query(pairs, 0.2, seed=3) == (train, held)  # seeded
    assert split_by_query(pairs, 0.2, seed=4) != (train, held)
    _, one = split_by_query(pairs[:2], 0.01)
    assert len({p.query for p in one}) == 1  # at least one query, never all
    with pytest.raises(InvalidInput, match="one distinct query"):
        split_by_query([Pair("q", "a"), Pair("q", "b")], 0.5)


def write(path: Path, rows: int, *, repeat: int = 0, negative: str | None = None) -> Path:
    """A JSONL of ``rows`` short rows, then the first ``repeat`` again (with ``negative``)."""
    with path.open("wb") as f:
        for i in range(rows):
            f.write(b'{"query": "q%d", "positive": "p%d"}\n' % (i % 1000, i))
        for i in range(repeat):
            row: dict[str, object] = {"query": f"q{i % 1000}", "positive": f"p{i}"}
            f.write(json.dumps(row | ({"negative": negative} if negative else {})).encode())
            f.write(b"\n")
    return path


@pytest.mark.slow
def test_a_file_is_checked_holding_a_few_bytes_a_row(tmp_path: Path) -> None:
    """Before, a file was checked as bytes, every pair held for the deduplication and the
    kept rows built whole (860 KB of 22,000 rows: 8.7 MiB traced at peak). Now it is
    read a line at a time, each row written out as it comes, and repeats are found by
    one 8-byte slot a row (240 KB here): under 1 MiB in all."""
    src = write(tmp_path / "in.jsonl", 20_000, repeat=2_000)
    tracemalloc.start()
    try:
        checked, kept = check_file(src, min_pairs=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (checked.rows, checked.duplicates, checked.merged) == (20_000, 2_000, False)
    assert checked.two_queries and peak < 1 << 20, peak
    assert kept.read_bytes() == to_jsonl(parse_pairs(src.read_bytes()).pairs)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.jsonl", kept.name])


def test_repeats_with_new_negatives_merge_through_a_file(tmp_path: Path) -> None:
    """Repeats that bring negatives are merged into their first row in a second pass, as
    parse_pairs merges them; a refused file leaves nothing beside it."""
    src = write(tmp_path / "in.jsonl", 2_000, repeat=3, negative="n")
    checked, kept = check_file(src)
    assert checked.merged and checked.duplicates == 3
    pairs = read_pairs(kept.read_bytes())
    assert pairs == parse_pairs(src.read_bytes()).pairs
    assert [p.negatives for p in pairs[:4]] == [("n",), ("n",), ("n",), ()]
    kept.unlink()
    src.write_bytes(b'{"query": "q", "positive": "p"}\n{\n')
    with pytest.raises(InvalidInput, match="line 2 is not JSON"):
        check_file(src)
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]


def test_repeats_bringing_too_many_negatives_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a repeat's negatives were all held and each checked against a list of the
    row's (one row repeated with 250,000 negatives: hours of CPU); now what repeats
    bring is held up to MERGE_BUDGET, then the file is a 400 naming the line."""
    monkeypatch.setattr(pairs_check, "MERGE_BUDGET", 1000)
    rows = [{"query": "q", "positive": "p", "negative": f"n{i}"} for i in range(20)]
    with pytest.raises(InvalidInput, match="repeats bring more than") as err:
        parse_pairs(jsonl(*rows))
    assert err.value.field == "line 11"
    assert len(parse_pairs(jsonl(*rows[:10])).pairs[0].negatives) == 10


def test_a_lone_surrogate_is_a_400_naming_its_line() -> None:
    """Before, json.loads took "\\ud800" and writing the kept rows raised
    UnicodeEncodeError: a 500."""
    ok = jsonl({"query": "q", "positive": "p"})
    for bad in (b'{"query": "\\ud800", "positive": "p"}\n', b'{"query": "q", "positive": "p", '
                b'"negative": "\\udfff"}\n'):  # fmt: skip
        with pytest.raises(InvalidInput, match="line 2 holds a lone surrogate") as err:
            parse_pairs(ok + bad)
        assert err.value.field == "line 2"
