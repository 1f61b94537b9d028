"""'Did you mean': the known names closest to an unknown one."""

from __future__ import annotations

import pytest

from fleetserve.wire.suggest import close_names, did_you_mean

IDS = [
    "sentence-transformers/all-MiniLM-L6-v2",
    "sentence-transformers/all-MiniLM-L6-v2-multivector",
    "BAAI/bge-small-en-v1.5",
    "thenlper/gte-small",
    "alice/legal",
    "bob/medical",
]


@pytest.mark.parametrize(
    ("typed", "first"),
    [
        ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"),  # no organisation
        ("sentence-transformers/all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
        ("bge-small", "BAAI/bge-small-en-v1.5"),  # the start of its name
        ("BAAI/bge-smal-en-v1.5", "BAAI/bge-small-en-v1.5"),  # a typo
        ("alice/lega", "alice/legal"),
    ],
)
def test_the_likeliest_comes_first(typed: str, first: str) -> None:
    assert close_names(typed, IDS)[0] == first


def test_nothing_close_is_no_suggestion_and_at_most_three_are_named() -> None:
    assert did_you_mean("nothing/like-it", IDS) == ""
    assert len(close_names("s", [f"s{i}" for i in range(9)])) == 3
    assert did_you_mean("bge-small", IDS).startswith("; did you mean 'BAAI/bge-small-en-v1.5'")
    assert did_you_mean("gte-smal", IDS) == "; did you mean 'thenlper/gte-small'?"
