"""Weights on a mapped file, so that a model can sleep (the fleet's host tier).

A torch model that may sleep runs on a copy of its weights in the runtimes' cache
(``cache_dir/mapped/<key>/weights.pt``, written once per weights, head and precision, as
the ONNX exports are): :func:`map_weights` loads that file with ``mmap`` and puts its
tensors in place of the module's own. The process's memory then holds the weights as
pages of that file. To sleep, :meth:`Mapping.release` drops those pages from the
process (``madvise(MADV_DONTNEED)``): its resident set falls by the weights, while the
page cache may keep them. To wake, :meth:`Mapping.populate` faults them back in
(``MADV_POPULATE_READ``): from the page cache that is milliseconds, with nothing read
by Python, parsed or converted. Were the page cache to drop them, they are read from
the file again, as a load from disk would.

The mapping is private and read-only in use: inference never writes a weight. A module
whose weights may change in place (LoRA banks) is not mapped.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..catalog.entries import build_entry
from ..catalog.rules import install_hint

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("mapped weights need torch: " + install_hint("torch")) from exc

from .cache import WEIGHT_SUFFIXES, weights_fingerprint

log = logging.getLogger("fleetserve.runtimes")
FORMAT = 1
FILE = "weights.pt"
MADV_DONTNEED = 4
MADV_WILLNEED = 3
MADV_POPULATE_READ = 22  # Linux 5.14
PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


def mapped_key(path: Path, head: str, precision: str) -> str:
    """Keyed as the ONNX exports are (the weights' fingerprint and the head), with the
    precision the tensors are kept at, the torch that wrote them, and where the weights
    are (the directory and its files' inodes): a copy served for the wrong weights is a
    wrong answer, and two checkpoints of one shape written within one clock tick have
    the same names, sizes and mtimes."""
    h = hashlib.sha256(f"format={FORMAT};torch={torch.__version__};head={head}".encode())
    h.update(f";precision={precision};".encode())
    h.update(weights_fingerprint(path))
    where = Path(path).resolve()
    h.update(f";{where}".encode())
    for f in sorted(where.iterdir()):
        if f.suffix in WEIGHT_SUFFIXES and f.is_file():
            h.update(f";{f.name}:{f.stat().st_ino}".encode())
    return h.hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Mapping:
    """Where a model's weights are mapped in this process: one range per file."""

    file: Path
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def release(self) -> None:
        """Drop the weights' pages from the process (the page cache may keep them)."""
        _advise(self.start, self.nbytes, MADV_DONTNEED)

    def populate(self) -> None:
        """Fault the weights' pages back in, before the next batch needs them."""
        try:
            _advise(self.start, self.nbytes, MADV_POPULATE_READ)
        except OSError as exc:  # an older kernel: read ahead, then touch each page
            if exc.errno != errno.EINVAL:
                raise
            _advise(self.start, self.nbytes, MADV_WILLNEED)
            view = (ctypes.c_char * self.nbytes).from_address(self.start)
            bytes(memoryview(view)[::PAGE])


def _advise(start: int, length: int, advice: int) -> None:
    if _libc.madvise(start, length, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise({advice}) failed: {os.strerror(err)}")


def map_weights(module: torch.nn.Module, entry: Path) -> Mapping:
    """Put ``module``'s parameters and persistent buffers on a mapped copy in ``entry``
    (a cache directory: written now unless a complete copy is there; a corrupt or
    truncated one is written again). The module's own tensors are let go."""

    def complete(d: Path) -> bool:
        return (d / FILE).is_file() and (d / "size").is_file()

    def build(tmp: Path) -> None:
        torch.save(module.state_dict(), tmp / FILE)
        (tmp / "size").write_text(str((tmp / FILE).stat().st_size))

    entry = build_entry(entry, complete, build)
    file = entry / FILE
    try:
        if int((entry / "size").read_text()) != file.stat().st_size:
            raise ValueError("its size is not the size it was written at")
        state = torch.load(file, mmap=True, weights_only=True, map_location="cpu")
        module.load_state_dict(state, assign=True)
    except Exception as exc:  # torn, truncated or from elsewhere: written once more
        log.warning("mapped weights %s are unreadable (%s); writing them again", file, exc)
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()
        entry = build_entry(entry, complete, build)
        state = torch.load(file, mmap=True, weights_only=True, map_location="cpu")
        module.load_state_dict(state, assign=True)
    ptrs = [t.untyped_storage().data_ptr() for t in state.values() if t.numel()]
    del state
    return _range_of(file, min(ptrs))


def _range_of(file: Path, inside: int) -> Mapping:
    """The mapping of ``file`` that holds address ``inside`` (``/proc/self/maps``)."""
    name = str(file.resolve())
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[5].strip() != name:
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= inside < hi:
                return Mapping(file, lo, hi)
    raise RuntimeError(f"{file} is not mapped in this process")


__all__ = ["Mapping", "map_weights", "mapped_key"]
