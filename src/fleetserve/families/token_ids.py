"""Token ids as input: OpenAI's embeddings API takes ``input`` as a list of ints or a
list of such lists (its clients send them, e.g. after tiktoken), as well as text.

The ids are the model's own tokenizer's: they go to the model as they are (no special
tokens added), cut at the model's ``max_seq_len`` as text is, and each must be below
the vocabulary size, else a 400 naming the position.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..wire import InvalidInput

Input = str | Sequence[str | int | Sequence[int]]


def split_input(value: Input, field: str = "input") -> tuple[list[str], list[list[int]] | None]:
    """(texts, None) for text input, ([], ids per input) for token ids (one input for a
    flat list of ids); a list that mixes texts, ids and lists of ids is a 400."""
    if isinstance(value, str):
        return [value], None
    if not value:
        raise InvalidInput(f"{field} must not be empty", field=field)
    if all(isinstance(v, str) for v in value):
        return [str(v) for v in value], None
    if all(isinstance(v, int) for v in value):
        return [], [[int(v) for v in value]]  # type: ignore[arg-type]  # one input
    if all(isinstance(v, list) for v in value):
        return [], [list(v) for v in value]  # type: ignore[arg-type]
    raise InvalidInput(
        f"{field} mixes kinds: it must be a text, a list of texts, a list of token ids or "
        "a list of lists of token ids",
        field=field,
    )


def check_ids(
    ids: list[list[int]], vocab_size: int, max_len: int, fields: Sequence[str]
) -> list[list[int]]:
    """Each input's ids cut at ``max_len``; an empty input or an id outside the
    vocabulary is a 400 naming it (``fields[i]``: input i's name in the body)."""
    out = []
    for seq, where in zip(ids, fields, strict=True):
        if not seq:
            raise InvalidInput(f"{where} is an empty list of token ids", field=where)
        for j, tok in enumerate(seq):
            if not 0 <= tok < vocab_size:
                raise InvalidInput(
                    f"{where}[{j}] is token id {tok}, outside the model's vocabulary "
                    f"(0 to {vocab_size - 1})",
                    field=f"{where}[{j}]",
                )
        out.append(seq[:max_len])
    return out


def id_fields(value: Input, ids: list[list[int]], field: str = "input") -> list[str]:
    """The body's name of each token-id input: ``input`` for a flat list, else
    ``input[i]``."""
    flat = not isinstance(value, str) and bool(value) and isinstance(value[0], int)
    return [field] if flat else [f"{field}[{i}]" for i in range(len(ids))]
