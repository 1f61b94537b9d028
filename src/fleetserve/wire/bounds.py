"""Cheap, bounded looks at a body before anything decodes it: how deep it nests, and how
many elements its outermost array holds.

Decoders recurse once per level of nesting: a body nested thousands deep (a few KB)
reaches Python's recursion limit. These scans never recurse and never build the
body's values. JSON is scanned with numpy in chunks (strings, escapes included, are
masked out); msgpack is walked header by header, skipping payloads by their length.
A body that is malformed may scan to any figure: the decoder rejects it anyway.
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1 << 18  # bytes per numpy pass: its temporaries stay a few MB
_QUOTE, _BACKSLASH = 34, 92
_COMMA = 44


def _json_pass(data: bytes, *, elements: bool) -> tuple[int, int]:
    """(deepest nesting, commas at depth 1) of JSON ``data``, strings masked out."""
    a_all = np.frombuffer(data, dtype=np.uint8)
    in_str = False  # carried from chunk to chunk: inside a string
    run = 0  # backslashes ending the previous chunk
    depth = deepest = commas = 0
    for start in range(0, len(a_all), _CHUNK):
        a = a_all[start : start + _CHUNK]
        n = len(a)
        bs = a == _BACKSLASH
        # for each position, the last index at or before it that is not a backslash
        last = np.maximum.accumulate(np.where(bs, np.int32(-1), np.arange(n, dtype=np.int32)))
        quotes = np.flatnonzero(a == _QUOTE)
        if len(quotes):
            before = np.where(quotes > 0, last[np.maximum(quotes - 1, 0)], -1)
            runs = np.where(before >= 0, quotes - 1 - before, quotes + run)
            runs = np.where(quotes == 0, run, runs)
            real = quotes[(runs & 1) == 0]  # a quote after an odd run of \ is escaped
        else:
            real = quotes
        opens = (a == 91) | (a == 123)  # [ {
        closes = (a == 93) | (a == 125)  # ] }
        step_at = opens.view(np.int8) - closes.view(np.int8)
        marks = np.flatnonzero(opens | closes | (a == _COMMA) if elements else opens | closes)
        if len(marks):
            inside = (np.searchsorted(real, marks) + int(in_str)) & 1
            marks = marks[inside == 0]
            kinds = a[marks]
            levels = depth + np.cumsum(step_at[marks], dtype=np.int64)
            if len(levels):
                deepest = max(deepest, int(levels.max()))
                if elements:
                    commas += int(np.count_nonzero((kinds == _COMMA) & (levels == 1)))
                depth = int(levels[-1])
        in_str = bool((int(in_str) + len(real)) & 1)
        run = n - 1 - int(last[-1]) if last[-1] >= 0 else n + run
    return deepest, commas


def json_too_deep(data: bytes, limit: int) -> bool:
    """Whether JSON ``data`` nests deeper than ``limit`` (``[]`` is 1 deep); it scans
    only when the body holds more brackets than ``limit`` at all."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    return _json_pass(data, elements=False)[0] > limit


def json_elements(data: bytes) -> int | None:
    """How many elements the JSON array ``data`` holds (None: it is not an array),
    counted without building them."""
    body = data.strip()
    if body[:1] != b"[":
        return None
    if body[1:].lstrip()[:1] == b"]":
        return 0
    if body.count(b",") == 0:
        return 1
    return _json_pass(body, elements=True)[1] + 1


# msgpack: per first byte, (kind, fixed part) where kind is
#   0 scalar of `fixed` bytes, 1/2/4: payload length in that many bytes after the byte
#   (plus `fixed` more: an ext's type), 8: fixstr/fixbin of `fixed` bytes after the byte,
#   16: container of `fixed` children, 32/64: container count in 2/4 bytes (x2 for maps)
def _table() -> list[tuple[int, int]]:
    t: list[tuple[int, int]] = [(0, 1)] * 256
    for b in range(0x80, 0x90):
        t[b] = (16, 2 * (b & 0x0F))
    for b in range(0x90, 0xA0):
        t[b] = (16, b & 0x0F)
    for b in range(0xA0, 0xC0):
        t[b] = (8, b & 0x1F)
    for b, size in ((0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9)):
        t[b] = (0, size)
    for b, size in ((0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
        t[b] = (0, size)
    for b, size in ((0xD4, 3), (0xD5, 4), (0xD6, 6), (0xD7, 10), (0xD8, 18)):
        t[b] = (0, size)
    for b, width in ((0xC4, 1), (0xC5, 2), (0xC6, 4), (0xD9, 1), (0xDA, 2), (0xDB, 4)):
        t[b] = (width, 0)
    for b, width in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        t[b] = (width, 1)
    t[0xDC], t[0xDD], t[0xDE], t[0xDF] = (32, 1), (64, 1), (32, 2), (64, 2)
    return t


_MSGPACK = _table()
_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])


def msgpack_too_deep(data: bytes, limit: int) -> bool:
    """Whether msgpack ``data`` nests deeper than ``limit``; it walks the headers, and
    only when the body holds more container-like bytes than ``limit`` at all."""
    if len(data) - len(data.translate(None, _CONTAINER_BYTES)) <= limit:
        return False
    table, view = _MSGPACK, memoryview(data)
    need = [1]  # children left to read, per open container (the first: the body)
    pos = 0
    try:
        while need:
            if not need[-1]:
                need.pop()
                continue
            need[-1] -= 1
            kind, fixed = table[data[pos]]
            if kind == 0:
                pos += fixed
            elif kind == 8:
                pos += 1 + fixed
            elif kind in (1, 2, 4):
                pos += 1 + kind + fixed + int.from_bytes(view[pos + 1 : pos + 1 + kind], "big")
            else:
                if kind == 16:
                    count, pos = fixed, pos + 1
                else:
                    width = 2 if kind == 32 else 4
                    count = fixed * int.from_bytes(view[pos + 1 : pos + 1 + width], "big")
                    pos += 1 + width
                if len(need) > limit:
                    return True
                if count:
                    need.append(count)
    except IndexError:  # truncated: the decoder says so
        return False
    return False


def msgpack_elements(data: bytes) -> int | None:
    """How many elements the msgpack array ``data`` holds (None: not an array)."""
    if not data:
        return None
    b = data[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b in (0xDC, 0xDD):
        width = 2 if b == 0xDC else 4
        return int.from_bytes(data[1 : 1 + width], "big")
    return None


__all__ = ["json_elements", "json_too_deep", "msgpack_elements", "msgpack_too_deep"]
