"""Hot-added models across a fleet: the ``<prefix>-models`` JetStream key-value bucket.

In distributed mode, a gateway that adds a model (``POST /v1/models``) puts the spec's
fields here under the model's key, and one that removes a model (``DELETE
/v1/models/{id}``) deletes its key. Every gateway and worker watches the bucket: a
gateway's catalog follows it (so that any gateway routes to the model), a worker
builds the model's runner or drains and unloads it (``hot_models``). The watch starts
with the current values, so a process that starts later serves what was added before.
The bundled and ``--catalog`` specs are not here: each process reads those itself.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from .kv_watch import watching

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

log = logging.getLogger("fleetserve.models")
OnPut = Callable[[str, dict[str, object]], Awaitable[None]]  # model, the spec's fields
OnDelete = Callable[[str], Awaitable[object]]  # model
DELETES = ("DEL", "PURGE")


def bucket(prefix: str) -> str:
    return f"{prefix}-models"


def key(model: str) -> str:
    """A valid KV key for any model id (ids may end with '.', which keys may not)."""
    return base64.urlsafe_b64encode(model.encode()).decode().rstrip("=")


def model_of(k: str) -> str | None:
    """The model id of a key (None: not one of ours)."""
    try:
        return base64.urlsafe_b64decode(k + "=" * (-len(k) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class SharedModels:
    """The bucket of one fleet (``prefix``), over JetStream context ``js``."""

    def __init__(self, js: JetStreamContext, prefix: str) -> None:
        self.js = js
        self.name = bucket(prefix)
        self._kv: KeyValue | None = None

    async def open(self) -> SharedModels:
        """The bucket, created if it does not exist."""
        from nats.js.errors import BucketNotFoundError

        try:
            self._kv = await self.js.key_value(self.name)
        except BucketNotFoundError:
            self._kv = await self.js.create_key_value(bucket=self.name, history=1)
        return self

    @property
    def kv(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("the models bucket is not open")
        return self._kv

    async def put(self, model: str, fields: Mapping[str, object]) -> None:
        """``model`` is served across the fleet with the spec ``fields``."""
        await self.kv.put(key(model), json.dumps(dict(fields)).encode())

    async def delete(self, model: str) -> None:
        """``model`` is served no more (bundled or ``--catalog`` ones included)."""
        await self.kv.delete(key(model))

    async def watch(self, on_put: OnPut, on_delete: OnDelete) -> None:
        """Call ``on_put`` for every model there is, then for each change after (this
        process's own too: the callbacks skip what they have). A value that does not
        parse, or a callback that fails, is logged in one line; the watch goes on."""
        async with watching(self.kv) as watcher:
            async for entry in watcher:
                if entry is None:  # the end of the initial values
                    continue
                model = model_of(entry.key)
                if model is None:
                    continue
                try:
                    if entry.operation in DELETES or not entry.value:
                        await on_delete(model)
                        continue
                    fields = json.loads(entry.value)
                    if not isinstance(fields, dict):
                        raise ValueError("the spec is not a mapping")
                    await on_put(model, fields)
                except Exception as exc:  # one bad entry never stops the watch
                    log.warning("%s: the fleet's model change was not applied: %s", model, exc)
