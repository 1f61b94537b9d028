"""The limits that keep one client, upload or broker fault from taking the process down.

These fields are part of the one ``Settings`` object (it inherits them); they live here
so that ``settings.py`` stays the list of what a deployment chooses, and this file the
list of what bounds it. Each field declares its env variable, flag and help as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings_fields import setting


@dataclass(frozen=True)
class Limits:
    """Bounds on HTTP parsing, request size, uploads, keep-alive and training input."""

    # Each helper adds its fields below, under a comment naming the area.


__all__ = ["Limits", "setting"]
