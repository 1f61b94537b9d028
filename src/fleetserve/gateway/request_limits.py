"""Bounds on an inference body, checked before it is published and before anything
decodes its items: nesting depth (400), item count and per-item size (413).

The gateway does not decode items. It takes each item field of the route's body as a
raw slice of the body's bytes (``msgspec.Raw``: the other fields are skipped, nothing
is built), and checks an item list at the least cost that bounds it:

- a list too short to hold more than ``max_items`` elements or a larger item than
  ``max_item_bytes`` (the usual request) is not looked into at all;
- a msgpack array's header says its count; a JSON list up to :data:`SCAN_BYTES` is split
  into raw slices (``list[msgspec.Raw]``: a few µs, and at most half its bytes in
  elements), a larger one is counted by a scan that builds nothing
  (:mod:`fleetserve.wire.bounds`) and split only once its count is within ``max_items``;
- then each element's encoded bytes are measured, from the same slices.

An object item on encode and score (``{"image": ...}`` or ``{"text": ...}``, the image
families) is held to ``max_item_bytes`` by its text; an image keeps its model's
``max_image_bytes``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

import msgspec

from ..settings import Settings
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
# JSON lists up to this size are split by msgspec (at most SCAN_BYTES / 2 slices, ~25 MiB
# of Raw objects at worst); larger ones are counted by the numpy scan first
SCAN_BYTES = 256 * 1024
_RAW_LIST_JSON = msgspec.json.Decoder(list[msgspec.Raw])
_RAW_LIST_MSGPACK = msgspec.msgpack.Decoder(list[msgspec.Raw])


class _Text(msgspec.Struct):
    """An image family's object item, its text alone (an image is skipped, not built)."""

    text: msgspec.Raw = msgspec.Raw()


_TEXT_JSON = msgspec.json.Decoder(_Text)
_TEXT_MSGPACK = msgspec.msgpack.Decoder(_Text)


def _fields_struct(task: Task) -> type[msgspec.Struct]:
    names = (*LISTS.get(task, ()), *SINGLES.get(task, ()))
    return msgspec.defstruct(
        f"{task.name.title()}Items", [(n, msgspec.Raw, msgspec.Raw()) for n in names]
    )


@dataclass(frozen=True)
class RequestLimits:
    """``max_nesting_depth``, ``max_items`` and ``max_item_bytes`` (0: that check off)."""

    # the defaults are the settings' (one source: settings_limits.py)
    max_depth: int = Settings.max_nesting_depth
    max_items: int = Settings.max_items
    max_item_bytes: int = Settings.max_item_bytes

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(settings.max_nesting_depth, settings.max_items, settings.max_item_bytes)

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
        head = msgspec.structs.asdict(decoder.decode(body, encoding))  # its fields by name
        for name in LISTS.get(task, ()):
            self._list(name, head[name], encoding, task)
        for name in SINGLES.get(task, ()):
            self._item(name, head[name], encoding, task)

    def _list(self, name: str, field: msgspec.Raw, encoding: Encoding, task: Task) -> None:
        if not field:
            return  # absent: the worker names what is missing
        # n elements take 2n+1 bytes at least ("[" "]" and n-1 commas; msgpack n+1): a
        # short list cannot hold too many, nor an item longer than itself
        few = not self.max_items or len(field) < 2 * self.max_items + 1
        if few and (not self.max_item_bytes or len(field) <= self.max_item_bytes):
            return
        raw = bytes(field)
        mp = encoding is Encoding.MSGPACK
        items: list[msgspec.Raw] | None = None
        if mp:
            count = msgpack_elements(raw)
        elif raw.lstrip()[:1] != b"[":
            count = None
        elif len(raw) <= SCAN_BYTES:  # split once, the slices measured below
            items = _RAW_LIST_JSON.decode(raw)
            count = len(items)
        else:
            count = json_elements(raw)
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
            if items is None:
                items = (_RAW_LIST_MSGPACK if mp else _RAW_LIST_JSON).decode(raw)
            for i, item in enumerate(items):
                self._item(f"{name}[{i}]", item, encoding, task)

    def _item(self, field: str, raw: bytes | msgspec.Raw, encoding: Encoding, task: Task) -> None:
        size = len(raw)
        if not self.max_item_bytes or size <= self.max_item_bytes:
            return  # nothing in it can be larger
        mp = encoding is Encoding.MSGPACK
        if task in IMAGE_TASKS and _is_object(raw, mp):
            # {"image": ...} or {"text": ...}: the text is held to max_item_bytes, an
            # image to its model's max_image_bytes
            text: bytes | msgspec.Raw
            try:
                text = (_TEXT_MSGPACK if mp else _TEXT_JSON).decode(raw).text
            except msgspec.DecodeError:  # not an item the worker takes: measured whole
                text = raw
            field, size = f"{field}.text", len(text)
        self._size(field, size)

    def _size(self, field: str, size: int) -> None:
        if self.max_item_bytes and size > self.max_item_bytes:
            raise PayloadTooLarge(
                f"{field} is {size} bytes, more than this server's limit of "
                f"{self.max_item_bytes} bytes per item (max_item_bytes)",
                field=field,
            )


def _is_object(raw: bytes | msgspec.Raw, msgpack: bool) -> bool:
    view = memoryview(raw)
    if msgpack:
        return bool(view) and (0x80 <= view[0] <= 0x8F or view[0] in (0xDE, 0xDF))
    return bytes(view[:64]).lstrip()[:1] == b"{"


_JSON_NUMBER_FIRST = re.compile(rb"[ \t\r\n]*\[[ \t\r\n]*[-0-9]")


def _numbers(raw: bytes, msgpack: bool) -> bool:
    """Whether the array ``raw`` starts with a number: one input of token ids."""
    if msgpack:
        skip = 1 if 0x90 <= raw[0] <= 0x9F else 3 if raw[0] == 0xDC else 5
        b = raw[skip : skip + 1]
        return bool(b) and (b[0] <= 0x7F or 0xCA <= b[0] <= 0xD3 or b[0] >= 0xE0)
    return _JSON_NUMBER_FIRST.match(raw) is not None  # nothing of the list is copied


_DECODERS = {t: TypedDecoder(_fields_struct(t)) for t in Task if t in LISTS or t in SINGLES}


__all__ = ["LISTS", "SINGLES", "RequestLimits"]
