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

    # -- uploads (/v1/adapters, /v1/files): spooled to disk, bounded ------------------
    max_uploads: int = setting(
        8, "Uploads (adapters and files) one gateway receives at once; beyond: 503.",
        groups="adapters",
    )  # fmt: skip
    max_uploads_per_tenant: int = setting(
        2, "Uploads one tenant sends at once; beyond: 429.", groups="adapters"
    )
    max_safetensors_header_bytes: int = setting(
        4 * 1024 * 1024,
        "Largest JSON header an uploaded adapter_model.safetensors may declare (bytes).",
        groups="adapters",
    )


__all__ = ["Limits", "setting"]
