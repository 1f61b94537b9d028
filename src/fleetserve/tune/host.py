"""The embedded server as the background tuner's host (see :class:`.background.Host`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog.profiles import Choice

if TYPE_CHECKING:
    from ..server import EmbeddedServer


class ServerHost:
    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server

    def choice(self, model: str) -> Choice:
        return self.server.choices[model]

    def reread(self, model: str) -> Choice:
        from ..assembly import build_profiles

        return build_profiles(self.server.settings).choose(self.server.catalog.get(model))

    def loaded(self, model: str) -> bool:
        return self.server.runners[model].loaded

    def busy(self) -> bool:
        srv = self.server
        if not srv.worker.idle:
            return True
        return any(srv.queue.depth(m) or srv.fleet.info(m)["inflight"] for m in srv.runners)

    def weights(self, model: str) -> Path:
        from ..assembly import weights_path

        return weights_path(self.server.catalog.get(model), self.server.settings)

    async def swap(self, model: str, choice: Choice) -> tuple[bool, str]:
        from ..assembly import build_runner
        from ..worker.swap import swap_profile

        srv = self.server
        spec = srv.catalog.get(model)
        new = build_runner(spec, srv.settings, srv.metrics, choice)
        result = await swap_profile(srv.fleet, srv.runners[model], new)
        if result.swapped:
            srv.choices[model] = choice
        return result.swapped, result.reason


__all__ = ["ServerHost"]
