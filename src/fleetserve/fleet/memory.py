"""Measure memory: this process's resident set and peak, what it may use, free device
memory and the default budget. The activation peak of one full batch is measured
through a family and a workload, so it lives above the worker, in `tune/activation.py`.

Light at import: torch is imported only inside the CUDA functions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ..catalog.hardware import memory_limit, memory_source

DEFAULT_FRACTION = 0.7
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_FORMS = "bytes (123456), a size (512MiB, 2GiB, 800M, 1.5G) or a percent (60%)"


def _status_bytes(key: str, pid: int | str = "self") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rss_bytes() -> int:
    """This process's resident set (VmRSS), 0 where /proc is absent."""
    return _status_bytes("VmRSS")


def peak_bytes() -> int:
    """This process's peak resident set (VmHWM) since start or the last reset_peak()."""
    return _status_bytes("VmHWM")


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets the peak resident set (VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")
    except OSError:
        pass


def rss_of(pid: int) -> int:
    """Another process's resident set, 0 when it is gone or unreadable."""
    return _status_bytes("VmRSS", pid)


_malloc_trim: Callable[[int], int] | None = None
_trim_looked_up = False
_frozen_in: int | None = None  # the pid that froze its imports


def freeze_imports() -> None:
    """Leave every object alive now out of all later garbage collections
    (``gc.freeze``), once per process: call it after the imports and before any model
    loads. torch and transformers alone are some 350,000 objects, and a full
    collection walked them all: 0.19 s each on a 2-core AMD EPYC, paid by every
    :func:`trim` (each eviction and each activation-peak measurement) and by the
    interpreter's own full collections. Frozen, it takes well under a millisecond.
    Only what lives now is frozen: a model loaded later is collected as before
    (something frozen is never collected, so a model frozen with a reference cycle
    would keep its memory after its eviction). The stack calls it before it builds
    any runner; the object building the stack is frozen with the rest, so in a process
    that builds several servers in turn (the tests), what the first one holds when it
    is dropped may stay."""
    global _frozen_in
    if _frozen_in == os.getpid():
        return
    _frozen_in = os.getpid()
    gc.collect()  # garbage is not frozen
    gc.freeze()


def trim() -> None:
    """Collect garbage, then hand the heap's free pages back to the OS (glibc
    ``malloc_trim``; elsewhere only the collection)."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc ``malloc_trim``; elsewhere
    nothing), without a collection: what a measurement needs, and no finalizer of an
    unrelated object runs at that moment."""
    global _malloc_trim, _trim_looked_up
    if not _trim_looked_up:
        _trim_looked_up = True
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = libc.malloc_trim  # absent on musl
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
                _malloc_trim = fn
            except (OSError, AttributeError):
                _malloc_trim = None
    if _malloc_trim is not None:
        _malloc_trim(0)


def process_limit_bytes(root: Path = Path("/")) -> int:
    """Bytes this process may use: the cgroup limit if there is one, else physical RAM."""
    return memory_limit(root)


def cuda_free_bytes(device: str) -> int:
    """Free memory on a CUDA device now (never called on CPU)."""
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def cuda_reserved_bytes(device: str) -> int:
    """What torch's allocator holds on a CUDA device now (never called on CPU)."""
    import torch

    return int(torch.cuda.memory_reserved(torch.device(device)))


def actual_bytes(device: str) -> Callable[[], int]:
    """What a fleet on ``device`` is checked against (``fleet/drift.py``): the
    device's memory that torch holds on CUDA, else this process's resident set."""
    if device.startswith("cuda"):
        return lambda: cuda_reserved_bytes(device)
    return rss_bytes


def default_budget(device: str, *, root: Path = Path("/")) -> tuple[int, str]:
    """The budget when none is set, and a line saying what it is a fraction of."""
    pct = f"{DEFAULT_FRACTION:.0%}"
    if device.startswith("cuda"):
        free = cuda_free_bytes(device)
        return int(free * DEFAULT_FRACTION), f"{pct} of free memory on {device} ({_gib(free)})"
    limit, source = memory_source(root)
    what = "the cgroup limit" if source == "cgroup" else "physical RAM"
    return int(limit * DEFAULT_FRACTION), f"{pct} of {what} ({_gib(limit)})"


def parse_size(text: str, *, limit: int) -> int:
    """Bytes from ``--memory-budget``: "" is 0 (the default), else bytes, a size with a
    binary unit (K, M, G, T; with or without i and B: 512MiB, 2GiB, 1.5G, 800M), or a
    percent of ``limit`` (60%)."""
    raw = text.strip()
    if not raw:
        return 0
    n: float
    if raw.endswith("%"):
        try:
            pct = float(raw[:-1])
        except ValueError:
            pct = math.nan
        n = pct / 100 * limit if 0 < pct <= 100 else math.nan
    else:
        m = _SIZE.fullmatch(raw)
        n = float(m[1]) * _UNITS[m[2].lower()] if m else math.nan
    if not math.isfinite(n) or int(n) <= 0:
        raise ValueError(f"--memory-budget: cannot use {text!r}; give {_FORMS}, above 0")
    return int(n)


OFF = ("", "0", "off", "none")  # a size limit that is not set


def parse_limit(text: str, flag: str, *, limit: int, forms: str) -> int:
    """A size limit in bytes (a setting where 0 means none): ``OFF`` is 0, else
    :func:`parse_size` (a percent is of ``limit``); a ``ValueError`` naming ``flag`` and
    the ``forms`` it takes for anything else."""
    raw = text.strip()
    if raw.lower() in OFF:
        return 0
    try:
        return parse_size(raw, limit=limit)
    except ValueError:
        raise ValueError(f"{flag}: cannot use {raw!r}; give {forms}") from None


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".onnx", ".xml", ".gguf")
PRECISION_SHARE = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5, "int8": 0.25}


def weights_estimate(path: Path, precision: str) -> int:
    """A model's footprint before its first load: its weight files on disk (stored as
    fp32, as most small open models are), scaled to the precision it will run at."""
    files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
    weights = [f for f in files if f.name.endswith(WEIGHT_FILES)] or files
    size = sum(f.stat().st_size for f in weights)
    return int(size * PRECISION_SHARE.get(precision, 1.0))


def budget_limit(device: str) -> int:
    """What a percent of ``--memory-budget`` is of: free device memory on CUDA, else
    what this process may use."""
    return cuda_free_bytes(device) if device.startswith("cuda") else process_limit_bytes()


def mib(n: int) -> str:
    """Bytes in MiB, the one unit of the tables: "123.4 MiB"."""
    return f"{n / 2**20:.1f} MiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


__all__ = [
    "DEFAULT_FRACTION",
    "actual_bytes",
    "cuda_free_bytes",
    "cuda_reserved_bytes",
    "default_budget",
    "mib",
    "parse_limit",
    "parse_size",
    "peak_bytes",
    "process_limit_bytes",
    "reset_peak",
    "rss_bytes",
    "rss_of",
    "trim",
    "trim_heap",
]
