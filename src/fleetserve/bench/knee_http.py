"""The HTTP side of ``fleetserve bench knee``: targets, their request bodies, the sender.

A target is any server with the OpenAI embeddings API (``POST {"model", "input":
[...]}``): fleetserve's ``/v1/embeddings``, infinity-emb's ``/embeddings``, TEI's
``/v1/embeddings``. Bodies are built once, before the clock starts; the sender checks
only the status code, so the client's cost per request is small and the same for all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

JSON = {"content-type": "application/json"}


class TargetError(Exception):
    """A target that cannot be used: the message is one line, for the user."""


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    model: str


def parse_targets(specs: Sequence[str], models: Sequence[str], model: str) -> list[Target]:
    """``[NAME=]URL`` each (name: host:port when not given); ``models``: ``NAME=MODEL``
    for the targets that call the model by another name than ``model``."""
    per_model: dict[str, str] = {}
    for m in models:
        name, sep, value = m.partition("=")
        if not sep or not name or not value:
            raise TargetError(f"--target-model wants NAME=MODEL, not {m!r}")
        per_model[name] = value
    out: list[Target] = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = "", spec
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TargetError(f"--target wants [NAME=]http://HOST:PORT/PATH, not {spec!r}")
        try:
            port = parts.port
        except ValueError as exc:
            raise TargetError(f"--target {spec!r}: {exc}") from None
        name = name or f"{parts.hostname}:{port or ''}".rstrip(":")
        if any(t.name == name for t in out):
            raise TargetError(f"two targets are named {name!r}: give them names (NAME=URL)")
        out.append(Target(name, url, per_model.pop(name, model)))
    if not out:
        raise TargetError("give at least one --target [NAME=]URL")
    if per_model:
        raise TargetError(f"--target-model names no --target: {', '.join(per_model)}")
    return out


def requests_of(
    texts: Sequence[str], lengths: Sequence[int], items: int
) -> list[tuple[list[str], int]]:
    """One request per text: ``items`` consecutive texts (cycling), and its tokens."""
    n = len(texts)
    out = []
    for j in range(n):
        idx = [(j * items + m) % n for m in range(items)]
        out.append(([texts[i] for i in idx], sum(lengths[i] for i in idx)))
    return out


class Sender:
    """Sends request ``i`` (of a fixed pool, cycling) to one target; ``send`` is the
    open-loop generator's ``send``."""

    def __init__(
        self,
        target: Target,
        requests: Sequence[tuple[list[str], int]],
        *,
        encoding: str = "base64",
        timeout_s: float = 60.0,
        max_in_flight: int = 256,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.target = target
        self.bodies = [_body(target.model, texts, encoding) for texts, _ in requests]
        self.items = [len(texts) for texts, _ in requests]
        self.tokens = [tokens for _, tokens in requests]
        self.headers = {**JSON, **(headers or {})}
        self.first_error = ""
        limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, pool=None), limits=limits)

    async def send(self, i: int) -> int:
        j = i % len(self.bodies)
        try:
            r = await self.client.post(
                self.target.url, content=self.bodies[j], headers=self.headers
            )
        except httpx.HTTPError as exc:
            self._note(f"{type(exc).__name__}: {exc}")
            raise
        if r.status_code != 200:
            self._note(f"HTTP {r.status_code}: {r.text[:120]}")
            raise RuntimeError(f"HTTP {r.status_code}")
        return self.tokens[j]

    def _note(self, what: str) -> None:
        self.first_error = self.first_error or " ".join(what.split())

    async def check(self, warmup: int = 8) -> None:
        """One request, its reply read; then ``warmup`` more. Raises TargetError."""
        t = self.target
        try:
            r = await self.client.post(t.url, content=self.bodies[0], headers=self.headers)
        except httpx.HTTPError as exc:
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            raise TargetError(f"target {t.name} ({t.url}) is unreachable: {why}") from None
        if r.status_code != 200:
            why = " ".join(r.text[:200].split())
            raise TargetError(f"target {t.name} ({t.url}) answered {r.status_code}: {why}")
        try:
            data: Any = r.json()["data"]
            ok = isinstance(data, list) and len(data) == self.items[0]
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise TargetError(
                f"target {t.name} ({t.url}) did not answer as the OpenAI embeddings API "
                f"(a 'data' list of {self.items[0]} embeddings)"
            )
        for i in range(1, warmup + 1):
            try:
                await self.send(i)
            except Exception:
                raise TargetError(f"target {t.name}: warm-up failed: {self.first_error}") from None

    async def aclose(self) -> None:
        await self.client.aclose()


def _body(model: str, texts: list[str], encoding: str) -> bytes:
    return json.dumps({"model": model, "input": texts, "encoding_format": encoding}).encode()
