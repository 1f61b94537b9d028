"""Adapter ids, the ``base:adapter`` model name, and API key scopes.

An adapter id is ``tenant/name``, optionally pinned to a version as
``tenant/name@3``; without a version it means the newest one. A model name of the
form ``base:tenant/name`` calls that adapter on the base model, so OpenAI clients
need no change. Model ids never contain ``:``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .errors import InvalidInput

TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
PUBLIC_TENANT = "public"  # adapters every tenant sees and calls
DEFAULT_TENANT = "default"  # the tenant of every request when no keys are configured


class Scope(enum.StrEnum):
    """What an API key may do."""

    INFER = "infer"  # call models and adapters, list them
    ADAPTERS_WRITE = "adapters:write"  # upload and delete its tenant's adapters
    ADMIN = "admin"  # everything, and public adapters
    METRICS = "metrics"  # read /metrics (a Prometheus scraper's key)


@dataclass(frozen=True, slots=True, order=True)
class AdapterId:
    """``tenant/name`` and a version (``None``: the newest)."""

    tenant: str
    name: str
    version: int | None = None

    @property
    def key(self) -> str:
        """``tenant/name``: the id without its version."""
        return f"{self.tenant}/{self.name}"

    def at(self, version: int) -> AdapterId:
        return AdapterId(self.tenant, self.name, version)

    def __str__(self) -> str:
        return self.key if self.version is None else f"{self.key}@{self.version}"


def parse_adapter_id(text: str, *, field: str = "adapter") -> AdapterId:
    """``tenant/name`` or ``tenant/name@N``; an ``InvalidInput`` naming ``field`` else."""
    base, at, ver = text.partition("@")
    tenant, slash, name = base.partition("/")
    if not slash or TENANT_RE.fullmatch(tenant) is None or NAME_RE.fullmatch(name) is None:
        raise InvalidInput(
            f"adapter id {text!r} is not 'tenant/name' or 'tenant/name@version' (tenant: "
            "lowercase letters, digits, '-' and '_'; name: letters, digits, '.', '-', '_')",
            field=field,
        )
    version: int | None = None
    if at:
        if not ver.isdigit() or int(ver) < 1:
            raise InvalidInput(
                f"adapter version in {text!r} must be a positive integer", field=field
            )
        version = int(ver)
    return AdapterId(tenant, name, version)


def split_model_name(name: str) -> tuple[str, str | None]:
    """``base:adapter`` -> (base, adapter); a plain model id -> (id, None)."""
    base, colon, adapter = name.partition(":")
    if not colon:
        return name, None
    if not base or not adapter:
        raise InvalidInput(
            f"model {name!r}: write an adapter call as 'base:tenant/name'", field="model"
        )
    return base, adapter


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant a key belongs to and what it may do."""

    tenant: str
    scopes: frozenset[Scope]

    def can(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    def sees(self, tenant: str) -> bool:
        """Whether this caller may see and call adapters of ``tenant``."""
        return tenant in (self.tenant, PUBLIC_TENANT) or Scope.ADMIN in self.scopes


OPEN = Principal(DEFAULT_TENANT, frozenset(Scope))  # every caller when auth is open
