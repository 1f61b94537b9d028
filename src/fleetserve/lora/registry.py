"""Adapters by ``tenant/name@version``, kept in the cold tier (an object store).

Store layout, one directory per version::

    adapters/<tenant>/<name>/<version>/claim                      who is writing it
    adapters/<tenant>/<name>/<version>/adapter_config.json
    adapters/<tenant>/<name>/<version>/adapter_model.safetensors
    adapters/<tenant>/<name>/<version>/info.json                  the commit marker
    adapters/<tenant>/<name>/<version>/deleted                    a deleted version

An upload is validated before anything is written. It then *claims* its version with
the store's create-if-absent (so two gateways racing for one version end in one
winner and one 409), writes the two files, and writes ``info.json`` last: a version
without it is invisible, and a failed write deletes what it wrote. A delete writes a
tombstone, then removes ``info.json`` and the files; its claim stays, so a version
number is never given out twice. Versions are immutable, so their infos are cached for good; the
list of a name's versions is cached for ``ttl`` seconds and re-read on a miss, so
uploads through other gateways are seen.

A tenant sees and calls its own adapters and the public ones; another tenant's
adapter answers :class:`~fleetserve.wire.AdapterNotFound`, like one that does not
exist, so ids do not leak.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence

from ..storage import PayloadMissing, PayloadStore
from ..wire import (
    PUBLIC_TENANT,
    AdapterId,
    AdapterNotFound,
    Conflict,
    Forbidden,
    InvalidInput,
    Principal,
    Scope,
    parse_adapter_id,
)
from ..wire.suggest import did_you_mean
from .bases import ADAPTER_FAMILIES, Bases
from .manifest import AdapterRecord
from .store import AdapterStore
from .validate import (
    CONFIG,
    WEIGHTS,
    Limits,
    WeightsFile,
    config_base,
    read_config,
    validate,
)

ROOT = "adapters"
INFO = "info.json"
CLAIM = "claim"
DELETED = "deleted"  # a deleted version's tombstone: versions are never reused
FILES = (CONFIG, WEIGHTS)


class _Known:
    """``name in known``: whether ``name`` is a served model (for "adapter is for X")."""

    def __init__(self, bases: Bases) -> None:
        self._bases = bases

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._bases.family(name) is not None


def version_dir(aid: AdapterId) -> str:
    return f"{ROOT}/{aid.tenant}/{aid.name}/{aid.version}"


def adapter_ref(principal: Principal, text: str | AdapterId, field: str = "adapter") -> AdapterId:
    """An id as given, a bare ``name`` meaning the caller's tenant's."""
    if isinstance(text, AdapterId):
        return text
    return parse_adapter_id(text if "/" in text else f"{principal.tenant}/{text}", field=field)


def _versions(keys: list[str], prefix: str) -> tuple[list[int], list[int]]:
    """(every version with any object, the committed ones) from keys under ``prefix``."""
    every, done = set(), set()
    for key in keys:
        ver, _, leaf = key[len(prefix) :].partition("/")
        if ver.isdigit():
            every.add(int(ver))
            if leaf == INFO:
                done.add(int(ver))
    return sorted(every), sorted(done)


class AdapterRegistry:
    def __init__(
        self,
        store: AdapterStore | PayloadStore,
        *,
        limits: Limits,
        bases: Bases,
        ttl: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store if isinstance(store, AdapterStore) else AdapterStore(store)
        self.limits = limits
        self.bases = bases
        self.ttl = ttl
        self._clock = clock
        self._infos: dict[AdapterId, AdapterRecord] = {}  # id@version -> info (immutable)
        self._listed: dict[str, tuple[float, builtins.list[int]]] = {}  # key -> (when, committed)
        self._uploading: set[str] = set()  # tenant/name being created in this process
        self.deleted: set[str] = set()  # id@version strings deleted through this process

    # -- writes -------------------------------------------------------------------------
    async def create(
        self,
        principal: Principal,
        name: str,
        config: bytes,
        weights: bytes | WeightsFile,
        filenames: Sequence[str] = (),
        *,
        base: str | None = None,
        version: int | None = None,
        pinned: bool = False,
    ) -> AdapterRecord:
        """Validate and store a new version of ``name``; see the module docstring.
        ``weights`` may be a file an upload spooled: it is validated from the file and
        moved into the store, never read whole."""
        if not principal.can(Scope.ADAPTERS_WRITE):
            raise Forbidden("uploading adapters needs the adapters:write scope", field="scope")
        aid = adapter_ref(principal, name, field="name")
        if aid.version is not None:
            if version is not None and version != aid.version:
                raise InvalidInput(f"name {name!r} and version {version} differ", field="version")
            version, aid = aid.version, AdapterId(aid.tenant, aid.name)
        if version is not None and (isinstance(version, bool) or version < 1):
            raise InvalidInput(f"version must be an integer >= 1, not {version}", field="version")
        self._check_tenant(principal, aid.tenant)
        if aid.key in self._uploading:
            raise Conflict(f"adapter {aid.key} is being uploaded by another request", field="name")
        self._uploading.add(aid.key)
        try:
            base = self._base(read_config(config), base)
            shapes = await self.bases.shapes(base)
            held = await self.count(aid.tenant)
            if held >= self.limits.max_per_tenant:
                raise InvalidInput(
                    f"tenant {aid.tenant} holds {held} adapters, the limit "
                    f"(max_adapters_per_tenant) is {self.limits.max_per_tenant}: delete some",
                    field="name",
                )
            manifest = await asyncio.to_thread(
                validate, config, weights, filenames, base_model=base, base_shapes=shapes,
                limits=self.limits, known=_Known(self.bases),
                allow_regex=Scope.ADMIN in principal.scopes,  # a regex target_modules
            )  # fmt: skip
            vid = await self._claim(aid, version)
            info = AdapterRecord(vid, manifest, created=self._clock(), pinned=pinned)
            await self._write(info, config, weights)
        finally:
            self._uploading.discard(aid.key)
        self._infos[vid] = info
        self._listed.pop(aid.key, None)
        self.deleted.discard(str(vid))
        return info

    def _check_tenant(self, principal: Principal, tenant: str) -> None:
        if tenant == principal.tenant or Scope.ADMIN in principal.scopes:
            return
        if tenant == PUBLIC_TENANT:
            raise Forbidden("public adapters are uploaded with an admin key", field="name")
        raise Forbidden(
            f"this key belongs to tenant {principal.tenant}; it cannot write adapters of "
            f"tenant {tenant}",
            field="name",
        )

    def _base(self, config: dict[str, object], base: str | None) -> str:
        if base is not None:
            family = self.bases.family(base)
            if family is None:
                raise InvalidInput(f"base {base!r} is not a model this server serves", field="base")
        else:
            named = config_base(config)
            family = self.bases.family(named) if named else None
            if named is None or family is None:
                said = f"names base {named!r}" if named else "names no base_model_name_or_path"
                raise InvalidInput(
                    f"{CONFIG} {said}, which is not a model this server serves; "
                    "say which served model it is for with base",
                    field="base",
                )
            base = named
        if family not in ADAPTER_FAMILIES:
            raise InvalidInput(f"family {family} cannot take adapters ({base})", field="base")
        return base

    async def _claim(self, aid: AdapterId, version: int | None) -> AdapterId:
        prefix = f"{ROOT}/{aid.key}/"
        every, done = _versions(await self.store.keys(prefix), prefix)
        if version is None:
            version = max(every, default=0) + 1
        elif version in done:
            raise Conflict(f"adapter {aid.at(version)} exists already", field="version")
        vid = aid.at(version)
        if version in every and version not in done:
            gone = await self.store.keys(f"{version_dir(vid)}/{DELETED}")
            if gone:
                raise Conflict(
                    f"adapter {vid} was deleted; versions are never reused", field="version"
                )
        token = json.dumps({"upload": uuid.uuid4().hex, "created": self._clock()}).encode()
        if not await self.store.create(f"{version_dir(vid)}/{CLAIM}", token):
            raise Conflict(f"adapter {vid} is being uploaded by another request", field="name")
        return vid

    async def _write(
        self, info: AdapterRecord, config: bytes, weights: bytes | WeightsFile
    ) -> None:
        root = version_dir(info.id)
        try:
            await self.store.put(f"{root}/{CONFIG}", config)
            if isinstance(weights, WeightsFile):
                await self.store.put_file(f"{root}/{WEIGHTS}", weights.path)
            else:
                await self.store.put(f"{root}/{WEIGHTS}", weights)
            await self.store.put(f"{root}/{INFO}", info.dumps())
        except BaseException:
            await self._remove(info.id)
            raise

    async def _remove(self, vid: AdapterId, *, keep_claim: bool = False) -> None:
        """Delete one version's objects, the commit marker first and the claim last
        (kept for a deleted version, beside its tombstone)."""
        root = version_dir(vid)
        for leaf in (INFO, *FILES) if keep_claim else (INFO, *FILES, CLAIM):
            with contextlib.suppress(Exception):
                await self.store.delete(f"{root}/{leaf}")

    async def delete(
        self, principal: Principal, adapter: str | AdapterId
    ) -> builtins.list[AdapterId]:
        """Delete one version, or every version when the id has none; returns them."""
        if not principal.can(Scope.ADAPTERS_WRITE):
            raise Forbidden("deleting adapters needs the adapters:write scope", field="scope")
        aid = adapter_ref(principal, adapter)
        if not principal.sees(aid.tenant):
            raise AdapterNotFound(f"no adapter {aid}", field="adapter")
        self._check_tenant(principal, aid.tenant)
        done = await self._committed(aid.key, fresh=True)
        gone = [v for v in done if aid.version in (None, v)]
        if not gone:
            raise AdapterNotFound(f"no adapter {aid}", field="adapter")
        for v in gone:
            # the tombstone first: the version stays taken, so caches keyed by it hold
            await self.store.put(f"{version_dir(aid.at(v))}/{DELETED}", b"")
            await self._remove(aid.at(v), keep_claim=True)
            self._infos.pop(aid.at(v), None)
            self.deleted.add(str(aid.at(v)))
        self._listed.pop(aid.key, None)
        return [aid.at(v) for v in gone]

    # -- reads --------------------------------------------------------------------------
    async def get(self, principal: Principal, adapter: str | AdapterId) -> AdapterRecord:
        """The adapter (its newest version when the id has none) if the caller sees it."""
        if not (principal.can(Scope.INFER) or principal.can(Scope.ADAPTERS_WRITE)):
            raise Forbidden("reading adapters needs the infer scope", field="scope")
        aid = adapter_ref(principal, adapter)
        if not principal.sees(aid.tenant):
            raise AdapterNotFound(f"no adapter {aid}", field="adapter")
        try:
            return await self.info(aid)
        except AdapterNotFound:
            seen = {r.id.key for r in await self.list(principal)}
            hint = did_you_mean(aid.key, seen)
            raise AdapterNotFound(f"no adapter {aid}{hint}", field="adapter") from None

    async def info(self, adapter: str | AdapterId) -> AdapterRecord:
        """For the worker (no principal: the gateway checked): the adapter's info."""
        aid = parse_adapter_id(adapter) if isinstance(adapter, str) else adapter
        if aid.version is None:
            done = await self._committed(aid.key) or await self._committed(aid.key, fresh=True)
            if not done:
                raise AdapterNotFound(f"no adapter {aid}", field="adapter")
            aid = aid.at(done[-1])
        cached = self._infos.get(aid)
        if cached is not None:
            return cached
        try:
            info = AdapterRecord.loads(await self.store.get(f"{version_dir(aid)}/{INFO}"))
        except PayloadMissing:
            raise AdapterNotFound(f"no adapter {aid}", field="adapter") from None
        self._infos[aid] = info
        return info

    async def committed(self, adapter: AdapterId) -> bool:
        """Whether version ``adapter`` is still committed (the list of versions is
        re-read at most every ``ttl`` seconds: deletes through other gateways show)."""
        if str(adapter) in self.deleted:
            return False
        return adapter.version in await self._committed(adapter.key)

    def cached(self, adapter: AdapterId) -> AdapterRecord | None:
        """The info of version ``adapter`` if this process has read it (no I/O)."""
        return self._infos.get(adapter)

    async def files(self, adapter: str | AdapterId) -> tuple[bytes, bytes]:
        """(adapter_config.json, adapter_model.safetensors) from the store."""
        info = await self.info(adapter)
        root = version_dir(info.id)
        try:
            return (
                await self.store.get(f"{root}/{CONFIG}"),
                await self.store.get(f"{root}/{WEIGHTS}"),
            )
        except PayloadMissing:
            self._infos.pop(info.id, None)
            raise AdapterNotFound(f"no adapter {info.id}", field="adapter") from None

    async def list(
        self, principal: Principal, base: str | None = None
    ) -> builtins.list[AdapterRecord]:
        """Every version the caller sees (of ``base`` only, if given), by id."""
        if not (principal.can(Scope.INFER) or principal.can(Scope.ADAPTERS_WRITE)):
            raise Forbidden("listing adapters needs the infer scope", field="scope")
        if Scope.ADMIN in principal.scopes:
            prefixes = [f"{ROOT}/"]
        else:
            prefixes = [f"{ROOT}/{t}/" for t in sorted({principal.tenant, PUBLIC_TENANT})]
        ids: builtins.list[AdapterId] = []
        for prefix in prefixes:
            for key in await self.store.keys(prefix):
                parts = key.split("/")
                if len(parts) == 5 and parts[4] == INFO and parts[3].isdigit():
                    ids.append(AdapterId(parts[1], parts[2], int(parts[3])))
        infos = []
        for aid in sorted(ids):
            with contextlib.suppress(AdapterNotFound):  # deleted since the listing
                infos.append(await self.info(aid))
        return [i for i in infos if base is None or i.base == base]

    async def versions(self, adapter: str | AdapterId) -> builtins.list[AdapterRecord]:
        """Every committed version of ``tenant/name``, oldest first (no principal)."""
        aid = parse_adapter_id(adapter) if isinstance(adapter, str) else adapter
        done = await self._committed(aid.key, fresh=True)
        if not done:
            raise AdapterNotFound(f"no adapter {aid.key}", field="adapter")
        return [await self.info(aid.at(v)) for v in done]

    async def count(self, tenant: str) -> int:
        """How many versions ``tenant`` holds (what max_adapters_per_tenant limits)."""
        keys = await self.store.keys(f"{ROOT}/{tenant}/")
        return sum(1 for k in keys if k.endswith(f"/{INFO}"))

    async def _committed(self, key: str, *, fresh: bool = False) -> builtins.list[int]:
        hit = self._listed.get(key)
        if hit is not None and not fresh and self._clock() - hit[0] < self.ttl:
            return hit[1]
        prefix = f"{ROOT}/{key}/"
        _every, done = _versions(await self.store.keys(prefix), prefix)
        self._listed[key] = (self._clock(), done)
        return done

    async def sweep_uncommitted(self, max_age: float = 3600.0) -> int:
        """Delete versions a crashed upload left without ``info.json``, once their claim
        is ``max_age`` seconds old; returns how many."""
        keys = await self.store.keys(f"{ROOT}/")
        committed = {k.rsplit("/", 1)[0] for k in keys if k.endswith((f"/{INFO}", f"/{DELETED}"))}
        swept = 0
        for key in keys:
            root, _, leaf = key.rpartition("/")
            if leaf != CLAIM or root in committed:
                continue
            try:
                created = float(json.loads(await self.store.get(key))["created"])
            except (PayloadMissing, ValueError, KeyError, TypeError):
                continue
            if self._clock() - created > max_age:
                _, tenant, name, ver = root.split("/")
                await self._remove(AdapterId(tenant, name, int(ver)))
                swept += 1
        return swept
