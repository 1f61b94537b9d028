"""Durations as people write them: ``30`` (seconds), ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"``.

Nothing here imports any other part of fleetserve but :mod:`.errors`.
"""

from __future__ import annotations

import math
import re

from .errors import InvalidInput

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
FORM = "a number of seconds or a duration such as 250ms, 30s, 5m, 1h"

_DURATION = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(ms|s|m|h)?")


def parse_duration(value: object, field: str, *, maximum: float = 86400.0) -> float:
    """Seconds from ``value``: an int or float of seconds, or a string ``<number><unit>``
    (unit ``ms``, ``s``, ``m`` or ``h``; a bare number is seconds).

    Raises :class:`~fleetserve.wire.InvalidInput` (``field=field``) for a bool, a
    negative, NaN or infinite value, one above ``maximum`` seconds, or anything else
    that does not parse; the message names the field and the accepted form.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(
            f"{field} must be {FORM}, not {type(value).__name__} {value!r}", field=field
        )
    if isinstance(value, str):
        text = value.strip()
        m = _DURATION.fullmatch(text)
        if m is not None:
            seconds = float(m.group(1)) * UNITS[m.group(2) or "s"]
        elif text.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            seconds = float(text)
        else:
            raise InvalidInput(f"{field} must be {FORM}, not {value!r}", field=field)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidInput(
            f"{field} must be a finite duration ({FORM}), not {value!r}", field=field
        )
    if seconds < 0:
        raise InvalidInput(f"{field} must not be negative ({FORM}), not {value!r}", field=field)
    if seconds > maximum:
        raise InvalidInput(
            f"{field} is enormous: {value!r} is more than the maximum of {maximum:g} seconds",
            field=field,
        )
    return seconds


__all__ = ["FORM", "UNITS", "parse_duration"]
