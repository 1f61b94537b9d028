"""What crosses the training child's pipe when it fails: the error's type, message and
field, and the parent's rebuilt exception; and whether a failure was the child running
out of memory (:class:`OutOfMemory`)."""

from __future__ import annotations

import errno
from typing import Any

from ...wire import ERROR_TYPES, FleetError
from .checkpoint import CheckpointMismatch

# what a failed allocation says, in Python, torch (c10), glibc's loader and threads
_NO_MEMORY = ("can't allocate memory", "cannot allocate memory", "std::bad_alloc",
              "out of memory", "failed to map segment", "can't start new thread")  # fmt: skip


class OutOfMemory(RuntimeError):
    """The training process ran out of memory: over ``train_memory_limit``, or killed
    (SIGKILL) as the kernel's out-of-memory killer does."""


def describe_error(exc: BaseException) -> dict[str, object]:
    """What crosses the pipe of an exception: its type's name, message and field (of
    one that is running out of memory: ``OutOfMemory`` and the first line of it)."""
    message = exc.message if isinstance(exc, FleetError) else str(exc)
    if is_out_of_memory(exc):
        said = message.strip().splitlines()[0][:200] if message.strip() else type(exc).__name__
        return {"type": OutOfMemory.__name__, "message": said, "field": None, "fleet": False}
    return {
        "type": type(exc).__name__,
        "message": message,
        "field": exc.field if isinstance(exc, FleetError) else None,
        "fleet": isinstance(exc, FleetError),
    }


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a failed allocation."""
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain, a few links deep
        if seen is None:
            return False
        if isinstance(seen, MemoryError):
            return True
        if isinstance(seen, OSError) and seen.errno == errno.ENOMEM:
            return True
        if isinstance(seen, RuntimeError | OSError | ImportError):
            text = str(seen).lower()
            if any(s in text for s in _NO_MEMORY):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def limit_text(memory_limit: int) -> str:
    """The limit as a message gives it."""
    if memory_limit <= 0:
        return "no train_memory_limit is set: the machine's"
    size = (f"{memory_limit / (1 << 30):.1f} GiB" if memory_limit >= 1 << 30
            else f"{memory_limit / (1 << 20):.0f} MiB")  # fmt: skip
    return f"limit {size}, train_memory_limit"


# the fleet errors by class name (what crosses the pipe): wire's, and their base
_KINDS: list[type[FleetError]] = [FleetError, *ERROR_TYPES.values()]
_FLEET_ERRORS = {cls.__name__: cls for cls in _KINDS}


def rebuild_error(d: dict[str, Any], memory_limit: int = 0) -> Exception:
    """The parent's side of :func:`describe_error`."""
    if d["type"] == OutOfMemory.__name__:
        return OutOfMemory(f"the training process ran out of memory ({limit_text(memory_limit)})"
                           f": {d['message']}")  # fmt: skip
    if d["type"] == CheckpointMismatch.__name__:
        return CheckpointMismatch(d["message"])
    kind = _FLEET_ERRORS.get(d["type"]) if d.get("fleet") else None
    if kind is not None:
        return kind(d["message"], field=d.get("field"))
    return RuntimeError(f"{d['type']}: {d['message']}" if d["message"] else d["type"])
