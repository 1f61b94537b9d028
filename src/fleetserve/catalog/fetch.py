"""Model weights from an object store: ``s3://bucket/prefix`` synced once to a local cache.

A source such as ``s3://models/bge-small-en-v1.5`` names a prefix holding a model
directory (``config.json``, ``model.safetensors``, ``tokenizer.json``...). The first
load downloads every object under it into ``<cache_dir>/objects/<hash of the URI>/``
through a temporary directory renamed into place, so a crash never leaves a partial
model; later loads use the cache without touching the network. Credentials and the
endpoint come from Settings (``s3_*``), as for the payload store.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

OBJECT_SCHEMES = ("s3://",)


@dataclass(frozen=True)
class ObjectStoreConfig:
    endpoint: str = ""
    region: str = ""
    access_key_id: str = ""
    secret_access_key: str = ""

    def __repr__(self) -> str:
        return (
            f"ObjectStoreConfig(endpoint={self.endpoint!r}, region={self.region!r}, "
            "keys=<redacted>)"
        )


def is_object_uri(src: str) -> bool:
    return src.startswith(OBJECT_SCHEMES)


def cached_path(uri: str, cache_dir: Path) -> Path:
    """Where ``uri`` lives once fetched (whether or not it is there yet)."""
    digest = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    name = uri.rstrip("/").rsplit("/", 1)[-1] or "model"
    return cache_dir / "objects" / f"{name}-{digest}"


def fetch(uri: str, cache_dir: Path, config: ObjectStoreConfig) -> Path:
    """The local copy of the model directory at ``uri``, downloading it the first time.

    Raises ``FileNotFoundError`` naming the URI when nothing is stored under it."""
    dest = cached_path(uri, cache_dir)
    if dest.is_dir() and any(dest.iterdir()):
        return dest
    import obstore

    from ..storage.s3 import S3Store

    parts = urlsplit(uri)
    prefix = parts.path.strip("/")
    store = S3Store(
        parts.netloc,
        prefix=prefix,
        endpoint=config.endpoint or None,
        region=config.region or None,
        access_key_id=config.access_key_id or None,
        secret_access_key=config.secret_access_key or None,
    )
    objects = store.objects
    paths = [m["path"] for batch in obstore.list(objects, chunk_size=1000) for m in batch]
    if not paths:
        raise FileNotFoundError(f"no objects under {uri}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        for key in paths:
            target = tmp / key
            if not target.resolve().is_relative_to(tmp.resolve()):
                raise ValueError(f"object key {key!r} under {uri} escapes the model directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = obstore.get(objects, key).bytes()
            target.write_bytes(bytes(data))
        if dest.exists():  # an empty leftover
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
