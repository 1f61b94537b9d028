"""Shared by the training tests: torch's threads given back after each test that trains
(``pytest.mark.usefixtures("torch_threads")``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import keeping_threads


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """A run here sets torch's threads process-wide: the other tests get theirs back."""
    with keeping_threads():
        yield
