"""``fleetserve dlq list|replay|purge``: look at and act on the dead-letter stream."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..settings import Settings
from .factory import require_nats, stream_options
from .jetstream import JetStreamQueue


async def run_dlq(settings: Settings, action: str, seqs: list[int] | None, limit: int) -> int:
    require_nats(settings)
    queue = JetStreamQueue(
        settings.nats, stream_options(settings), connect_for=settings.nats_connect_timeout
    )
    await queue.start()
    console = Console()
    try:
        assert queue.dlq is not None
        if action == "list":
            table = Table(title=f"dead letters in {queue.dlq.stream}")
            for col in ("seq", "model", "request", "attempts", "bytes", "reason"):
                table.add_column(col)
            for e in await queue.dlq.list_entries(limit):
                table.add_row(
                    str(e.seq), e.model, e.request_id, str(e.attempts), str(e.size), e.reason
                )
            console.print(table)
        elif action == "replay":
            n = await queue.dlq.replay(seqs, settings.request_timeout)
            console.print(f"replayed {n} message(s) to their work subjects")
        else:
            n = await queue.dlq.purge()
            console.print(f"purged {n} message(s)")
    finally:
        await queue.close()
    return 0
