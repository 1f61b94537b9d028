"""Chunks sent pipelined (a bounded number in flight) and joined in input order, with
one progress bar over the items. A failed chunk fails the call with its error (its item
index made the whole list's); the chunks not yet answered are dropped, never returned
as a partial result."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ..wire import FleetError
from ._chunks import Span, shifted
from ._common import Call, Job

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

T = TypeVar("T")


class Bar:
    """One rich progress bar over a call's items: none (``False``), its own on stderr
    (``True``), or a task on the caller's ``rich.progress.Progress``, which the caller
    starts and stops."""

    def __init__(self, progress: bool | Progress, total: int, label: str) -> None:
        self._own: Progress | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if progress is True:
            from rich.console import Console
            from rich.progress import MofNCompleteColumn
            from rich.progress import Progress as RichProgress

            columns = (*RichProgress.get_default_columns(), MofNCompleteColumn())
            self._own = self._progress = RichProgress(*columns, console=Console(stderr=True))
        elif progress is not False:
            self._progress = progress
        if self._progress is not None:
            self._task = self._progress.add_task(label, total=total)

    def advance(self, items: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, items)

    def __enter__(self) -> Self:
        if self._own is not None:
            self._own.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._own is not None:
            self._own.stop()


def _size(span: Span) -> int:
    return span[1] - span[0]


def _joined(job: Job[T], spans: list[Span], results: dict[int, T]) -> T:
    return job.merge([results[i] for i in range(len(spans))], [s[0] for s in spans])


def _one(send: Callable[[Call[T]], T], job: Job[T], span: Span) -> T:
    return send(job.chunk(span))  # the body is built when its turn comes


def in_threads(
    job: Job[T], spans: list[Span], send: Callable[[Call[T]], T], width: int, bar: Bar
) -> T:
    """The sync client's pipeline: ``width`` threads share its connection pool, and a
    chunk is sent when an earlier one has been answered. On a failure no more are
    sent; the replies of those in flight (``width - 1`` at most) are dropped."""
    results: dict[int, T] = {}
    running: dict[Future[T], int] = {}
    waiting = iter(range(len(spans)))
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="fleetserve-chunk")
    try:
        while True:
            for i in itertools.islice(waiting, width - len(running)):
                running[pool.submit(_one, send, job, spans[i])] = i
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                try:
                    results[i] = future.result()
                except FleetError as err:
                    raise shifted(err, job.field, spans[i][0]) from None
                bar.advance(_size(spans[i]))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return _joined(job, spans, results)


async def in_tasks(
    job: Job[T],
    spans: list[Span],
    send: Callable[[Call[T]], Coroutine[Any, Any, T]],
    width: int,
    bar: Bar,
) -> T:
    """The async client's pipeline: ``width`` tasks at a time. On a failure (or when
    the call is cancelled) the chunks in flight are cancelled, which closes their
    connections, so the server drops their work."""
    results: dict[int, T] = {}
    running: dict[asyncio.Task[T], int] = {}
    waiting = iter(range(len(spans)))
    try:
        while True:
            for i in itertools.islice(waiting, width - len(running)):
                running[asyncio.create_task(send(job.chunk(spans[i])))] = i
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = running.pop(task)
                try:
                    results[i] = task.result()
                except FleetError as err:
                    raise shifted(err, job.field, spans[i][0]) from None
                bar.advance(_size(spans[i]))
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return _joined(job, spans, results)
