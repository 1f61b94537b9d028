"""API keys, tenants and scopes: the gateway's key ring, failing closed.

The ring is built once at start from Settings (``Authenticator.from_settings``):

- ``auth=open``: every caller is ``OPEN`` (all scopes); a valid ``X-Tenant`` header
  picks the tenant (``default`` without one).
- ``auth=keys``: keys are required. They come from ``keys_file`` and ``keys`` (the same
  content inline, for a secret), else from the legacy ``api_key`` (tenant ``default``,
  every scope). With none of them the server refuses to start.
- ``auth=auto`` (the default): as ``keys`` when any key is configured, else open.

A keys file is a YAML (or JSON) list of entries, or a mapping with a ``keys:`` list::

    - sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      tenant: acme
      scopes: [infer, adapters:write]
      name: acme-ci          # optional label

Keys are stored as the hex SHA-256 of the key only; a request's key is hashed and
looked up. Anything wrong in the configuration (an unknown mode, a missing or malformed
file, an unknown scope, a bad tenant name, a duplicate hash) is a ``ValueError`` naming
the problem, so the server refuses to start instead of falling open. Keys are never
logged, and error messages never repeat a value that might be one.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import yaml

from ..settings import Settings
from ..wire import Forbidden, InvalidInput, Unauthorized
from ..wire.adapter_ids import DEFAULT_TENANT, OPEN, TENANT_RE, Principal, Scope
from ..yamlio import load_yaml
from .http import Receive, Send, header
from .http import Scope as AsgiScope

log = logging.getLogger("fleetserve.gateway.auth")

MODES = ("auto", "keys", "open")
KEY_PREFIX = "fs-"
UNAUTHORIZED_MESSAGE = "missing or wrong API key (Authorization: Bearer <key>)"
_FIELDS = frozenset({"sha256", "tenant", "scopes", "name"})
_HEX64 = re.compile(r"[0-9a-f]{64}")


class PrincipalApp(Protocol):
    """An ASGI app that is told who is calling (the adapters API); it checks scopes."""

    async def __call__(
        self, scope: AsgiScope, receive: Receive, send: Send, principal: Principal
    ) -> None: ...


def hash_key(key: str) -> str:
    """The hex SHA-256 of ``key``: what a keys file stores."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def parse_scopes(raw: object, where: str = "scopes") -> frozenset[Scope]:
    """Scopes from a list (or a comma-separated string) of names; ``ValueError`` naming
    an unknown one."""
    items: Iterable[object]
    if isinstance(raw, str):
        items = [s.strip() for s in raw.split(",") if s.strip()]
    elif isinstance(raw, list):
        items = raw
    else:
        raise ValueError(f"{where}: scopes must be a list such as [infer, adapters:write]")
    known = ", ".join(s.value for s in Scope)
    out: set[Scope] = set()
    for item in items:
        try:
            if not isinstance(item, str):
                raise ValueError
            out.add(Scope(item))
        except ValueError:
            raise ValueError(f"{where}: unknown scope {item!r} (known: {known})") from None
    if not out:
        raise ValueError(f"{where}: no scopes (known: {known})")
    return frozenset(out)


