"""Payload stores: where request bodies and results over the offload threshold go.

Pick one by URL with :func:`open_store`:

- ``memory://``: in this process only (``fleetserve serve``, tests).
- ``file:///abs/dir`` or ``file://./rel/dir``: a directory, e.g. a shared volume.
- ``s3://bucket/optional/prefix``: S3 or an S3-compatible server; query parameters
  ``endpoint=http://host:port`` and ``region=...`` (keyword arguments win over them).
- ``nats://bucket``: a JetStream Object Store bucket over the ``nats=`` connection;
  query parameters ``storage=file|memory`` and ``ttl=<seconds>``.

Credentials never go in the URL, so :attr:`PayloadStore.url` is safe to log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from .base import PayloadMissing, PayloadStore, check_key
from .file import FileStore
from .memory import MemoryStore
from .offload import (
    DEFAULT_THRESHOLD,
    REF_HEADER,
    Offload,
    make_ref,
    new_key,
    parse_ref,
    sweep_forever,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "REF_HEADER",
    "SCHEMES",
    "FileStore",
    "MemoryStore",
    "Offload",
    "PayloadMissing",
    "PayloadStore",
    "check_key",
    "make_ref",
    "new_key",
    "open_store",
    "parse_ref",
    "sweep_forever",
]

SCHEMES = ("memory", "file", "s3", "nats")


def _query(query: str, allowed: tuple[str, ...], url: str) -> dict[str, str]:
    params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(
            f"payload store URL {url!r}: unknown parameter(s) {unknown}; "
            f"accepted: {list(allowed) or 'none'}"
        )
    return {k: v[-1] for k, v in params.items()}


def _file_root(netloc: str, path: str, url: str) -> Path:
    if netloc in ("", "localhost"):
        if not path:
            raise ValueError(f"payload store URL {url!r} has no directory")
        return Path(path)
    if netloc in (".", ".."):
        return Path(netloc + path)
    raise ValueError(
        f"payload store URL {url!r}: write file:///absolute/dir or file://./relative/dir"
    )


async def open_store(
    url: str,
    *,
    nats: Any = None,
    s3_access_key_id: str | None = None,
    s3_secret_access_key: str | None = None,
    s3_region: str | None = None,
    s3_endpoint: str | None = None,
) -> PayloadStore:
    """The payload store ``url`` names, ready to use (a NATS bucket is created if
    missing). ``nats`` is a connected ``nats.aio.client.Client``, needed for
    ``nats://`` and not closed by the store. Raises ``ValueError`` for a bad URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if parts.username is not None or parts.password is not None:
        raise ValueError("put payload store credentials in settings, not in the URL")
    if scheme == "memory":
        _query(parts.query, (), url)
        if parts.netloc or parts.path.strip("/"):
            raise ValueError(f"payload store URL {url!r}: write just memory://")
        return MemoryStore()
    if scheme == "file":
        _query(parts.query, (), url)
        return FileStore(_file_root(parts.netloc, parts.path, url))
    if scheme == "s3":
        from .s3 import S3Store

        q = _query(parts.query, ("endpoint", "region"), url)
        if not parts.netloc:
            raise ValueError(f"payload store URL {url!r} names no bucket: write s3://bucket/prefix")
        return S3Store(
            parts.netloc,
            prefix=parts.path.strip("/"),
            endpoint=s3_endpoint or q.get("endpoint") or None,
            region=s3_region or q.get("region") or None,
            access_key_id=s3_access_key_id,
            secret_access_key=s3_secret_access_key,
        )
    if scheme == "nats":
        q = _query(parts.query, ("storage", "ttl"), url)
        if nats is None:
            raise ValueError(
                f"payload store URL {url!r} needs a NATS connection: pass nats=<connected client>"
            )
        if not parts.netloc or parts.path.strip("/"):
            raise ValueError(f"payload store URL {url!r}: write nats://bucket-name")
        from .nats import NatsObjectStore

        storage: Literal["file", "memory"] = "file"
        if q.get("storage", "file") == "memory":
            storage = "memory"
        elif q.get("storage", "file") != "file":
            raise ValueError(f"payload store URL {url!r}: storage must be 'file' or 'memory'")
        try:
            ttl = float(q["ttl"]) if q.get("ttl") else None
        except ValueError:
            raise ValueError(f"payload store URL {url!r}: ttl must be seconds") from None
        return await NatsObjectStore.open(nats, parts.netloc, storage=storage, ttl=ttl)
    raise ValueError(
        f"unknown payload store URL {url!r}; accepted schemes: "
        + ", ".join(f"{s}://" for s in SCHEMES)
    )
