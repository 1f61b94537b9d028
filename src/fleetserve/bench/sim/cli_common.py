"""What the two ``fleetserve bench sim`` commands share: a comma-separated list of
integers as a flag, and NaN as null in their JSON. Apart from ``cli.py``, which hands
``sim fleet`` to ``fleet_cli.py``, so that ``fleet_cli`` need not import it."""

from __future__ import annotations

import math
from typing import Any


def ints(s: str) -> list[int]:
    """Whole numbers apart by commas (``8,64``); ``ValueError`` naming ``s`` if not."""
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"not whole numbers apart by commas: {s!r} (try 8,64)") from None


def json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(f"not serializable: {type(o).__name__}")
