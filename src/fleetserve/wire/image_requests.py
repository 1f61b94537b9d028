"""The image family's request bodies (``families.image`` decodes them in the worker;
the gateway's OpenAPI document names them), apart from the family so that reading
them needs no Pillow."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

B = TypeVar("B", bytes, str)


class ImageItem(msgspec.Struct, Generic[B], forbid_unknown_fields=True):
    """One input: ``{"image": ...}`` or ``{"text": ...}``."""

    image: B | None = None  # msgpack: bin; JSON: base64 or a data: URL
    text: str | None = None


class ImageEncodeRequest(msgspec.Struct, Generic[B], forbid_unknown_fields=True):
    """``POST /v1/encode/{model}`` for an image family model; a plain string is a text."""

    inputs: str | ImageItem[B] | list[str | ImageItem[B]]
    normalize: bool | None = None  # None: the model spec's default
    output_dtype: str = "float32"
    truncate: bool = True


class ImageScoreRequest(msgspec.Struct, Generic[B], forbid_unknown_fields=True):
    """``POST /v1/score/{model}``: cosine of each item to the query."""

    query: str | ImageItem[B]
    items: list[str | ImageItem[B]]
    truncate: bool = True
