"""Adapters declared in the catalog (``adapters:`` in a model spec), registered at start.

Each declaration's ``source`` resolves as a model source does (a local directory, the
Hugging Face cache layout, ``package:``, or ``s3://`` fetched once into the cache).
Registering is idempotent: when a version with the same content hash exists, it is
kept; when the files changed, they become a new version. Two servers starting at once
race harmlessly (the loser of the 409 finds the winner's version). A declaration that
fails (missing files, an invalid adapter) is logged and skipped: the rest still serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from ..catalog import ModelSpec
from ..catalog.adapter_specs import AdapterDecl
from ..catalog.weights import resolve_sources
from ..settings import Settings
from ..wire import (
    PUBLIC_TENANT,
    AdapterNotFound,
    Conflict,
    FleetError,
    Principal,
    Scope,
    parse_adapter_id,
)
from .manifest import AdapterRecord
from .registry import AdapterRegistry
from .validate import CONFIG, WEIGHTS, content_hash, sha256_hex

log = logging.getLogger("fleetserve.lora")
CATALOG = Principal(PUBLIC_TENANT, frozenset({Scope.ADMIN}))  # the catalog writes any tenant
PICKLED = ("adapter_model.bin", "adapter_model.pt", "pytorch_model.bin")
ATTEMPTS = 5


async def register_declared(
    registry: AdapterRegistry, catalog: Iterable[ModelSpec], settings: Settings
) -> list[AdapterRecord]:
    """Register every adapter the catalog's specs declare; returns those registered
    or kept (failures are logged, not raised)."""
    out: list[AdapterRecord] = []
    for spec in catalog:
        for decl in spec.adapters:
            try:
                out.append(await register_one(registry, spec.id, decl, settings))
            except (FleetError, OSError, ValueError) as exc:
                why = exc.message if isinstance(exc, FleetError) else str(exc)
                log.error("adapter %s of %s is not registered: %s", decl.name, spec.id, why)
    return out


async def register_one(
    registry: AdapterRegistry, base: str, decl: AdapterDecl, settings: Settings
) -> AdapterRecord:
    """One declaration: the existing version with the same content, else a new one."""
    path = await asyncio.to_thread(_resolve, decl, settings)
    config, weights, names = await asyncio.to_thread(read_dir, path)
    sha = content_hash(sha256_hex(config), sha256_hex(weights))
    for attempt in range(ATTEMPTS):
        same, newest = await _same(registry, decl.name, sha)
        if same is not None:
            return same
        # the version after the newest, named: of two servers racing, one wins and the
        # other's 409 sends it back to find the winner's; the last try takes any free one
        version = newest + 1 if attempt < ATTEMPTS - 1 else None
        try:
            info = await registry.create(
                CATALOG, decl.name, config, weights, names, base=base, version=version,
                pinned=decl.pinned,
            )  # fmt: skip
        except Conflict:
            await asyncio.sleep(0.05 * 2**attempt)
            continue
        log.info("adapter %s registered for %s (sha256 %s)", info.id, base, info.sha256[:12])
        return info
    raise Conflict(f"adapter {decl.name}: other uploads kept winning; try again")


async def _same(registry: AdapterRegistry, name: str, sha: str) -> tuple[AdapterRecord | None, int]:
    """The newest version with content ``sha`` (if any), and the newest version."""
    try:
        versions = await registry.versions(parse_adapter_id(name))
    except AdapterNotFound:
        return None, 0
    same = next((v for v in reversed(versions) if v.sha256 == sha), None)
    return same, versions[-1].version


def _resolve(decl: AdapterDecl, settings: Settings) -> Path:
    return resolve_sources(decl.name, (decl.source,), settings)


def read_dir(path: Path) -> tuple[bytes, bytes, list[str]]:
    """(config, weights, file names) of a PEFT adapter directory. A pickled
    ``adapter_model.bin`` is not even read: its name is enough for validation to
    refuse it."""
    config = path / CONFIG
    if not config.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG}")
    weights = path / WEIGHTS
    if not weights.is_file():
        weights = next((path / n for n in PICKLED if (path / n).is_file()), weights)
    if not weights.is_file():
        raise FileNotFoundError(f"{path} has no {WEIGHTS}")
    data = weights.read_bytes() if weights.suffix == ".safetensors" else b""
    return config.read_bytes(), data, [CONFIG, weights.name]
