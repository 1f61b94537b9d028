"""Third-party progress bars off, their loggers through ours, their noise dropped.

transformers, huggingface_hub and datasets draw tqdm bars (one per model load,
interleaved across processes) and transformers and datasets keep handlers of their
own. Importing them at start would cost seconds, so an import hook configures each
library right after its first import, through its own API:

- ``huggingface_hub.utils.disable_progress_bars()``;
- ``transformers.utils.logging.disable_progress_bar()``, its default handler removed
  and propagation on (so its warnings come out in our style);
- ``datasets.disable_progress_bars()`` and propagation on.

A library imported already is configured at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

log = logging.getLogger("fleetserve.logs")


def _huggingface_hub() -> None:
    hub: ModuleType = importlib.import_module("huggingface_hub.utils")
    hub.disable_progress_bars()


def _transformers() -> None:
    _huggingface_hub()  # transformers reads it for its own bars at import, too
    tlog: ModuleType = importlib.import_module("transformers.utils.logging")
    tlog.disable_progress_bar()
    tlog.disable_default_handler()
    tlog.enable_propagation()


def _datasets() -> None:
    datasets: ModuleType = importlib.import_module("datasets")
    dlog: ModuleType = importlib.import_module("datasets.utils.logging")
    datasets.disable_progress_bars()
    dlog.enable_propagation()


CONFIGURE: dict[str, Callable[[], None]] = {
    "huggingface_hub": _huggingface_hub,
    "transformers": _transformers,
    "datasets": _datasets,
}
_done: set[str] = set()
_lock = threading.RLock()


def configure(name: str) -> None:
    """Configure library ``name`` once (it is imported by now)."""
    with _lock:
        if name in _done:
            return
        _done.add(name)
    try:
        CONFIGURE[name]()
    except Exception as exc:  # an API that moved: the bars show, nothing breaks
        log.debug("could not quiet %s: %s", name, exc)


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader, then configures the library."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        configure(self.name)

    def __getattr__(self, attr: str) -> object:  # get_resource_reader, is_package, ...
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the watched top-level packages through the other finders, wrapping their
    loader."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in CONFIGURE or fullname in _done or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


_FINDER = _Finder()

# what libraries say that means nothing to whoever runs the server: (the logger's
# prefix, the start of the message). transformers warns about a config key that a
# checkpoint carries and serving never reads.
NOISE: tuple[tuple[str, str], ...] = (
    ("transformers", "`loss_type=None` was set in the config but it is unrecognized"),
)


class LibraryNoise(logging.Filter):
    """Drops the ``NOISE`` records (on our handler: a logger's own filters do not see
    its children's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("fleetserve"):
            return True
        for prefix, start in NOISE:
            if record.name.startswith(prefix) and str(record.msg).startswith(start):
                return False
        return True


def install_quieting() -> None:
    """Configure the watched libraries already imported; watch for the others."""
    for name in CONFIGURE:
        if name in sys.modules:
            configure(name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


__all__ = ["CONFIGURE", "NOISE", "LibraryNoise", "configure", "install_quieting"]
