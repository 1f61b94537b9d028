"""``multipart/form-data`` bodies, parsed as they arrive.

:class:`StreamParser` is fed the body chunk by chunk and turns it into events: a
:class:`Start` for each part (its name and file name), the part's bytes as they come,
and :data:`END` when the part is over. It holds at most one chunk and a delimiter's
length of the body, so the uploads that take it (``/v1/adapters``, ``/v1/files``)
write file parts straight to disk; what each part means is theirs to decide. A part
with a ``filename`` (even an empty one) is a file; one without is a form field. A body
that ends before its closing boundary is refused (:meth:`StreamParser.close`).
"""

from __future__ import annotations

import logging
from email.parser import BytesHeaderParser
from email.policy import HTTP
from typing import Final, NamedTuple

from ..wire import InvalidInput

MULTIPART = "multipart/form-data"
MAX_HEAD = 16 * 1024  # a part's headers: a name, a file name, a content type

log = logging.getLogger("fleetserve.gateway")


class Start(NamedTuple):
    """A part begins: its bytes follow until :data:`END`."""

    name: str
    filename: str | None  # None: a form field; a string (maybe empty): a file


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()
Event = Start | bytes | _End


class Part(NamedTuple):
    name: str
    filename: str | None
    data: bytes


def is_multipart(content_type: str | None) -> bool:
    return (content_type or "").strip().lower().startswith(MULTIPART)


def boundary_of(content_type: str) -> bytes:
    params = BytesHeaderParser(policy=HTTP).parsebytes(
        b"content-type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    )
    boundary = params.get_param("boundary", header="content-type")
    if not isinstance(boundary, str) or not boundary:
        raise InvalidInput("multipart body without a boundary", field="content-type")
    return boundary.encode("latin-1")


class StreamParser:
    """Events from a multipart body fed in chunks; ``InvalidInput`` for a part without
    headers or a name, headers over ``max_head`` bytes, or (at :meth:`close`) a body
    without its closing boundary."""

    def __init__(self, content_type: str, *, max_head: int = MAX_HEAD) -> None:
        # each delimiter is CRLF "--" boundary; the CRLF before the first one is optional
        self._delim = b"\r\n--" + boundary_of(content_type)
        self._buf = b"\r\n"
        self._state = "preamble"  # -> after (a delimiter) -> head -> data -> after ... done
        self._max_head = max_head
        self.parts = 0
        self.size = 0  # bytes fed

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, chunk: bytes) -> list[Event]:
        if self._state == "done":
            return []  # the epilogue, ignored
        self._buf += chunk
        self.size += len(chunk)
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def close(self) -> None:
        if self._state != "done":
            log.warning(
                "upload cut off: a multipart body of %d bytes has no closing boundary", self.size
            )
            raise InvalidInput("multipart body is cut short (no closing boundary)", field="body")
        if self.parts == 0:
            raise InvalidInput("multipart body has no parts", field="body")

    def _step(self, events: list[Event]) -> bool:
        """One move of the state machine; False when it needs more bytes."""
        buf, delim = self._buf, self._delim
        if self._state in ("preamble", "data"):
            at = buf.find(delim)
            if at < 0:
                keep = len(delim) - 1  # the start of a delimiter split across chunks
                if self._state == "data" and len(buf) > keep:
                    events.append(buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :] if len(buf) > keep else buf
                return False
            if self._state == "data":
                if at:
                    events.append(buf[:at])
                events.append(END)
            self._buf, self._state = buf[at + len(delim) :], "after"
            return True
        if self._state == "after":
            if len(buf) < 2:
                return False
            if buf.startswith(b"--"):
                self._buf, self._state = b"", "done"
                return False
            eol = buf.find(b"\r\n")  # transport padding may follow a delimiter
            if eol < 0:
                if len(buf) > self._max_head:
                    raise InvalidInput("multipart delimiter line is too long", field="body")
                return False
            self._buf, self._state = buf[eol:], "head"  # keeps the CRLF: headers may be empty
            return True
        # head: CRLF, header lines, CRLF CRLF
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > self._max_head:
                raise InvalidInput(
                    f"multipart part headers over {self._max_head} bytes", field="body"
                )
            return False
        events.append(_start(buf[2:end] if end else b""))
        self.parts += 1
        self._buf, self._state = buf[end + 4 :], "data"
        return True


def _start(head: bytes) -> Start:
    if not head.strip():
        raise InvalidInput("multipart part without headers", field="body")
    part = BytesHeaderParser(policy=HTTP).parsebytes(head + b"\r\n\r\n")
    name = part.get_param("name", header="content-disposition")
    filename = part.get_param("filename", header="content-disposition")
    if not isinstance(name, str):
        raise InvalidInput("multipart part without a name", field="body")
    return Start(name, filename if isinstance(filename, str) else None)


def parse(raw: bytes, content_type: str) -> list[Part]:
    """The parts of a whole body ``raw``, in order (small bodies and tests)."""
    parser = StreamParser(content_type, max_head=max(MAX_HEAD, len(raw)))
    parts: list[Part] = []
    current: tuple[Start, list[bytes]] | None = None
    for event in parser.feed(raw):
        if isinstance(event, Start):
            current = (event, [])
        elif isinstance(event, bytes):
            assert current is not None
            current[1].append(event)
        elif current is not None:
            parts.append(Part(current[0].name, current[0].filename, b"".join(current[1])))
            current = None
    parser.close()
    return parts
