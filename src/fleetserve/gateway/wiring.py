"""What a process passes into its Gateway, in a few typed parts.

:class:`Hooks` are what the gateway asks of the process that runs it (health, the
model list, keep-alive releases, its lifespan); :class:`Routes` the optional routes
the process mounts (adapters, fine-tuning); :class:`Pages` what the gateway needs of
the dashboard, which the process builds (``gateway_setup.build_dashboard``): the
dashboard imports this package's HTTP helpers, so the gateway does not import it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..catalog.spec import Profile
from .auth import PrincipalApp
from .calls import AdapterCalls
from .http import Receive, Scope, Send

if TYPE_CHECKING:
    from .finetune import FineTuneRoutes
    from .model_routes import ModelAdmin

Hook = Callable[[], Awaitable[None]]


def _alive() -> bool:
    return True


def _default_cost(_model: str) -> int:
    return Profile.interactive_cost


@dataclass(frozen=True, slots=True)
class Hooks:
    """The process's answers: ``ready`` for ``/readyz`` and admission (``not_ready``:
    what else ``/readyz`` waits for, and says); ``alive`` for ``/healthz`` (False: a
    stage crashed); ``models_info`` for ``/v1/models`` (None: the catalog) and
    ``memory`` beside it (the fleet's budgets and use, where the fleet is in-process);
    each model's interactive threshold in predicted tokens (its profile's);
    ``release_keep_alive`` ends a model's keep-alive where it lives (None: not here);
    ``on_startup`` and ``on_shutdown`` run at the ASGI lifespan's."""

    ready: Callable[[], bool]
    alive: Callable[[], bool] = _alive
    not_ready: Callable[[], str] | None = None  # why /readyz is 503, said in its body
    ready_in: Callable[[], float | None] | None = None  # seconds to ready, if estimated
    models_info: Callable[[], list[dict[str, Any]]] | None = None
    memory: Callable[[], dict[str, int]] | None = None
    interactive_cost: Callable[[str], int] = _default_cost
    release_keep_alive: Callable[[str], Awaitable[float]] | None = None
    on_startup: Hook | None = None
    on_shutdown: Hook | None = None


@dataclass(frozen=True, slots=True)
class Routes:
    """The optional routes: ``adapters`` serves ``/v1/adapters[/...]`` and ``finetune``
    ``/v1/files`` and ``/v1/fine_tuning/`` (each checks scopes itself); ``calls``
    resolves the adapter a request calls; ``models`` adds and removes models
    (``POST /v1/models``, ``DELETE /v1/models/{id}``). None: not served here."""

    adapters: PrincipalApp | None = None
    calls: AdapterCalls | None = None
    finetune: FineTuneRoutes | None = None
    models: ModelAdmin | None = None


NO_ROUTES = Routes()


class Named(Protocol):
    """A dashboard view as the OpenAPI document lists it."""

    @property
    def prefix(self) -> str: ...
    @property
    def name(self) -> str: ...


class Pages(Protocol):
    """The dashboard as the gateway routes to it (its page, its events, ``/v1/tuning/``),
    tells it of each answered request, and lists its views in the OpenAPI document."""

    @property
    def views(self) -> Sequence[Named]: ...

    def handles(self, path: str) -> bool: ...

    def observe(self, model: str, seconds: float) -> None: ...

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...
