"""The external runtime: forwards batches to an SGLang or vLLM server over HTTP.

Weights live on the server; fleetserve keeps the tokenizer, so prompts are tokenized
once, locally, and travel as token ids. Embeddings go out as one ``/v1/embeddings``
request per batch; each generated sequence is one request (SGLang and vLLM batch
concurrent requests themselves). ``generate`` is synchronous and thread-safe: the
generation family calls it from one worker thread per sequence.

It serves two protocols: :class:`~.base.Runtime` (embeddings) and
:class:`~.base.BatchGeneratingRuntime` (generation: ``generate``, ``generate_batch``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np

from ..wire import DeadlineExceeded, FleetError, InternalError, Unavailable
from ..wire.values import Array
from .base import Generation, Head, Output, SamplingParams
from .external_api import ExternalOptions, embeddings_body, generate_request
from .external_replies import (
    StreamState,
    http_error,
    parse_embeddings,
    parse_generation,
    sse_events,
)


class ExternalRuntime:
    name = "external"

    def __init__(
        self,
        *,
        device: str = "cpu",
        precision: str = "fp32",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.device = device  # informational: the server owns the accelerator
        self.precision = precision
        self.opts = ExternalOptions.parse(options or {})
        self.url = self.opts.url
        self.model = self.opts.model
        headers = {"content-type": "application/json"}
        if self.opts.api_key:
            headers["authorization"] = f"Bearer {self.opts.api_key}"
        n = self.opts.max_concurrency
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(self.opts.timeout, connect=self.opts.connect_timeout),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        )
        self._slots = threading.BoundedSemaphore(n)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- Runtime protocol ----------------------------------------------------------------
    def load(self, path: Path | None = None, head: Head = Head.BASE) -> None:
        """Check that the server answers (and learn the served model's name).

        ``path`` is the local tokenizer's directory, which the server does not need."""
        if head is not Head.BASE:
            raise ValueError(
                f"the external runtime serves base models only (embeddings, generation), "
                f"not head {head.value!r}; use runtime torch or onnx"
            )
        if self.opts.api == "sglang":
            self._get("/health")
            info = self._get("/get_model_info")
            if self.model is None and isinstance(info, dict) and info.get("model_path"):
                self.model = str(info["model_path"])
            return
        listing = self._get("/v1/models")
        cards = listing.get("data") if isinstance(listing, dict) else None
        served = [str(m.get("id")) for m in cards or [] if isinstance(m, dict)]
        if self.model is None and served:
            self.model = served[0]
        elif self.model not in served:
            raise InternalError(
                f"the model server at {self.url} serves {served}, not {self.model!r} "
                "(runtime_options.model)"
            )

    def run(
        self,
        input_ids: Array,
        attention_mask: Array,
        output: Output,
        token_type_ids: Array | None = None,
    ) -> Array:
        """Embeddings of a padded batch, in one ``/v1/embeddings`` request.

        The server pools as its model is configured to, whether MEAN or CLS is asked."""
        if output not in (Output.MEAN, Output.CLS):
            raise ValueError(
                f"the external runtime returns pooled embeddings only, not {output.value!r}"
            )
        mask = np.asarray(attention_mask).astype(bool)
        inputs = [[int(t) for t in row[m]] for row, m in zip(input_ids, mask, strict=True)]
        reply = self._post("/v1/embeddings", embeddings_body(self.model, inputs))
        return parse_embeddings(reply, len(inputs))

    def memory_bytes(self) -> int:
        return 0  # the weights live on the server

    # -- generation ------------------------------------------------------------------------
    def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        on_text: Callable[[str], None] | None = None,
    ) -> Generation:
        """One sequence; streams text deltas to ``on_text`` when it is given."""
        stream = on_text is not None
        path, body = generate_request(self.opts, self.model, input_ids, params, stream)
        if on_text is None:
            return parse_generation(self.opts.api, self._post(path, body), len(input_ids))
        state = StreamState(self.opts.api, len(input_ids), incremental=self.opts.incremental_stream)
        with self._stream(path, body) as lines:
            for event in sse_events(lines):
                delta = state.feed(event)
                if delta:
                    on_text(delta)
        return state.result()

    def generate_batch(
        self, requests: Sequence[tuple[list[int], SamplingParams]]
    ) -> list[Generation]:
        """Many sequences, sent concurrently; results in input order."""
        if not requests:
            return []
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.opts.max_concurrency, thread_name_prefix="fleetserve-external"
                )
            pool = self._pool
        futures = [pool.submit(self.generate, ids, p) for ids, p in requests]
        wait(futures)
        return [f.result() for f in futures]

    def close(self) -> None:
        """Close the connections (also done when the runtime is garbage collected)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        self._client.close()

    def __enter__(self) -> ExternalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # the worker drops evicted runtimes without a close
        with contextlib.suppress(Exception):
            self.close()

    # -- HTTP ------------------------------------------------------------------------------
    def _get(self, path: str) -> object:
        return self._send("GET", path, None)

    def _post(self, path: str, body: dict[str, object]) -> object:
        return self._send("POST", path, body)

    def _send(self, method: str, path: str, body: dict[str, object] | None) -> object:
        content = None if body is None else msgspec.json.encode(body)
        with self._slots, self._transport_errors(path):
            r = self._client.request(method, path, content=content)
            if r.status_code >= 400:
                raise http_error(r.status_code, r.content, self.url, r.headers.get("retry-after"))
            if not r.content:
                return None
            try:
                return msgspec.json.decode(r.content)
            except msgspec.DecodeError:
                return r.text

    @contextlib.contextmanager
    def _stream(self, path: str, body: dict[str, object]) -> Iterator[Iterator[str]]:
        content = msgspec.json.encode(body)
        with (
            self._slots,
            self._transport_errors(path),
            self._client.stream("POST", path, content=content) as r,
        ):
            if r.status_code >= 400:
                r.read()
                raise http_error(r.status_code, r.content, self.url, r.headers.get("retry-after"))
            yield r.iter_lines()

    @contextlib.contextmanager
    def _transport_errors(self, path: str) -> Iterator[None]:
        """Map httpx's failures to fleetserve errors that name the server."""
        where = f"{self.url}{path}"
        try:
            yield
        except FleetError:
            raise
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise Unavailable(
                    f"cannot reach the model server at {self.url}: connect timed out",
                    retry_after=self.opts.retry_after,
                ) from None
            raise DeadlineExceeded(
                f"the model server at {where} did not answer within {self.opts.timeout:g} s"
            ) from None
        except httpx.ConnectError as exc:
            raise Unavailable(
                f"cannot reach the model server at {self.url}: {exc}",
                retry_after=self.opts.retry_after,
            ) from None
        except httpx.TransportError as exc:  # closed mid-reply, protocol errors
            raise Unavailable(
                f"the model server at {where} dropped the connection: {exc}",
                retry_after=self.opts.retry_after,
            ) from None
        except msgspec.DecodeError as exc:
            raise InternalError(
                f"malformed reply from the model server at {where}: {exc}"
            ) from None
