"""The heartbeat as a wire type: it round-trips, the dict form it replaced still
decodes, and a gateway's registry reads a worker's beat by attribute."""

from __future__ import annotations

import json
from dataclasses import dataclass

import msgspec
import pytest

from fleetserve.cluster.presence import Registry
from fleetserve.dashboard.fleet_local import normalize
from fleetserve.wire.heartbeat import (
    DeviceBeat,
    Heartbeat,
    Memory,
    ModelBeat,
    decode_heartbeat,
    encode_heartbeat,
)

# a process worker's beat as ``WorkerProcess.describe`` wrote it when it was a dict
OLD = {
    "id": "w1", "pid": 41, "host": "h", "ready": True, "url": "http://127.0.0.1:9001",
    "device": "cpu", "memory": {"budget": 100, "used": 40}, "idle": False,
    "models": {
        "m/a": {"loaded": True, "state": "resident", "bytes": 40, "pinned": False,
                "keep_alive": 0.0, "kept_alive_s": 0.0, "error": None, "inflight": 2,
                "precision": "fp32", "hardware": "cpu", "profile": {"how": "default"}},
        "m/b": {"loaded": False, "state": "cold", "bytes": 0, "error": None},
    },
    "counters": {"put_backs": {"m/a": 3}}, "adapters": {"m/a": ["t/x@1"]},
}  # fmt: skip


@dataclass
class Msg:
    data: bytes


def test_a_beat_round_trips() -> None:
    beat = Heartbeat(
        id="w2", pid=7, host="h", ready=True, url="http://h:1", device="cuda:0,cuda:1",
        devices=[DeviceBeat(device="cuda:0", pid=8, ready=True, url=None)],
        memory=Memory(budget=10, used=3),
        models={"m/a": ModelBeat(loaded=True, precision="fp16", hardware="gpu")},
    )  # fmt: skip
    assert decode_heartbeat(encode_heartbeat(beat)) == beat
    # what a kind of worker does not report stays off the wire
    assert "idle" not in json.loads(encode_heartbeat(beat))
    assert json.loads(encode_heartbeat(beat))["models"] == {
        "m/a": {"loaded": True, "precision": "fp16", "hardware": "gpu"}
    }


def test_the_dict_form_decodes_to_the_same_fields() -> None:
    beat = decode_heartbeat(json.dumps(OLD).encode())
    assert beat.id == "w1" and beat.ready is True and beat.memory == Memory(100, 40)
    assert beat.models["m/a"].state == "resident" and beat.models["m/a"].inflight == 2
    assert beat.models["m/b"].pinned is msgspec.UNSET
    assert beat.as_dict() == OLD  # nothing lost, nothing added
    assert normalize(beat.as_dict()) == normalize(OLD)


def test_garbage_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_heartbeat(b'{"ready": true}')  # no id
    with pytest.raises(msgspec.DecodeError):
        decode_heartbeat(b"not json")


async def test_the_gateway_reads_a_workers_beat() -> None:
    reg = Registry()
    await reg._on_beat(Msg(json.dumps(OLD).encode()))
    await reg._on_beat(Msg(b"{}"))  # malformed: ignored
    new = Heartbeat(
        id="w2", ready=False, url="http://h:2", models={"m/a": ModelBeat(state="loading")}
    )
    await reg._on_beat(Msg(encode_heartbeat(new)))
    assert [b.id for b in reg.workers()] == ["w1", "w2"]
    (w1, w2) = reg.holders("m/a")
    assert (w1.id, w1.ready, w1.model.state, w1.model.bytes) == ("w1", True, "resident", 40)
    assert (w2.id, w2.ready, w2.model.state) == ("w2", False, "loading")
    # as ``GET /v1/models`` lists it: the worker's fields, then the model's, as before
    assert w1.as_dict() == {"id": "w1", "ready": True, "url": "http://127.0.0.1:9001",
                            "pid": 41, **OLD["models"]["m/a"]}  # fmt: skip
    assert w2.as_dict() == {"id": "w2", "ready": False, "url": "http://h:2", "pid": None,
                            "state": "loading"}  # fmt: skip
    assert reg.holders("m/c") == []
