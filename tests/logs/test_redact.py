"""The redactor and the formatters on hostile input: linear on long lines, long field
values cut, ordinary words left alone, real secrets hidden; the access record's
request ids and which lines the probe header may quiet."""

from __future__ import annotations

import json
import logging
import time

import pytest

from fleetserve.cluster import supervisor
from fleetserve.gateway.auth import new_key
from fleetserve.logs import JsonFormatter, Redactor, TextFormatter, kv
from fleetserve.logs.access import POLLED, Access, request_id

MB = 1_000_000
# lines a client can make the server log (a model name, a path): each of them was
# quadratic for one pattern or another; the first one is short enough that the old
# patterns fail it in seconds rather than minutes
HOSTILE = [
    "m" * 100_000,
    "m" * MB,
    "a://" + "b" * MB,
    "bearer" + " " * MB,
    "authorization: " * (MB // 15),
    "a:" * (MB // 2),
    "fs-" * (MB // 3),
    "x.y+z-" * (MB // 6),
]


@pytest.mark.parametrize("n", range(len(HOSTILE)))
def test_redacting_a_long_line_takes_linear_time(n: int) -> None:
    redact = Redactor(["some-secret"])
    line = HOSTILE[n]
    t0 = time.perf_counter()
    redact(line)
    # 5 us a character (0.5 s for the shortest, 5 s for 1 MB), 10x what a loaded 2-core
    # machine takes; a quadratic pattern takes seconds on the shortest, minutes on 1 MB
    assert time.perf_counter() - t0 < 5e-6 * len(line), f"case {n}: {line[:20]!r}..."


def _record(**fields: object) -> logging.LogRecord:
    return logging.makeLogRecord({"name": "fleetserve.access", "msg": "m", **kv(**fields)})


def test_long_field_values_are_cut_in_both_formats() -> None:
    record = _record(model="m" * MB, n=3)
    t0 = time.perf_counter()
    text = TextFormatter().format(record)
    row = json.loads(JsonFormatter().format(record))
    assert time.perf_counter() - t0 < 0.5
    assert len(text) < 1200 and text.rstrip().endswith("\u2026 n=3")
    assert len(row["model"]) == 1024 and row["model"].endswith("\u2026") and row["n"] == 3


def test_ordinary_words_and_model_names_stay_as_they_are() -> None:
    redact = Redactor()
    for text in (
        "using the basic tokenizer",
        "the bearer of bad news",
        "loaded fs-" + "a" * 30,  # a model named fs-...: no key shape
        "org/fs-" + "b" * 50,  # nor this one
        "connect nats://127.0.0.1:4222",
        "see https://example.com/a?b=c@d",
    ):
        assert redact(text) == text


def test_real_secrets_are_hidden() -> None:
    redact = Redactor()
    key = new_key()
    cases = {
        "Authorization: Basic dXNlcjpwYXNzd29yZA==": "Authorization: Basic ***",
        '{"authorization": "Bearer tok"}': '{"authorization": "Bearer ***"}',
        "sent Bearer abcdefghijklmnop1234": "sent Bearer ***",
        f"key {key} made": "key fs-*** made",
        "nats://tok3n@host:4222": "nats://***@host:4222",  # a token as the user
        "s3://AKIA:secret@bucket/p": "s3://***@bucket/p",
    }
    for text, want in cases.items():
        assert redact(text) == want


def test_request_ids_have_no_slash_and_the_envelope_id_is_unique() -> None:
    assert request_id("abc:1.2") == "abc:1.2"
    assert request_id("a/b") != "a/b"  # a worker names parts "{id}/{attempt}/{start}"
    given = Access.of({"method": "POST", "path": "/p", "headers": [(b"x-request-id", b"dup")]})
    assert given.request_id == "dup"
    one, two = given.envelope_id(), given.envelope_id()
    assert one != two and one.startswith("dup.") and two.startswith("dup.")
    ours = Access.of({"method": "POST", "path": "/p", "headers": []})
    assert ours.envelope_id() == ours.request_id  # our own: unique already


def test_the_probe_header_quiets_only_successful_polling() -> None:
    def quiet(method: str, path: str, status: int, probe: bool = True) -> bool:
        return Access(method, path, "r", probe=probe).quiet(status)

    assert {"/healthz", "/v1/models"} <= POLLED  # what cluster.supervisor polls
    assert supervisor._PROBE == {"x-fleetserve-probe": "cluster"}
    assert quiet("GET", "/v1/models", 200) and quiet("GET", "/healthz", 200)
    assert not quiet("POST", "/v1/embeddings", 200)  # any client could hide its work
    assert not quiet("GET", "/v1/models", 401)
    assert not quiet("GET", "/v1/adapters", 200)
    assert not quiet("GET", "/v1/models", 200, probe=False)
    assert quiet("GET", "/readyz", 503, probe=False)  # a load balancer's probe
