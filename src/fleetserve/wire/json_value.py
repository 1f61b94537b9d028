"""A decoded JSON (or msgpack) document, typed: what ``json.loads`` gives back.

``JSON`` is any value of one; ``JSONObject`` its object case, for the documents read
by key (a fine-tuning job's figures, an event's data). A reader narrows a value with
``isinstance`` before it uses it as a number or a string.
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
JSONObject: TypeAlias = dict[str, JSON]

__all__ = ["JSON", "JSONObject"]
