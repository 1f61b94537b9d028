"""Bounds on an inference body, checked before it is published and before anything
decodes its items: nesting depth (400), item count and per-item size (413).

The gateway does not decode items. It takes each item field of the route's body as a
raw slice of the body's bytes (``msgspec.Raw``: the other fields are skipped, nothing
is built), counts the elements of an item list without building them (a msgpack
array's header says it; JSON is scanned, :mod:`fleetserve.wire.bounds`), and only then,
the count being within ``max_items``, measures each item's encoded bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec

from ..wire import Encoding, PayloadTooLarge, Task
from ..wire.bounds import json_elements, msgpack_elements
from ..wire.codec import TypedDecoder, check_depth

# per task: the fields that hold a list of items, and those that hold one item
LISTS: dict[Task, tuple[str, ...]] = {
    Task.EMBEDDINGS: ("input",),
    Task.ENCODE: ("inputs",),
    Task.SCORE: ("items",),
    Task.RERANK: ("documents",),
    Task.EXTRACT: ("inputs", "labels"),
    Task.CHAT: ("messages",),
}
SINGLES: dict[Task, tuple[str, ...]] = {
    Task.SCORE: ("query",),
    Task.RERANK: ("query",),
    Task.GENERATE: ("prompt",),
}
# where an item may be an image ({"image": ...}): bounded by the model's max_image_bytes
# (10 MiB unless its spec says), not max_item_bytes, which is for texts
IMAGE_TASKS = frozenset({Task.ENCODE, Task.SCORE})
THREAD_BYTES = 1 << 20  # bodies this large are checked off the event loop
_RAW_LIST_JSON = msgspec.json.Decoder(list[msgspec.Raw])
_RAW_LIST_MSGPACK = msgspec.msgpack.Decoder(list[msgspec.Raw])


def _fields_struct(task: Task) -> type[msgspec.Struct]:
    names = (*LISTS.get(task, ()), *SINGLES.get(task, ()))
    return msgspec.defstruct(
        f"{task.name.title()}Items", [(n, msgspec.Raw, msgspec.Raw()) for n in names]
    )


@dataclass(frozen=True)
class RequestLimits:
    """``max_nesting_depth``, ``max_items`` and ``max_item_bytes`` (0: that check off)."""

    max_depth: int = 64
    max_items: int = 2048
    max_item_bytes: int = 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Any) -> RequestLimits:
        d = cls()
        return cls(
            int(getattr(settings, "max_nesting_depth", d.max_depth)),
            int(getattr(settings, "max_items", d.max_items)),
            int(getattr(settings, "max_item_bytes", d.max_item_bytes)),
        )

    def advertised(self) -> dict[str, int]:
        """What ``GET /v1/models`` says in each model's ``limits``."""
        return {
            "max_items": self.max_items,
            "max_item_bytes": self.max_item_bytes,
            "max_nesting_depth": self.max_depth,
        }

    async def check(self, body: bytes, encoding: Encoding, task: Task) -> None:
        """:meth:`check_now`, off the event loop for a large body."""
        if len(body) >= THREAD_BYTES:
            await asyncio.to_thread(self.check_now, body, encoding, task)
        else:
            self.check_now(body, encoding, task)

    def check_now(self, body: bytes, encoding: Encoding, task: Task) -> None:
        check_depth(body, encoding, self.max_depth)
        if not self.max_items and not self.max_item_bytes:
            return
        decoder = _DECODERS.get(task)
        if decoder is None:
            return
        head = decoder.decode(body, encoding)
        for name in LISTS.get(task, ()):
            self._list(name, bytes(getattr(head, name)), encoding, task)
        for name in SINGLES.get(task, ()):
            self._item(name, bytes(getattr(head, name)), encoding, task)

    def _list(self, name: str, raw: bytes, encoding: Encoding, task: Task) -> None:
        if not raw:
            return  # absent: the worker names what is missing
        mp = encoding is Encoding.MSGPACK
        count = msgpack_elements(raw) if mp else json_elements(raw)
        if count is None or (task is Task.EMBEDDINGS and _numbers(raw, mp)):
            self._item(name, raw, encoding, task)  # one item (a text, an image, token ids)
            return
        if self.max_items and count > self.max_items:
            raise PayloadTooLarge(
                f"{name} holds {count} items, more than this server's limit of "
                f"{self.max_items} per request (max_items); send them in several requests",
                field=name,
            )
        if self.max_item_bytes and len(raw) > self.max_item_bytes:
            items = (_RAW_LIST_MSGPACK if mp else _RAW_LIST_JSON).decode(raw)
            for i, item in enumerate(items):
                self._item(f"{name}[{i}]", bytes(item), encoding, task)

    def _item(self, field: str, raw: bytes, encoding: Encoding, task: Task) -> None:
        if task in IMAGE_TASKS and _is_object(raw, encoding is Encoding.MSGPACK):
            return  # an image: the model's max_image_bytes bounds it
        self._size(field, len(raw))

    def _size(self, field: str, size: int) -> None:
        if self.max_item_bytes and size > self.max_item_bytes:
            raise PayloadTooLarge(
                f"{field} is {size} bytes, more than this server's limit of "
                f"{self.max_item_bytes} bytes per item (max_item_bytes)",
                field=field,
            )


def _is_object(raw: bytes, msgpack: bool) -> bool:
    if msgpack:
        return bool(raw) and (0x80 <= raw[0] <= 0x8F or raw[0] in (0xDE, 0xDF))
    return raw.lstrip()[:1] == b"{"


def _numbers(raw: bytes, msgpack: bool) -> bool:
    """Whether the array ``raw`` starts with a number: one input of token ids."""
    if msgpack:
        skip = 1 if 0x90 <= raw[0] <= 0x9F else 3 if raw[0] == 0xDC else 5
        b = raw[skip : skip + 1]
        return bool(b) and (b[0] <= 0x7F or 0xCA <= b[0] <= 0xD3 or b[0] >= 0xE0)
    return raw.lstrip()[1:].lstrip()[:1] in (b"-", *(bytes([c]) for c in b"0123456789"))


_DECODERS = {t: TypedDecoder(_fields_struct(t)) for t in Task if t in LISTS or t in SINGLES}


__all__ = ["LISTS", "SINGLES", "RequestLimits"]
