"""How a long list call goes as several requests: the server's limits, the chunk plan,
and a failed chunk's error with its item index in the whole list.

A call of at most ``SMALL_ITEMS`` items and ``SMALL_BYTES`` bytes goes as one request,
with no look-up. A longer one is cut into chunks of whole items, each at most
``BODY_SHARE`` of the server's ``max_body_bytes`` and ``BATCHES`` batches' worth of
the model's ``max_batch_tokens`` (estimated) and ``max_batch_size``, and never more
than the server's ``max_items`` items, so that each is served well within its deadline
(an item over ``max_item_bytes`` goes alone and gets the server's 413 naming it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from ..wire import Encoding, FleetError
from ..wire.codec import dumps

SMALL_ITEMS = 32
SMALL_BYTES = 64 * 1024
BODY_SHARE = 0.5  # of max_body_bytes: room for the rest of the body and for mistakes
BATCHES = 2  # full batches per chunk: enough for the worker to batch across chunks
BYTES_PER_TOKEN = 3  # a cautious estimate (English runs near 4 bytes a token)
SPECIAL_TOKENS = 2  # [CLS] and [SEP], or their kin
Span = tuple[int, int]  # items start to stop of the whole list


@dataclass(frozen=True)
class Limits:
    """What the server advertises per model in ``GET /v1/models`` (``"limits"``); the
    defaults stand in for what it leaves out (a gateway does not know worker budgets)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_batch_tokens: int = 2048
    max_batch_size: int = 64
    max_seq_len: int = 512
    max_items: int = 2048

    @classmethod
    def from_info(cls, info: object) -> Limits:
        """Read one entry's ``limits``; a missing or unusable figure keeps its default."""
        if not isinstance(info, dict):
            return cls()
        known: dict[str, int] = {}
        for f in fields(cls):
            value = info.get(f.name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                known[f.name] = value
        return cls(**known)


def limits_by_model(models: object) -> dict[str, Limits]:
    """The limits of each model in a ``GET /v1/models`` body (``{"data": [...]}``)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return {}
    return {
        str(m["id"]): Limits.from_info(m.get("limits"))
        for m in data
        if isinstance(m, dict) and "id" in m
    }


def catalog_id(model: str) -> str:
    """The model whose limits apply: ``base`` of ``base:adapter``."""
    return model.partition(":")[0]


def item_bytes(item: object) -> int:
    """The bytes one item adds to a msgpack body (its header at most 5)."""
    if isinstance(item, str):
        return len(item.encode("utf-8")) + 5
    if isinstance(item, bytes | bytearray):
        return len(item) + 5
    return len(dumps(item, Encoding.MSGPACK))


def sizes_if_large(items: Sequence[object] | None) -> list[int] | None:
    """Each item's bytes when the list may need splitting; None when it goes whole."""
    if items is None:
        return None
    sizes = [item_bytes(x) for x in items]
    if len(sizes) <= SMALL_ITEMS and sum(sizes) <= SMALL_BYTES:
        return None
    return sizes


def plan(sizes: Sequence[int], limits: Limits, base_bytes: int, extra_tokens: int) -> list[Span]:
    """Consecutive spans of whole items within the chunk budgets (one item at least,
    so that an item too large alone gets the server's own answer).

    ``base_bytes``: the body without items; ``extra_tokens``: what each item brings
    along (the query, for scoring)."""
    max_bytes = max(1, int(limits.max_body_bytes * BODY_SHARE) - base_bytes)
    max_tokens = BATCHES * limits.max_batch_tokens
    max_items = min(BATCHES * limits.max_batch_size, limits.max_items)
    spans: list[Span] = []
    start = used_bytes = used_tokens = 0
    for i, size in enumerate(sizes):
        tokens = estimate_tokens(size, limits.max_seq_len) + extra_tokens
        full = (
            used_bytes + size > max_bytes
            or used_tokens + tokens > max_tokens
            or i - start >= max_items
        )
        if i > start and full:
            spans.append((start, i))
            start, used_bytes, used_tokens = i, 0, 0
        used_bytes += size
        used_tokens += tokens
    if start < len(sizes):
        spans.append((start, len(sizes)))
    return spans


def estimate_tokens(size: int, max_seq_len: int) -> int:
    return min(max_seq_len, size // BYTES_PER_TOKEN + SPECIAL_TOKENS)


def shifted(err: FleetError, field: str, offset: int) -> FleetError:
    """A chunk's error naming ``field[i]`` as the whole list's ``field[offset + i]``."""
    m = re.fullmatch(rf"{re.escape(field)}\[(\d+)\](.*)", err.field or "")
    if not offset or m is None:
        return err
    old, new = f"{field}[{m[1]}]", f"{field}[{int(m[1]) + offset}]"
    return type(err)(err.message.replace(old, new), field=new + m[2], retry_after=err.retry_after)
