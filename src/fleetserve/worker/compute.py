"""One compute thread per worker process, shared by every model on the device.

torch's CPU kernels run in OpenMP parallel regions, and each OS thread that opens one
keeps its own OpenMP thread pool for as long as it lives. With several live pools on
few cores, libgomp stops spinning between regions (it counts more managed threads than
CPUs), so every small kernel pays a wake-up: on this 2-core machine a 1x576x1536
matmul took 130 us from a second thread against 46 us from one (decode steps of a
small LM are made of such kernels). Running every warmup, forward pass and generation
step on this one thread keeps a single pool. Models on one device share its cores
anyway, so nothing is lost by serializing their kernels. Loads run on a thread of
their own that ends with the load (``worker.runner``), taking its pool with it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def compute_executor() -> ThreadPoolExecutor:
    """The process's compute thread (created on first use, never shut down)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="compute")
        return _executor
