"""The dense family over the external runtime: tokenized locally, embedded by the server."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from fleetserve.catalog import ModelSpec
from fleetserve.families.dense import DenseFamily
from fleetserve.runtimes.external import ExternalRuntime
from fleetserve.wire import Encoding, Envelope, Task

from ..tinymodels import build_tokenizer
from .standin import MODEL, StandIn
from .standin_api import fake_embedding


def envelope(task: Task) -> Envelope:
    return Envelope(
        request_id="r1",
        model="ext/dense",
        task=task,
        content_type=Encoding.JSON,
        accept=Encoding.JSON,
        cost_hint=0,
        deadline=time.time() + 30,
    )


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_dense_adapter_over_external(tmp_path: Path, api: str) -> None:
    build_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = ["hello world", "the quick brown fox jumps over the lazy dog", "cat"]
    want_ids = [tok.encode(t).ids for t in texts]
    with StandIn() as srv, contextlib.ExitStack() as stack:
        options = {"url": srv.url, "api": api}
        spec = ModelSpec(
            id="ext/dense",
            family="dense",
            runtime="external",
            sources=("external",),
            runtime_options=options,
        )
        rt = ExternalRuntime(device="cuda", precision="bf16", options=spec.runtime_options)
        stack.callback(rt.close)
        adapter = DenseFamily(spec, rt, tmp_path)
        adapter.load()
        adapter.warmup()
        assert adapter.dim == 4 and adapter.memory_bytes() == 0

        srv.requests.clear()
        env = envelope(Task.ENCODE)
        body = json.dumps({"inputs": texts, "normalize": False}).encode()
        prepared = adapter.preprocess(env, body)
        outputs = list(adapter.forward(prepared.items))
        reply = json.loads(adapter.postprocess(env, prepared, outputs))

        # one request for the batch, with the local tokenizer's ids, padding stripped
        assert srv.bodies("/v1/embeddings") == [
            {"model": MODEL, "input": want_ids, "encoding_format": "float"}
        ]
        want = np.array([fake_embedding(x) for x in want_ids], dtype=np.float32)
        np.testing.assert_allclose(np.array(reply["embeddings"]), want)
        assert reply["usage"]["tokens"] == sum(len(x) for x in want_ids)

        env = envelope(Task.EMBEDDINGS)
        body = json.dumps({"input": texts[:2], "model": "ext/dense", "dimensions": 2}).encode()
        prepared = adapter.preprocess(env, body)
        reply = json.loads(
            adapter.postprocess(env, prepared, list(adapter.forward(prepared.items)))
        )
        got = np.array([d["embedding"] for d in reply["data"]])
        cut = want[:2, :2] / np.linalg.norm(want[:2, :2], axis=1, keepdims=True)
        np.testing.assert_allclose(got, cut, rtol=1e-6)
