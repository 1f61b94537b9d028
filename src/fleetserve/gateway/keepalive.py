"""X-Keep-Alive within limits: how long a request may keep its model resident.

- A request's ``X-Keep-Alive`` is cut to the cap: the ``max_keep_alive`` setting, or the
  model spec's ``max_keep_alive`` where that is lower.
- One tenant keeps at most ``max_kept_alive_per_tenant`` models alive at once (as this
  gateway counts them, each until its request's deadline plus the keep-alive granted:
  never less than a worker holds it). A request for one more gets no keep-alive of its
  own; the model's spec ``keep_alive`` still holds. Each request's hold is its own: a
  request that never reached a worker (its publish failed) takes back its hold alone,
  and one that did keeps it (the worker applied the keep-alive, whatever came after).
- The reply says what was applied (``X-Keep-Alive-Applied``, seconds) and the cap
  (``X-Keep-Alive-Max``).
- An admin ends a model's keep-alive at once: ``DELETE /v1/models/{id}/keep-alive``
  (``fleetserve models release ID``); its holds leave every tenant's count.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from ..catalog import Catalog
from ..wire import InvalidInput, Unavailable

PREFIX, SUFFIX = "/v1/models/", "/keep-alive"


@dataclass(frozen=True)
class Grant:
    """What one request asked, what it got, and the cap it was held to."""

    tenant: str
    model: str
    asked: float
    applied: float
    cap: float
    hold: int = 0  # this request's own hold on the model (0: none), for undo

    @property
    def keep_alive(self) -> float | None:
        """For the envelope: ``None`` (the spec's own) when refused, else the seconds."""
        return None if self.asked > 0 and self.applied == 0 else self.applied

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-keep-alive-applied", f"{self.applied:g}".encode()),
            (b"x-keep-alive-max", f"{self.cap:g}".encode()),
        ]


@dataclass
class _Hold:
    """One tenant's hold on one model: until when the requests that reached a worker
    keep it, and the holds of those not yet published (each its own, by number)."""

    until: float = 0.0
    pending: dict[int, float] = field(default_factory=dict)

    def end(self) -> float:
        return max(self.until, *self.pending.values()) if self.pending else self.until

    def live(self, now: float) -> _Hold | None:
        pending = {n: until for n, until in self.pending.items() if until > now}
        return _Hold(self.until, pending) if self.until > now or pending else None


class KeepAlives:
    """The caps and each tenant's kept-alive models (one gateway's view)."""

    def __init__(
        self, max_keep_alive: float, per_tenant: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_keep_alive = max_keep_alive
        self.per_tenant = per_tenant  # 0: no limit
        self.clock = clock
        self._holds: dict[str, dict[str, _Hold]] = {}  # tenant -> model -> its hold
        self._next = 0  # the last pending hold's number
        self._sweep_at = 1024  # tenants known before the expired ones are swept

    def cap(self, spec_cap: float | None) -> float:
        """The longest keep-alive a request for a model with ``spec_cap`` may get."""
        return self.max_keep_alive if spec_cap is None else min(spec_cap, self.max_keep_alive)

    def grant(
        self, tenant: str, model: str, asked: float, spec_cap: float | None, timeout: float
    ) -> Grant:
        """What ``tenant``'s request for ``model`` gets of the ``asked`` seconds;
        ``timeout`` is the request's (its keep-alive counts from its last use). The hold
        is pending until :meth:`kept` (published) or :meth:`undo` (never published)."""
        cap = self.cap(spec_cap)
        applied = min(asked, cap)
        now = self.clock()
        holds = self._live(tenant, now)
        full = self.per_tenant and len(holds) >= self.per_tenant
        if applied > 0 and full and model not in holds:
            applied = 0.0  # this tenant keeps its share alive already
        if applied == 0:
            return Grant(tenant, model, asked, applied, cap)
        self._next += 1
        holds.setdefault(model, _Hold()).pending[self._next] = now + timeout + applied
        self._holds[tenant] = holds
        if len(self._holds) > self._sweep_at:
            self._sweep(now)
        return Grant(tenant, model, asked, applied, cap, self._next)

    def kept(self, grant: Grant) -> None:
        """The request was published: a worker keeps the model alive for it, whatever
        its outcome (a timeout or hang-up after this does not undo it)."""
        hold = self._holds.get(grant.tenant, {}).get(grant.model)
        if hold is not None and grant.hold in hold.pending:
            hold.until = max(hold.until, hold.pending.pop(grant.hold))

    def undo(self, grant: Grant) -> None:
        """The request never reached a worker: its own pending hold is taken back (the
        holds of the tenant's other requests on the model stay)."""
        holds = self._holds.get(grant.tenant)
        hold = None if holds is None else holds.get(grant.model)
        if holds is None or hold is None or hold.pending.pop(grant.hold, None) is None:
            return
        if hold.live(self.clock()) is None:
            holds.pop(grant.model, None)
        if not holds:
            self._holds.pop(grant.tenant, None)

    def release(self, model: str) -> None:
        """An admin released ``model``: no tenant holds it any longer."""
        for tenant in list(self._holds):
            holds = self._holds[tenant]
            holds.pop(model, None)
            if not holds:
                del self._holds[tenant]

    async def release_route(
        self, model: str, catalog: Catalog, hook: Callable[[str], Awaitable[float]] | None
    ) -> dict[str, Any]:
        """``DELETE /v1/models/{id}/keep-alive`` (the caller checked the admin scope):
        ``hook`` ends ``model``'s keep-alive where it lives; the seconds it had left."""
        if not model:
            raise InvalidInput("the model id in the path is empty", field="path")
        catalog.get(model)  # an unknown model is a 404 naming the served ones
        if hook is None:
            raise Unavailable("this gateway cannot reach the fleet that keeps models alive")
        left = await hook(model)
        self.release(model)
        return {"id": model, "object": "model.keep_alive", "released": left > 0, "left_s": left}

    def held(self, tenant: str) -> dict[str, float]:
        """``tenant``'s kept-alive models and the seconds each is held yet."""
        now = self.clock()
        return {m: h.end() - now for m, h in self._live(tenant, now).items()}

    def _live(self, tenant: str, now: float) -> dict[str, _Hold]:
        """``tenant``'s holds that have not run out, per model."""
        live = {}
        for m, hold in self._holds.get(tenant, {}).items():
            left = hold.live(now)
            if left is not None:
                live[m] = left
        return live

    def _sweep(self, now: float) -> None:
        for tenant in list(self._holds):
            live = self._live(tenant, now)
            if live:
                self._holds[tenant] = live
            else:
                del self._holds[tenant]
        self._sweep_at = max(1024, 2 * len(self._holds))


def released_model(method: str, path: str) -> str | None:
    """The model id of ``DELETE /v1/models/{id}/keep-alive`` (ids may hold '/')."""
    if method != "DELETE" or not path.startswith(PREFIX) or not path.endswith(SUFFIX):
        return None
    return unquote(path[len(PREFIX) : -len(SUFFIX)])


__all__ = ["PREFIX", "SUFFIX", "Grant", "KeepAlives", "released_model"]
