"""The heartbeat a worker publishes on ``<prefix>.workers``, and what a gateway reads.

A JSON object (the field names are those of the dict it replaces, so a gateway and the
workers of one deployment, upgraded together, read each other's beats). A field that a
kind of worker does not report (a device supervisor has no memory figures, an embedded
worker's model no profile) is left ``UNSET``: it is then absent on the wire, as before,
and falsy where it is read.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from .codec import dumps
from .types import Encoding


class ModelBeat(msgspec.Struct, kw_only=True):
    """One model on the worker: its state in the fleet (``Fleet.info``), its profile,
    and, with ``--tune auto``, its background tuning state."""

    loaded: bool | UnsetType = UNSET
    state: str | UnsetType = UNSET
    bytes: int | UnsetType = UNSET
    pinned: bool | UnsetType = UNSET
    keep_alive: float | UnsetType = UNSET
    kept_alive_s: float | UnsetType = UNSET
    error: str | UnsetType | None = UNSET
    inflight: int | UnsetType = UNSET
    precision: str | UnsetType = UNSET
    hardware: str | UnsetType = UNSET
    profile: dict[str, object] | UnsetType = UNSET
    tuning: dict[str, object] | UnsetType = UNSET


class Memory(msgspec.Struct):
    """Bytes resident against the worker's memory budget, and what its host has (its
    RAM, or the cgroup's limit; unset: an older worker's): workers of one host share it."""

    budget: int
    used: int
    host: int | UnsetType = UNSET
    host_tier_budget: int | UnsetType = UNSET  # for sleeping models' weights (0: none)
    host_tier_used: int | UnsetType = UNSET


class DeviceBeat(msgspec.Struct):
    """One device child of a multi-device worker (``fleetserve worker --devices``)."""

    device: str
    pid: int | None
    ready: bool
    url: str | None


class Heartbeat(msgspec.Struct, kw_only=True):
    """A worker's announcement: who it is, where it listens, and what it holds;
    ``counters`` and ``adapters`` are the fleet view's (``dashboard.fleet_local``)."""

    id: str
    pid: int | None = None
    host: str | None = None
    ready: bool = False
    url: str | None = None
    device: str | None = None
    models: dict[str, ModelBeat] = msgspec.field(default_factory=dict)
    memory: Memory | UnsetType = UNSET
    idle: bool | UnsetType = UNSET
    devices: list[DeviceBeat] | UnsetType = UNSET
    counters: dict[str, dict[str, int]] | UnsetType = UNSET
    adapters: dict[str, list[str]] | UnsetType = UNSET

    def as_dict(self) -> dict[str, object]:
        """The beat as the plain dict it was before it had a type (the fleet view's
        ``normalize`` reads that, defensively)."""
        out: dict[str, object] = msgspec.to_builtins(self)
        return out


_decoder = msgspec.json.Decoder(Heartbeat)


def encode_heartbeat(beat: Heartbeat) -> bytes:
    return dumps(beat, Encoding.JSON)


def decode_heartbeat(data: bytes) -> Heartbeat:
    """A beat off the wire; ``msgspec.DecodeError`` if it is not one."""
    return _decoder.decode(data)


__all__ = [
    "DeviceBeat",
    "Heartbeat",
    "Memory",
    "ModelBeat",
    "decode_heartbeat",
    "encode_heartbeat",
]