def check_tenant(raw: object, where: str = "tenant") -> str:
    if not isinstance(raw, str) or TENANT_RE.fullmatch(raw) is None:
        raise ValueError(
            f"{where}: bad tenant name {raw!r} (1 to 63 lowercase letters, digits, '-' and "
            "'_', starting with a letter or digit)"
        )
    return raw


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One key of the ring: its hash, tenant, scopes and an optional label."""

    sha256: str
    tenant: str
    scopes: frozenset[Scope]
    name: str = ""

    @property
    def principal(self) -> Principal:
        return Principal(self.tenant, self.scopes)

    def to_dict(self) -> dict[str, Any]:
        """The entry as a keys file holds it (scopes in a stable order)."""
        out: dict[str, object] = {
            "sha256": self.sha256,
            "tenant": self.tenant,
            "scopes": [s.value for s in Scope if s in self.scopes],
        }
        if self.name:
            out["name"] = self.name
        return out


def parse_keys(text: str, source: str) -> list[KeyEntry]:
    """The entries of a keys document (YAML or JSON); ``ValueError`` naming ``source``
    and the problem. An empty document holds no keys."""
    try:
        data = load_yaml(text)
    except yaml.MarkedYAMLError as exc:  # no snippet of the text: it may hold a secret
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{source}: not valid YAML ({exc.problem}{at})") from None
    except yaml.YAMLError:
        raise ValueError(f"{source}: not valid YAML") from None
    if data is None:
        return []
    if isinstance(data, dict):
        extra = sorted(str(k) for k in data if k != "keys")
        if extra:
            fields = ", ".join(extra)
            raise ValueError(f"{source}: unknown top-level field(s) {fields} (want 'keys:')")
        data = data.get("keys") or []
    if not isinstance(data, list):
        raise ValueError(f"{source}: must be a list of keys, or a mapping with a 'keys:' list")
    entries: list[KeyEntry] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(data, 1):
        entry = _entry(raw, f"{source}: key {i}")
        label = f"key {i}" + (f" ({entry.name})" if entry.name else "")
        if entry.sha256 in seen:
            raise ValueError(f"{source}: {label} has the same sha256 as {seen[entry.sha256]}")
        seen[entry.sha256] = label
        entries.append(entry)
    return entries


def _entry(raw: object, where: str) -> KeyEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a mapping of sha256, tenant, scopes and name")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise ValueError(f"{where}: name must be a string")
    if name:
        where = f"{where} ({name})"
    extra = sorted(str(k) for k in raw if k not in _FIELDS)
    if extra:  # a plaintext ``key:`` lands here: refused, and not repeated
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(extra)} (a keys file holds sha256, tenant, "
            "scopes and name; never the key itself)"
        )
    for required in ("sha256", "tenant", "scopes"):
        if required not in raw:
            raise ValueError(f"{where}: missing {required}")
    digest = raw["sha256"]
    if not isinstance(digest, str) or _HEX64.fullmatch(digest.strip().lower()) is None:
        raise ValueError(
            f"{where}: sha256 must be 64 hex digits, the SHA-256 of the key (not the key)"
        )
    return KeyEntry(
        sha256=digest.strip().lower(),
        tenant=check_tenant(raw["tenant"], f"{where}: tenant"),
        scopes=parse_scopes(raw["scopes"], f"{where}: scopes"),
        name=name,
    )


def read_keys_file(path: Path) -> list[KeyEntry]:
    """The entries of a keys file; ``ValueError`` if it is missing, unreadable or bad."""
    source = f"keys file {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{source} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source} cannot be read ({type(exc).__name__})") from None
    return parse_keys(text, source)


def require(principal: Principal, scope: Scope) -> None:
    """``Forbidden`` naming ``scope`` unless ``principal`` has it (admin has all)."""
    if not principal.can(scope):
        raise Forbidden(
            f"this API key (tenant {principal.tenant!r}) lacks the {scope.value!r} scope",
            field="authorization",
        )


@dataclass(frozen=True)
class Authenticator:
    """The key ring: who a request's ``Authorization: Bearer <key>`` is.

    ``keys is None``: auth is open. Otherwise a map from the SHA-256 of each key to its
    principal (empty: every request is refused)."""

    keys: Mapping[str, Principal] | None  # no default: open is said, never implied
    source: str = "open"  # where the keys came from, for the start-up log

    @classmethod
    def open(cls) -> Authenticator:
        return cls(None, "open")

    @classmethod
    def from_entries(cls, entries: Iterable[KeyEntry], source: str = "keys") -> Authenticator:
        by_hash: dict[str, Principal] = {}
        for e in entries:
            if e.sha256 in by_hash:
                raise ValueError(f"{source}: two keys have the same sha256")
            by_hash[e.sha256] = e.principal
        return cls(MappingProxyType(by_hash), source)

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        """The ring ``settings`` configure; ``ValueError`` when they are wrong or when
        ``auth=keys`` finds no key."""
        mode = settings.auth.strip().lower()
        if mode not in MODES:
            raise ValueError(f"auth must be one of {', '.join(MODES)}, not {settings.auth!r}")
        if mode == "open":
            if settings.keys_file or settings.keys or settings.api_key:
                log.warning("auth=open: the configured API keys are ignored, every call is open")
            return cls.open()
        entries: list[KeyEntry] = []
        sources: list[str] = []
        if settings.keys_file:
            path = Path(settings.keys_file).expanduser()
            entries += read_keys_file(path)
            sources.append(f"keys file {path}")
        if settings.keys:
            entries += parse_keys(settings.keys, "the keys setting (FLEETSERVE_KEYS)")
            sources.append("the keys setting")
        if sources:
            if settings.api_key:
                log.warning("api_key is ignored: keys are configured (keys_file or keys)")
            source = " and ".join(sources)
            ring = cls.from_entries(entries, source)
            if not entries:
                if mode == "keys":
                    raise ValueError(
                        f"auth=keys but {source} holds no keys (add one with `fleetserve keys add`)"
                    )
                log.warning("%s holds no keys: every /v1/ request will be refused", source)
            return ring
        if settings.api_key:
            legacy = KeyEntry(hash_key(settings.api_key), DEFAULT_TENANT, frozenset(Scope))
            return cls.from_entries([legacy], "api_key")
        if mode == "keys":
            raise ValueError(
                "auth=keys but no API keys are configured: set keys_file (--keys-file, "
                "FLEETSERVE_KEYS_FILE) or keys (FLEETSERVE_KEYS); `fleetserve keys add` "
                "creates one"
            )
        return cls.open()

    @property
    def is_open(self) -> bool:
        return self.keys is None

    def describe(self) -> str:
        """One line for the start-up log (counts, never keys)."""
        if self.keys is None:
            return "auth: open (no API keys)"
        return f"auth: {len(self.keys)} API key(s) from {self.source}"

    def authenticate(self, scope: AsgiScope) -> Principal:
        """The caller of an HTTP request: ``Unauthorized`` for a missing or unknown key.

        Open: ``OPEN``, or its scopes under the tenant a valid ``X-Tenant`` names. With
        keys, the key's tenant; ``X-Tenant`` is ignored."""
        if self.keys is None:
            tenant = header(scope, b"x-tenant")
            if tenant is None or tenant == OPEN.tenant:
                return OPEN
            if TENANT_RE.fullmatch(tenant) is None:
                raise InvalidInput(
                    "X-Tenant must be 1 to 63 lowercase letters, digits, '-' and '_'",
                    field="x-tenant",
                )
            return Principal(tenant, OPEN.scopes)
        scheme, _, token = (header(scope, b"authorization") or "").strip().partition(" ")
        token = token.strip()
        principal = self.keys.get(hash_key(token)) if scheme.lower() == "bearer" else None
        if not token or principal is None:
            raise Unauthorized(UNAUTHORIZED_MESSAGE, field="authorization")
        return principal

    def authorize(self, scope: AsgiScope, need: Scope) -> Principal:
        """``authenticate``, then ``require(need)``."""
        principal = self.authenticate(scope)
        require(principal, need)
        return principal


__all__ = [
    "Authenticator",
    "KeyEntry",
    "PrincipalApp",
    "check_tenant",
    "hash_key",
    "new_key",
    "parse_keys",
    "parse_scopes",
    "read_keys_file",
    "require",
]
