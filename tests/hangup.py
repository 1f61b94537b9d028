"""An HTTP client that hangs up when the test says so: a raw socket, not a timeout."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx


def request(url: str, path: str, body: Any, headers: dict[str, str] | None) -> bytes:
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
    )
    return head.encode() + data


class Hangup:
    """POST ``body`` (JSON) to ``url + path`` at once; ``close`` hangs up."""

    def __init__(self, url: str, path: str, body: Any, headers: dict[str, str] | None = None):
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), 10)
        self.sock.sendall(request(url, path, body, headers))
        self.received = b""

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        """What the server sent until ``marker`` appears in it."""
        self.sock.settimeout(timeout)
        while marker not in self.received:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before {marker!r}: {self.received[-300:]!r}")
            self.received += chunk
        return self.received

    def close(self) -> None:
        self.sock.close()


class AsyncHangup:
    """The same on the event loop, for tests that serve in their own loop."""

    def __init__(self) -> None:
        self.received = b""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @classmethod
    async def post(
        cls, url: str, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> AsyncHangup:
        self = cls()
        u = urlsplit(url)
        self._reader, self._writer = await asyncio.open_connection(u.hostname, u.port)
        self._writer.write(request(url, path, body, headers))
        await self._writer.drain()
        return self

    async def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        assert self._reader is not None
        async with asyncio.timeout(timeout):
            while marker not in self.received:
                chunk = await self._reader.read(65536)
                if not chunk:
                    raise ConnectionError(f"closed before {marker!r}: {self.received[-300:]!r}")
                self.received += chunk
        return self.received

    async def close(self) -> None:
        assert self._writer is not None
        self._writer.close()
        await self._writer.wait_closed()


def metric(url: str, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    return sample(httpx.get(url + "/metrics", timeout=10).text, name, **labels)


def metrics(url: str, names: tuple[str, ...], **labels: str) -> tuple[float, ...]:
    """Several samples of one scrape of ``/metrics``, so that no step runs between them."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return tuple(sample(text, name, **labels) for name in names)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in the text of a scrape (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0] != name:
            continue
        got = dict(_labels(key))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return 0.0


def _labels(key: str) -> list[tuple[str, str]]:
    if "{" not in key:
        return []
    inner = key[key.index("{") + 1 : key.rindex("}")]
    out = []
    for part in inner.split('",'):
        k, _, v = part.partition("=")
        out.append((k, v.strip('"')))
    return out
