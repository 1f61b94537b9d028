"""A property-based fuzzer (schemathesis) against a live server, from its own
``/openapi.json``: for every operation, requests generated from the document (valid
ones and ones that break it, in JSON and msgpack) must get no 5xx, and every reply
must match the document: its status, its content type and its schema.

Bounded: 25 valid and 10 invalid examples per operation, about 20 s in all on a busy 2-core
machine. The examples are derandomized, so a run is repeatable; raise ``EXAMPLES``
locally to search deeper.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

from ..conftest import ServerThread
from . import openapi_kit as kit

# examples per operation; FLEETSERVE_FUZZ_SCALE=20 searches 20 times deeper (a local hunt)
SCALE = int(os.environ.get("FLEETSERVE_FUZZ_SCALE", "1"))
EXAMPLES = {GenerationMode.POSITIVE: 25 * SCALE, GenerationMode.NEGATIVE: 10 * SCALE}
CHECKS = [
    checks.not_a_server_error,
    checks.response_schema_conformance,
    checks.status_code_conformance,
    checks.content_type_conformance,
]
# not fuzzed, and why:
SKIP = {
    # a server-sent event stream that stays open (up to a minute) by design; its
    # route is documented and tests/dashboard covers it
    "GET /dashboard/events",
}
# the served models that each route's cases are pointed at (half of them)
SERVES = {
    "/v1/embeddings": (kit.TINY,),
    "/v1/chat/completions": (kit.CHAT,),
    "/v1/rerank": (kit.RERANK, kit.TINY, kit.SPARSE, kit.COLBERT),
    "/v1/encode/{model}": (kit.TINY, kit.SPARSE, kit.COLBERT),
    "/v1/score/{model}": (kit.RERANK, kit.TINY, kit.SPARSE, kit.COLBERT),
    "/v1/extract/{model}": (kit.NER,),
    "/v1/generate/{model}": (kit.CHAT,),
}


@schemathesis.serializer("application/msgpack")
def _to_msgpack(ctx: Any, value: Any) -> bytes:
    return msgspec.msgpack.encode(_fits(value))


def _fits(value: Any) -> Any:
    """msgpack holds integers of 64 bits: larger ones generated for JSON go as floats."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -(2**63) <= value < 2**64 else float(value)
    if isinstance(value, dict):
        return {k: _fits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fits(v) for v in value]
    return value


schemathesis.serializer.alias("application/jsonl", "text/plain")


@schemathesis.deserializer("application/msgpack")
def _from_msgpack(ctx: Any, response: Any) -> Any:
    return kit.plain(msgspec.msgpack.decode(response.content))


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> ServerThread:
    return kit.shared(request)[0]


def aim(case: Any, pick: int) -> None:
    """Point most cases (``pick`` < 4) at a model that serves the route (else nearly
    every one is a 404), and drop ``X-Request-Timeout``: a deadline shorter than the work is a
    correct 504."""
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "x-request-timeout":
            del headers[name]
    models = SERVES.get(case.operation.path)
    if pick == 4 or models is None:
        return
    model = models[pick % len(models)]
    if case.path_parameters and "model" in case.path_parameters:
        case.path_parameters["model"] = model
    elif isinstance(case.body, dict):
        case.body["model"] = model


def fuzz(op: Any, url: str, mode: GenerationMode) -> None:
    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        derandomize=SCALE == 1,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=op.as_strategy(generation_mode=mode),
        pick=st.integers(0, 4),
    )
    def run(case: Any, pick: int) -> None:
        aim(case, pick)
        case.call_and_validate(base_url=url, checks=CHECKS, timeout=60)

    run()


def test_the_fuzzer_finds_no_5xx_and_no_reply_off_the_document(server: ServerThread) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    t0 = time.monotonic()
    done, failures = [], []
    spent: dict[str, float] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        label = f"{op.method.upper()} {op.path}"
        if label in SKIP:
            continue
        for mode in EXAMPLES:
            t1 = time.monotonic()
            try:
                fuzz(op, server.url, mode)
            except Unsatisfiable:  # nothing to break: no parameters, no body
                assert mode is GenerationMode.NEGATIVE, label
            except (Exception, BaseExceptionGroup) as exc:  # every operation's failures
                failures.append(f"{label} ({mode.value}): {exc}")
            spent[f"{label} {mode.value}"] = time.monotonic() - t1
        done.append(label)
    assert len(done) >= 25, done
    slowest = sorted(spent.items(), key=lambda kv: -kv[1])[:5]
    assert not failures, "\n\n".join(failures)
    assert time.monotonic() - t0 < 120, slowest  # the bound this suite budgets for
    # the cases reached the models (not only the gateway's 404s): served ones answered
    reached = httpx.get(server.url + "/metrics").text.splitlines()
    served = [x for x in reached if x.startswith("fleetserve_requests_total") and
              'model="unknown"' not in x]  # fmt: skip
    assert sum(float(x.rsplit(" ", 1)[1]) for x in served) >= 50, served
