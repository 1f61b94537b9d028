"""A job that names a LoRA adapter waits here until the adapter is hot, off the hot
path; then it joins its runner's batches. A failure to make it hot answers that
request only (a 400 for a family that takes none, a 404 for a deleted adapter)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..logs.context import for_request
from ..wire import FleetError, InternalError

if TYPE_CHECKING:
    from ..catalog import ModelSpec
    from .batcher import Job
    from .lora_hosting import AdapterHosting

log = logging.getLogger("fleetserve.worker")


class Heats(Protocol):
    """What ``submit_when_hot`` needs of a runner (every ``Runner`` has it): a protocol
    here, so that this module, a base of the runners, does not import them."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def adapters(self) -> AdapterHosting: ...

    def submit(self, job: Job) -> None: ...


class Heating(Protocol):
    """The worker's ledger, as a job whose adapter loads sees it."""

    def heated(self, job: Job) -> None: ...

    async def fail(self, job: Job, err: FleetError) -> None: ...


async def submit_when_hot(runner: Heats, job: Job, key: str, ledger: Heating) -> None:
    """Submit ``job`` once its adapter is hot; a failure (a 400 for a family that
    takes none, a 404 for a deleted adapter) answers this request only. The ledger
    hears when it no longer waits here (its tokens count in the pull budget till then)."""
    try:
        runner.adapters.takes(key)
        with for_request(job.msg.envelope.request_id):  # a store's log line names it
            await runner.adapters.heat(key)
    except Exception as exc:
        ledger.heated(job)
        await ledger.fail(job, as_fleet_error(exc, key, runner.spec.id))
        return
    ledger.heated(job)
    runner.submit(job)


def as_fleet_error(exc: Exception, key: str, model: str) -> FleetError:
    """What a request for adapter ``key`` is answered when making it hot failed."""
    if isinstance(exc, FleetError):
        return exc
    log.exception("adapter %s failed to load for %s", key, model, exc_info=exc)
    return InternalError(f"adapter failed to load: {type(exc).__name__}")
