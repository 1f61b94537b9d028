"""Where a model's or an adapter's weights are on this machine, from the settings: the
Hugging Face and fleetserve caches and the object-store credentials. Every process
that loads or inspects weights (assembly, the LoRA side, the tuner, fine-tuning) asks
here, below all of them."""

from __future__ import annotations

from pathlib import Path

from ..settings import Settings
from .complete import Locate, locator
from .fetch import ObjectStoreConfig
from .sources import resolve
from .spec import ModelSpec


def weights_path(spec: ModelSpec, settings: Settings) -> Path:
    """Where ``spec``'s weights are on this machine: fetched or converted once if need
    be; a ``ModelNotFound`` listing every place looked in if they are nowhere."""
    return resolve_sources(spec.id, spec.sources, settings)


def local_weights(settings: Settings) -> Locate:
    """Where a spec's weights already are on this machine (the settings' caches),
    without fetching or converting: for the catalog to complete specs from them."""
    return locator(Path(settings.hf_cache).expanduser(), Path(settings.cache_dir).expanduser())


def resolve_sources(name: str, sources: tuple[str, ...], settings: Settings) -> Path:
    """The first of ``sources`` on this machine (fetched or converted once), with the
    settings' caches and object-store credentials."""
    return resolve(
        name,
        sources,
        Path(settings.hf_cache).expanduser(),
        cache_dir=Path(settings.cache_dir).expanduser(),
        objects=ObjectStoreConfig(
            settings.s3_endpoint,
            settings.s3_region,
            settings.s3_access_key_id,
            settings.s3_secret_access_key,
        ),
    )
