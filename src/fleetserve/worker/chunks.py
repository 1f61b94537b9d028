"""The chunks of streamed replies, each job's sent in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..queue import Message
from ..wire import Reply
from .batcher import Job

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class Replies(Protocol):
    async def reply(self, msg: Message, reply: Reply) -> None: ...


class Chunks:
    """Sends each chunk after the job's previous one; a settled job's queued chunks are
    dropped. ``spawn`` starts a task in the worker's task group."""

    def __init__(self, queue: Replies, spawn: Callable[[], Spawn]) -> None:
        self.queue = queue
        self._spawn = spawn
        self._tails: dict[int, asyncio.Task[None]] = {}  # last chunk sent, per streamed job

    def schedule(self, job: Job, body: bytes) -> None:
        prev = self._tails.get(id(job))
        self._tails[id(job)] = self._spawn()(self._send(job, body, prev))

    async def sent(self, job: Job) -> None:
        """Wait until the job's chunks so far are sent (or dropped)."""
        tail = self._tails.pop(id(job), None)
        if tail is not None:
            await tail

    async def _send(self, job: Job, body: bytes, prev: asyncio.Task[None] | None) -> None:
        if prev is not None:
            await prev
        if not job.settled:
            await self.queue.reply(job.msg, Reply(body, job.msg.envelope.accept, final=False))
