"""What the zero-shot family and its two methods share: the ``Method`` protocol each
method meets and the check of a hypothesis template. Apart from ``zero_shot.py``,
which picks a method by the spec, so that the methods need not import it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from ..wire.values import Array
from .base import ItemT, Prepared

StateT = TypeVar("StateT")  # a method's own state for one request


class Method(Protocol[ItemT, StateT]):
    """How one zero-shot method turns texts and labels into items and scores."""

    def load(self) -> None: ...

    def prepare(self, texts: list[str], labels: list[str]) -> Prepared[ItemT, StateT]:
        """Items for every text and label; ``options`` is the method's own state."""
        ...

    def forward(self, items: Sequence[ItemT]) -> Sequence[Array]: ...

    def scores(self, state: StateT, outputs: list[Array], multi_label: bool) -> Array:
        """``[texts, labels]`` probabilities."""
        ...


def check_template(model: str, template: str) -> str:
    if template.format("x") == template:
        raise ValueError(f"model {model}: hypothesis_template needs a {{}} for the label")
    return template
