"""``multipart/form-data`` bodies, read whole: the parts, in order.

The uploads that take it (``/v1/adapters``, ``/v1/files``) read the body within their
limit first, then split it here; what each part means is theirs to decide. A part
with a ``filename`` (even an empty one) is a file; one without is a form field.
"""

from __future__ import annotations

from email.parser import BytesHeaderParser
from email.policy import HTTP
from typing import NamedTuple

from ..wire import InvalidInput

MULTIPART = "multipart/form-data"


class Part(NamedTuple):
    name: str
    filename: str | None  # None: a form field; a string (maybe empty): a file
    data: bytes


def is_multipart(content_type: str | None) -> bool:
    return (content_type or "").strip().lower().startswith(MULTIPART)


def parse(raw: bytes, content_type: str) -> list[Part]:
    """The parts of ``raw``; ``InvalidInput`` for a body without a boundary, cut short,
    or with a part that has no headers or no name."""
    params = BytesHeaderParser(policy=HTTP).parsebytes(
        b"content-type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    )
    boundary = params.get_param("boundary", header="content-type")
    if not isinstance(boundary, str) or not boundary:
        raise InvalidInput("multipart body without a boundary", field="content-type")
    # each delimiter is CRLF "--" boundary; the CRLF before the first one is optional
    chunks = (b"\r\n" + raw).split(b"\r\n--" + boundary.encode("latin-1"))
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise InvalidInput("multipart body is cut short (no closing boundary)", field="body")
    parts: list[Part] = []
    for chunk in chunks[1:-1]:
        _padding, _, part_bytes = chunk.partition(b"\r\n")
        head, sep, data = part_bytes.partition(b"\r\n\r\n")
        if not sep:
            raise InvalidInput("multipart part without headers", field="body")
        part = BytesHeaderParser(policy=HTTP).parsebytes(head + b"\r\n\r\n")
        name = part.get_param("name", header="content-disposition")
        filename = part.get_param("filename", header="content-disposition")
        if not isinstance(name, str):
            raise InvalidInput("multipart part without a name", field="body")
        parts.append(Part(name, filename if isinstance(filename, str) else None, data))
    return parts
