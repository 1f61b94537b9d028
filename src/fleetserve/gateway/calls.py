"""Which adapter a request calls: ``base:tenant/name`` or a native ``adapter`` field,
resolved at the gateway to one immutable version the worker loads.

The worker batches by base model, so an adapter call travels on its base's subject
with the resolved ``tenant/name@version`` in the envelope. A caller sees its own
tenant's adapters and the public ones; any other id is a 404 naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..wire import InvalidInput, Principal

if TYPE_CHECKING:
    from ..lora.registry import AdapterRegistry


class AdapterCalls(Protocol):
    async def resolve(self, principal: Principal, base: str, family: str, text: str) -> str:
        """The resolved id of adapter ``text`` on ``base``; a 400 or 404 naming it."""
        ...


class RegistryCalls:
    """Resolves calls against the adapter registry."""

    def __init__(self, registry: AdapterRegistry) -> None:
        self.registry = registry

    async def resolve(self, principal: Principal, base: str, family: str, text: str) -> str:
        from ..lora.bases import check_takes_adapters

        check_takes_adapters(base, family)
        info = await self.registry.get(principal, text)
        if info.base != base:
            raise InvalidInput(
                f"adapter {info.id} is an adapter of {info.base!r}, not of {base!r}",
                field="adapter",
            )
        return str(info.id)
