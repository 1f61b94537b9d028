"""Affinity's choice of what to pull, on the in-process queue and fake models."""

from __future__ import annotations

from fleetserve.fleet.manager import Fleet
from fleetserve.fleet.policy import GDSF
from fleetserve.queue import MemoryQueue
from fleetserve.worker.affinity import Affinity

from ..fleet.test_manager import Clock, FakeModel
from ..queue.envelopes import env


async def setup(peers: set[str], waited: dict[str, float]) -> tuple[MemoryQueue, Affinity]:
    c = Clock()
    fleet = Fleet(100 << 20, GDSF(), clock=c, room_wait=0.0)
    for m in ("hot", "cold", "elsewhere"):
        fleet.add(FakeModel(c, m, 10))
    await fleet.acquire("hot", timeout=1.0)
    fleet.release("hot")
    queue = MemoryQueue()
    await queue.start()
    for m in ("hot", "cold", "elsewhere"):
        await queue.publish(env(m), b"{}")
    return queue, Affinity(fleet, 2.0, peers.__contains__, lambda m: waited.get(m, 0.0))


async def pulled(queue: MemoryQueue, aff: Affinity, idle: bool) -> set[str]:
    msgs = await aff.pull(queue, ["hot", "cold", "elsewhere"], 100, 0.01, lambda: idle)
    return {m.envelope.model for m in msgs}


async def test_the_models_held_here_come_first() -> None:
    queue, aff = await setup({"elsewhere"}, {})
    assert await pulled(queue, aff, idle=True) == {"hot"}
    # then, idle: the cold model nobody holds, not the one another worker serves
    assert await pulled(queue, aff, idle=True) == {"cold"}
    assert await pulled(queue, aff, idle=True) == set()
    await queue.close()


async def test_a_busy_worker_takes_no_cold_model_unless_it_waited_too_long() -> None:
    queue, aff = await setup({"elsewhere"}, {"elsewhere": 3.0})
    got = await pulled(queue, aff, idle=False)
    assert got == {"hot", "elsewhere"}  # its holder does not keep up: another copy pays
    assert await pulled(queue, aff, idle=False) == set()  # "cold" waits for idleness
    await queue.close()
