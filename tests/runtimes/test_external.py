"""The external runtime against a stand-in that speaks SGLang's and vLLM's HTTP APIs."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from fleetserve.runtimes import Head, Output, SamplingParams, create_runtime
from fleetserve.runtimes.external import ExternalRuntime

from .standin import MODEL, StandIn
from .standin_api import fake_completion, fake_embedding

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
RF_SCHEMA = {"name": "output", "schema": SCHEMA}

Make = Callable[..., ExternalRuntime]


@pytest.fixture(scope="module")
def server() -> Iterator[StandIn]:
    with StandIn() as srv:
        yield srv


@pytest.fixture
def srv(server: StandIn) -> StandIn:
    server.requests.clear()
    return server


@pytest.fixture
def runtime() -> Iterator[Make]:
    made: list[ExternalRuntime] = []

    def make(srv: StandIn, **options: Any) -> ExternalRuntime:
        rt = ExternalRuntime(device="cuda", precision="bf16", options={"url": srv.url, **options})
        made.append(rt)
        rt.load(None, Head.BASE)
        return rt

    yield make
    for rt in made:
        rt.close()


# -- embeddings ---------------------------------------------------------------------------
@pytest.mark.parametrize("reverse", [False, True])
def test_padded_batch_goes_out_as_exact_token_ids_in_one_request(
    reverse: bool, runtime: Make
) -> None:
    seqs = [[101, 7, 8, 9, 102], [101, 5, 102], [101, 3, 4, 102]]
    ids = np.zeros((3, 5), dtype=np.int64)
    mask = np.zeros((3, 5), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    with StandIn(reverse_embeddings=reverse) as srv:
        out = runtime(srv, api="openai").run(ids, mask, Output.MEAN)
        assert srv.bodies("/v1/embeddings") == [
            {"model": MODEL, "input": seqs, "encoding_format": "float"}
        ]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([fake_embedding(s) for s in seqs]))


def test_only_pooled_outputs_and_base_heads(srv: StandIn, runtime: Make) -> None:
    rt = runtime(srv)
    with pytest.raises(ValueError, match="pooled embeddings only"):
        rt.run(np.ones((1, 2), np.int64), np.ones((1, 2), np.int64), Output.HIDDEN)
    with pytest.raises(ValueError, match="base models only"):
        rt.load(None, Head.MASKED_LM)
    assert rt.memory_bytes() == 0


# -- generation ---------------------------------------------------------------------------
def test_sglang_generate_sends_the_native_body(srv: StandIn, runtime: Make) -> None:
    ids = [11, 12, 13]
    params = SamplingParams(max_tokens=4, temperature=0.5, top_p=0.9, seed=7, stop=("\n",))
    g = runtime(srv).generate(ids, params)
    want = fake_completion(ids, 4, ["\n"], None)
    assert (g.text, g.finish_reason) == (want.text, "length")
    assert (g.prompt_tokens, g.completion_tokens) == (3, 4)
    sp = {"max_new_tokens": 4, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"]}
    sp["sampling_seed"] = 7
    assert srv.bodies("/generate") == [{"input_ids": ids, "sampling_params": sp, "stream": False}]


@pytest.mark.parametrize("incremental", [False, True])
def test_sglang_stream_gives_deltas(incremental: bool, runtime: Make) -> None:
    ids = [3, 1, 4, 1, 5]
    with StandIn(incremental=incremental) as srv:
        rt = runtime(srv, incremental_stream=incremental)
        deltas: list[str] = []
        g = rt.generate(ids, SamplingParams(max_tokens=50, stop=("eps",)), deltas.append)
        assert srv.bodies("/generate")[0]["stream"] is True
    want = fake_completion(ids, 50, ["eps"], None)
    assert deltas == [p for p in want.pieces if p]
    assert (g.text, g.finish_reason, g.completion_tokens) == (want.text, "stop", want.tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_completions(srv: StandIn, stream: bool, runtime: Make) -> None:
    ids = [9, 8, 7]
    deltas: list[str] = []
    g = runtime(srv, api="openai").generate(
        ids, SamplingParams(max_tokens=100, seed=3), deltas.append if stream else None
    )
    want = fake_completion(ids, 100, [], None)
    assert (g.text, g.finish_reason) == (want.text, "stop")
    assert (g.prompt_tokens, g.completion_tokens) == (3, want.tokens)
    assert deltas == (want.pieces if stream else [])
    body = {"model": MODEL, "prompt": ids, "max_tokens": 100, "temperature": 1.0, "top_p": 1.0}
    body |= {"stream": stream, "seed": 3}
    if stream:
        body["stream_options"] = {"include_usage": True}
    assert srv.bodies("/v1/completions") == [body]


def test_sglang_json_schema_is_a_string_in_sampling_params(srv: StandIn, runtime: Make) -> None:
    g = runtime(srv).generate([2, 3], SamplingParams(max_tokens=20, json_schema=SCHEMA))
    assert json.loads(g.text) == {"n": 5}
    sent = srv.bodies("/generate")[0]["sampling_params"]["json_schema"]
    assert isinstance(sent, str) and json.loads(sent) == SCHEMA


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("response_format", {"type": "json_schema", "json_schema": RF_SCHEMA}),
        ("structured_outputs", {"json": SCHEMA}),
        ("guided_json", SCHEMA),
    ],
)  # fmt: skip
def test_openai_json_schema_field(srv: StandIn, field: str, expected: Any, runtime: Make) -> None:
    rt = runtime(srv, api="openai", structured_output=field)
    g = rt.generate([4, 4], SamplingParams(max_tokens=20, json_schema=SCHEMA), lambda _: None)
    assert json.loads(g.text) == {"n": 8}
    assert srv.bodies("/v1/completions")[0][field] == expected


def test_generate_batch_is_concurrent_and_ordered(srv: StandIn, runtime: Make) -> None:
    rt = runtime(srv, api="openai")
    reqs = [([i, i + 1], SamplingParams(max_tokens=3)) for i in range(6)]
    srv.delay = 0.4
    try:
        t0 = time.monotonic()
        out = rt.generate_batch(reqs)
        took = time.monotonic() - t0
    finally:
        srv.delay = 0.0
        rt.close()
    assert [g.text for g in out] == [fake_completion(ids, 3, [], None).text for ids, _ in reqs]
    assert took < 6 * 0.4 / 2, f"six requests took {took:.2f} s: not concurrent"


def test_generate_is_thread_safe_while_streaming(srv: StandIn, runtime: Make) -> None:
    rt = runtime(srv)
    results: dict[int, tuple[str, str]] = {}

    def one(i: int) -> None:
        parts: list[str] = []
        g = rt.generate([i], SamplingParams(max_tokens=6), parts.append)
        results[i] = ("".join(parts), g.text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for i in range(8):
        want = fake_completion([i], 6, [], None).text
        assert results[i] == (want, want)


# -- setup --------------------------------------------------------------------------------
def test_create_runtime_and_model_discovery(srv: StandIn) -> None:
    sg = create_runtime("external", device="cuda", precision="fp16", options={"url": srv.url})
    oa = create_runtime(
        "external",
        device="cpu",
        precision="fp32",
        options={"url": srv.url + "/v1/", "api": "openai"},
    )
    assert isinstance(sg, ExternalRuntime) and isinstance(oa, ExternalRuntime)
    with sg, oa:
        assert sg.name == "external" and sg.model is None and oa.url == srv.url
        sg.load(None)
        oa.load(None)
        assert sg.model == MODEL  # from /get_model_info
        assert oa.model == MODEL  # from /v1/models
    assert [r.path for r in srv.requests] == ["/health", "/get_model_info", "/v1/models"]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "needs runtime_options.url"),
        ({"url": "http://h:1", "api": "tgi"}, "api must be one of"),
        ({"url": "http://h:1", "modle": "x"}, r"unknown runtime_options \['modle'\]"),
        ({"url": "http://h:1", "api_key_env": "KEY"}, "pass the key itself"),
        ({"url": "http://h:1", "structured_output": "grammar"}, "structured_output must be"),
    ],
)
def test_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ExternalRuntime(options=options)


def test_api_key_is_sent(runtime: Make) -> None:
    with StandIn(api_key="sekrit") as srv:
        rt = runtime(srv, api="openai", api_key="sekrit")
        rt.generate([1], SamplingParams(max_tokens=1))
        assert {r.headers["authorization"] for r in srv.requests} == {"Bearer sekrit"}
