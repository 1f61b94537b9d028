"""The SDK's adapter calls (``/v1/adapters``), shared by the sync and async clients."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from ..wire import Encoding
from ..wire.codec import loads
from ._common import MSGPACK, raise_for_error
from .records import AdapterInfo, adapter, adapter_list

T = TypeVar("T")
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PICKLED = ("adapter_model.bin", "adapter_model.pt")
FileField = tuple[str, tuple[str, bytes, str]]


@dataclass(frozen=True)
class Request(Generic[T]):
    """One call that is not a plain msgpack POST: its method, form, query or body."""

    method: str
    path: str
    decode: Callable[[Any], T]
    files: list[FileField] = field(default_factory=list)
    data: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None  # a raw body, of ``content_type``
    content_type: str = MSGPACK

    def kwargs(self, timeout: float) -> dict[str, Any]:  # httpx's keyword arguments
        out: dict[str, Any] = {"headers": {"accept": MSGPACK}, "timeout": timeout + 1}
        if self.content is not None:
            out["content"] = self.content
            out["headers"]["content-type"] = self.content_type
        if self.files:
            out["files"] = self.files
        if self.data:
            out["data"] = self.data
        if self.params:
            out["params"] = self.params
        return out

    def result(self, resp: httpx.Response) -> T:
        raise_for_error(resp)
        return self.decode(loads(resp.content, Encoding.MSGPACK))


def adapter_path(adapter: str) -> str:
    return "/v1/adapters/" + quote(adapter, safe="/@")


def adapter_files(path: str | Path) -> list[FileField]:
    """The two files of a PEFT adapter: a directory (as ``save_pretrained`` writes
    it), or the weights file with its config beside it. A pickled ``.bin`` is sent as
    it is, for the server to refuse by name."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    config = folder / CONFIG
    if not config.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG}")
    if p.is_dir():
        names = (WEIGHTS, *PICKLED)
        weights = next((p / n for n in names if (p / n).is_file()), p / WEIGHTS)
    else:
        weights = p
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has no {WEIGHTS}")
    return [
        ("config", (CONFIG, config.read_bytes(), "application/json")),
        ("weights", (weights.name, weights.read_bytes(), "application/octet-stream")),
    ]


def upload(
    path: str | Path, name: str, base: str | None, version: int | None, pinned: bool
) -> Request[AdapterInfo]:
    data = {"name": name}
    if base:
        data["base"] = base
    if version is not None:
        data["version"] = str(version)
    if pinned:
        data["pinned"] = "true"
    return Request("POST", "/v1/adapters", adapter, files=adapter_files(path), data=data)


def listing(base: str | None) -> Request[list[AdapterInfo]]:
    params = {"base": base} if base else {}
    return Request("GET", "/v1/adapters", adapter_list, params=params)


def get(name: str) -> Request[AdapterInfo]:
    return Request("GET", adapter_path(name), adapter)


def delete(adapter: str) -> Request[list[str]]:
    return Request("DELETE", adapter_path(adapter), lambda r: [str(i) for i in r["deleted"]])
