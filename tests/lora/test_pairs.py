"""Files of pairs: each rejection names its line; repeats merge; long texts are flagged;
the held-out split never shares a query with training."""

from __future__ import annotations

import json

import pytest

from fleetserve.lora.pairs import parse_pairs, split_by_query, to_jsonl
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


def test_long_texts_are_flagged_by_line_not_refused() -> None:
    raw = jsonl({"query": "q", "positive": "x" * 30}, {"query": "q" * 31, "positive": "p"})
    parsed = parse_pairs(raw, max_chars=29)
    assert len(parsed.pairs) == 2
    assert parsed.warnings[0].startswith("line 1: positive is 30 characters, over 29")
    assert parsed.warnings[1].startswith("line 2: query is 31 characters")


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
