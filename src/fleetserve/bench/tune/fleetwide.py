"""Background tuning across a fleet of workers: shared profiles and one tune per model.

In distributed mode, workers of one hardware class share what they tune through two
NATS JetStream key-value buckets:

- ``<prefix>-profiles``: one entry per (class, model), the profile file's YAML as the
  tuner wrote it, with who wrote it. Every worker watches the bucket: a profile for
  its class and one of its models is written to its profile directory (atomically)
  and swapped in, so one worker's tune serves every worker of that class, and a
  worker that starts later finds it at once.
- ``<prefix>-tune-leases``: one entry per (class, model) being tuned, created by the
  worker that tunes it (a create fails where the key exists, so of two racing workers
  exactly one wins) and renewed every ``ttl / 3`` seconds. The bucket's ``ttl`` drops
  a lease its holder stopped renewing: a killed worker's lease is free within ``ttl``,
  and another worker takes the tune over. A worker that finds its lease gone (it
  could not renew in time) stops its tune.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...queue.kv_watch import watching

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

log = logging.getLogger("fleetserve.bench.tune")
TTL_S = 15.0
_KEY = re.compile(r"[^-_=.a-zA-Z0-9]")
OnProfile = Callable[[str, str, str], Awaitable[None]]  # model, YAML text, writer


def key(cls: str, model: str) -> str:
    """A valid KV key for (class, model): ``cpu-avx2.org--model``."""
    return _KEY.sub("_", f"{cls}.{model.replace('/', '--')}")


class FleetTuning:
    """This worker's view of the shared profiles and tune leases (see the module)."""

    def __init__(
        self, js: JetStreamContext, prefix: str, cls: str, owner: str, ttl: float = TTL_S
    ) -> None:
        self.js, self.prefix, self.cls, self.owner, self.ttl = js, prefix, cls, owner, ttl
        self.profiles: Any = None
        self.leases: Any = None
        self.held: dict[str, int] = {}  # model -> the revision of our lease

    async def open(self) -> None:
        self.profiles = await _bucket(self.js, f"{self.prefix}-profiles", history=1)
        self.leases = await _bucket(self.js, f"{self.prefix}-tune-leases", ttl=self.ttl)

    # -- leases ---------------------------------------------------------------------
    def holds(self, model: str) -> bool:
        return model in self.held

    async def claim(self, model: str) -> bool:
        """Take the tune lease on ``model``: False if a live worker holds it."""
        from nats.js.errors import KeyWrongLastSequenceError

        if model in self.held:
            return True
        try:
            self.held[model] = await self.leases.create(key(self.cls, model), self._mine())
        except KeyWrongLastSequenceError:
            return False
        log.info("%s: this worker holds the tune lease for %s", model, self.cls)
        return True

    async def holder(self, model: str) -> str:
        """Who holds the lease on ``model`` ("" if nobody)."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.leases.get(key(self.cls, model))
        except KeyNotFoundError:
            return ""
        try:
            return str(json.loads(entry.value or b"{}").get("owner", ""))
        except ValueError:
            return ""

    async def release(self, model: str) -> None:
        rev = self.held.pop(model, None)
        if rev is None:
            return
        with contextlib.suppress(Exception):  # gone already: it expires anyway
            await self.leases.delete(key(self.cls, model), last=rev)

    async def renew_forever(self) -> None:
        """Renew every lease held, every ``ttl / 3``; a lease that cannot be renewed
        (it expired, and maybe another worker took it) is dropped: its tune stops."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            for model, rev in list(self.held.items()):
                try:
                    self.held[model] = await self.leases.update(
                        key(self.cls, model), self._mine(), last=rev
                    )
                except Exception as exc:
                    log.warning("%s: the tune lease was lost (%s); its tune stops", model, exc)
                    self.held.pop(model, None)

    def _mine(self) -> bytes:
        return json.dumps({"owner": self.owner}).encode()

    # -- profiles -------------------------------------------------------------------
    async def publish(self, model: str, text: str) -> None:
        value = {"model": model, "class": self.cls, "by": self.owner, "profile": text}
        await self.profiles.put(key(self.cls, model), json.dumps(value).encode())

    async def get(self, model: str) -> tuple[str, str] | None:
        """The shared profile of ``model``: (its YAML, who tuned it), if there is one."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.profiles.get(key(self.cls, model))
            doc = json.loads(entry.value or b"{}")
            return str(doc["profile"]), str(doc["by"])
        except (KeyNotFoundError, ValueError, KeyError, TypeError):
            return None

    async def watch(self, on_profile: OnProfile) -> None:
        """Call ``on_profile`` for every profile of this class there is, then for each
        one published after (our own included: the caller skips what it has)."""
        keys = f"{key(self.cls, '')}>"  # (ids may hold dots)
        async with watching(self.profiles, keys) as watcher:
            async for entry in watcher:
                if entry is None or not entry.value:  # the end of the initial values, a delete
                    continue
                try:
                    doc = json.loads(entry.value)
                    model, text, by = str(doc["model"]), str(doc["profile"]), str(doc["by"])
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring a shared profile that does not parse: %s", entry.key)
                    continue
                try:
                    await on_profile(model, text, by)
                except Exception as exc:  # one bad profile never stops the watch
                    log.warning("%s: the shared profile from %s was not used: %s", model, by, exc)


async def _bucket(js: JetStreamContext, name: str, **config: Any) -> KeyValue:
    """The bucket ``name``, created if it does not exist."""
    from nats.js.errors import BucketNotFoundError

    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(bucket=name, **config)


__all__ = ["TTL_S", "FleetTuning", "key"]
