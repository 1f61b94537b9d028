"""The generation family: causal LMs behind ``/v1/chat/completions`` and ``/v1/generate``.

With the torch runtime the model runs here, in the continuous-batching :class:`Engine`
(driven by ``worker.gen_runner.GenerationRunner``; ``forward`` runs a batch to the end
for the plain runner). With ``runtime: external`` the tokenizer stays here and each
sequence goes to SGLang or vLLM through ``runtime.generate`` (a
:class:`~fleetserve.runtimes.GeneratingRuntime`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...catalog import ModelSpec
from ...runtimes import (
    Autocasting,
    BatchGeneratingRuntime,
    GeneratingRuntime,
    Generation,
    Head,
    Runtime,
    SamplingParams,
)
from ...wire import Envelope, InvalidInput, Task
from ...wire.codec import TypedDecoder
from ...wire.requests import ChatCompletionRequest, GenerateRequest
from ..base import Family, Prepared
from . import chat
from .chat import GenItem, GenOptions, GenOutput

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    from ...lora.mixed import LoraBank
    from .constrain import Grammars
    from .engine import Engine, Seq

_CHAT = TypedDecoder(ChatCompletionRequest)
_GENERATE = TypedDecoder(GenerateRequest)
DEFAULT_MAX_TOKENS = 512


class GenerateFamily(Family[GenItem, GenOptions, GenOutput]):
    tasks = frozenset({Task.CHAT, Task.GENERATE})

    def __init__(self, spec: ModelSpec, runtime: Runtime, path: Path) -> None:
        self.spec = spec
        self.runtime = runtime
        self.path = path
        self._external = runtime if isinstance(runtime, GeneratingRuntime) else None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._decoder: Tokenizer | None = None
        self.model: Any = None  # the torch module (local runtime only)
        self._bank: LoraBank | None = None
        self.grammars: Grammars | None = None
        self.context = spec.max_seq_len  # prompt + generated tokens
        self.eos_ids: list[int] = []
        self.vocab_size = 0
        opts = spec.options
        self.default_max_tokens = int(opts.get("max_tokens", DEFAULT_MAX_TOKENS))
        self.default_temperature = float(opts.get("temperature", 1.0))
        self.default_top_p = float(opts.get("top_p", 1.0))
        # prompt tokens per forward pass of a long prompt's prefill (None: the engine's)
        chunk = opts.get("prefill_chunk")
        self.prefill_chunk = int(chunk) if chunk is not None else None

    @property
    def external(self) -> bool:
        """Whether the runtime generates whole sequences itself (``runtime: external``):
        then the tokenizer stays here and the model runs on the server."""
        return self._external is not None

    @property
    def external_runtime(self) -> GeneratingRuntime:
        """The runtime that generates, when it is :attr:`external`."""
        if self._external is None:
            raise RuntimeError(f"model {self.spec.id} generates here, not on an external runtime")
        return self._external

    # -- lifecycle ------------------------------------------------------------------------
    def load(self) -> None:
        from .loading import eos_ids, load_causal_lm, load_config, load_tokenizer, own_copy

        self.tokenizer = load_tokenizer(self.path)
        # the generation thread decodes with its own copy: the Rust tokenizer is not
        # shared with preprocess, which tokenizes on other threads meanwhile
        self._decoder = own_copy(self.tokenizer)
        config = load_config(self.path)
        if self.external:
            self.runtime.load(self.path, Head.BASE)
        else:
            self.model = load_causal_lm(self.path, self.runtime)
            config = self.model.config
        limit = getattr(config, "max_position_embeddings", None)
        self.context = min(self.spec.max_seq_len, int(limit)) if limit else self.spec.max_seq_len
        self.eos_ids = eos_ids(self.path, self.tokenizer, config)
        self.vocab_size = max(len(self.tokenizer), int(getattr(config, "vocab_size", 0) or 0))
        from .constrain import Grammars

        self.grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_ids)

    def warmup(self) -> None:
        if self.external:
            return
        assert self.tokenizer is not None
        ids = self.tokenizer("warm up", add_special_tokens=False)["input_ids"] or [0]
        self.forward([GenItem(ids, SamplingParams(max_tokens=2, temperature=0.0))])

    def kv_cache_bytes(self, tokens: int) -> int:
        """The KV cache of ``tokens`` tokens at this model's layer and head shapes
        (keys and values, each layer, each key-value head), in the dtype its
        activations run at: 2 bytes under fp16 or bf16, else 4. 0 on an external
        runtime (the server holds it) or before the model is loaded."""
        if self.model is None:
            return 0
        c = self.model.config
        heads = int(getattr(c, "num_attention_heads", 0) or 0)
        kv_heads = int(getattr(c, "num_key_value_heads", 0) or heads)
        head_dim = int(getattr(c, "head_dim", 0) or (c.hidden_size // heads if heads else 0))
        layers = int(getattr(c, "num_hidden_layers", 0) or 0)
        size = 2 if self.runtime.precision in ("fp16", "bf16") else 4
        return 2 * layers * kv_heads * head_dim * max(0, tokens) * size

    def memory_bytes(self) -> int:
        if self.model is None:
            return self.runtime.memory_bytes() if self.external else 0
        return int(sum(p.numel() * p.element_size() for p in self.model.parameters()))

    # -- preprocess -----------------------------------------------------------------------
    def preprocess(self, envelope: Envelope, body: bytes) -> Prepared[GenItem, GenOptions]:
        if self.tokenizer is None or self.grammars is None:
            raise RuntimeError("adapter is not loaded")
        req: ChatCompletionRequest | GenerateRequest
        if envelope.task is Task.CHAT:
            creq: ChatCompletionRequest = _CHAT.decode(body, envelope.content_type)
            if creq.n != 1:
                raise InvalidInput("n must be 1", field="n")
            prompt, where = self._chat_prompt(creq), "messages"
            mt, mt_field = creq.max_tokens, "max_tokens"
            if creq.max_completion_tokens is not None:
                mt, mt_field = creq.max_completion_tokens, "max_completion_tokens"
            include_usage = bool(creq.stream_options and creq.stream_options.include_usage)
            prefix, req = "chatcmpl-", creq
        else:
            greq: GenerateRequest = _GENERATE.decode(body, envelope.content_type)
            if not greq.prompt:
                raise InvalidInput("prompt must not be empty", field="prompt")
            prompt, where = self.tokenizer(greq.prompt)["input_ids"], "prompt"
            mt, mt_field, include_usage, prefix, req = (
                greq.max_tokens,
                "max_tokens",
                True,
                "gen-",
                greq,
            )
        room = self.context - len(prompt)
        if room < 1:
            raise InvalidInput(
                f"{where}: the prompt is {len(prompt)} tokens, and the model's context is "
                f"{self.context} tokens, which leaves no room to generate",
                field=where,
            )
        warnings: list[dict[str, object]] = []
        if mt is None:
            max_tokens = min(self.default_max_tokens, room)
        elif mt < 1:
            raise InvalidInput(f"{mt_field} must be at least 1", field=mt_field)
        elif mt > room:
            max_tokens = room
            warnings.append(chat.clamp_warning(mt_field, mt, room, self.context))
        else:
            max_tokens = mt
        temperature = self.default_temperature if req.temperature is None else req.temperature
        top_p = self.default_top_p if req.top_p is None else req.top_p
        chat.check_sampling(temperature, top_p)
        grammar, schema = self.grammars.compile(req.response_format)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=req.seed,
            stop=chat.stops(req.stop),
            json_schema=schema,
        )
        opts = GenOptions(
            task=envelope.task,
            id=prefix + envelope.request_id,
            model=self.spec.id,
            created=int(time.time()),
            stream=req.stream,
            include_usage=include_usage,
            warnings=tuple(warnings),
        )
        item = GenItem(list(prompt), params, grammar)
        return Prepared(items=[item], options=opts, tokens=len(prompt), lengths=[len(item)])

    def _chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        assert self.tokenizer is not None
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInput(
                f"model {self.spec.id!r} has no chat template; use /v1/generate/{self.spec.id}",
                field="model",
            )
        msgs = chat.messages(req.messages)
        try:
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # jinja's raise_exception: roles out of order, ...
            raise InvalidInput(
                f"messages: the chat template refused them: {exc}", field="messages"
            ) from None
        ids: list[int] = self.tokenizer(str(text), add_special_tokens=False)["input_ids"]
        return ids

    # -- forward (a whole batch to the end; the GenerationRunner batches continuously) ---
    def forward(self, items: Sequence[GenItem]) -> list[GenOutput]:
        if self.external:
            runtime = self.external_runtime
            if not isinstance(runtime, BatchGeneratingRuntime):
                raise TypeError(f"runtime {self.runtime.name!r} does not generate batches")
            gens = runtime.generate_batch([(it.prompt, it.params) for it in items])
            return [GenOutput(g) for g in gens]
        engine = self.engine()
        seqs = [self.sequence(it) for it in items]
        for s in seqs:
            engine.add(s)
        while not engine.idle:
            engine.step()
        return [GenOutput(self.generation(s)) for s in seqs]

    @property
    def takes_adapters(self) -> bool:
        """LoRA adapters run on the local model, not on the external runtime."""
        return not self.external

    def lora_bank(self) -> LoraBank:
        """The loaded model's LoRA adapters, mixed per sequence (local runtime only)."""
        if self._bank is None:
            if self.external:
                raise InvalidInput(
                    f"model {self.spec.id!r} runs on the external runtime, which takes no "
                    "adapters here",
                    field="adapter",
                )
            if self.model is None:
                raise RuntimeError("adapter is not loaded")
            from ...lora.mixed import LoraBank
            from ...lora.shapes import match_modules

            dtype = next(self.model.parameters()).dtype
            if self.runtime.precision == "bf16":  # bf16 autocast on CPU: fp32 weights
                import torch

                dtype = torch.bfloat16
            self._bank = LoraBank(self.model, match_modules, dtype=dtype)
        return self._bank

    def engine(self) -> Engine:
        """A fresh continuous-batching engine over the loaded model."""
        from .engine import PREFILL_CHUNK, Engine

        autocast = self.runtime.autocast if isinstance(self.runtime, Autocasting) else None
        return Engine(
            self.model,
            eos_ids=self.eos_ids,
            vocab_size=self.vocab_size,
            device=str(self.runtime.device),
            pad_id=self.eos_ids[0] if self.eos_ids else 0,
            autocast=autocast,
            bank=self.lora_bank() if self.model is not None else None,
            prefill_chunk=self.prefill_chunk or PREFILL_CHUNK,
        )

    def sequence(self, item: GenItem, tag: Any = None) -> Seq:
        from .engine import Seq
        from .sampling import TextStream

        assert self.grammars is not None
        matcher = self.grammars.matcher(item.grammar) if item.grammar else None
        stream = TextStream(self.decode, item.params.stop)
        return Seq(item.prompt, item.params, stream, matcher=matcher, tag=tag)

    def decode(self, ids: Sequence[int]) -> str:
        assert self._decoder is not None
        text: str = self._decoder.decode(list(ids), skip_special_tokens=True)
        return text

    @staticmethod
    def generation(s: Seq) -> Generation:
        return Generation(s.text, s.finish_reason or "stop", len(s.prompt), len(s.out))

    # -- postprocess and streaming --------------------------------------------------------
    def postprocess(
        self, envelope: Envelope, prepared: Prepared[GenItem, GenOptions], outputs: list[GenOutput]
    ) -> bytes:
        o = prepared.options
        out = outputs[0]
        if o.stream:
            if out.streamed:
                return chat.closing(o, out.generation)
            return chat.whole_stream(o, out.generation)
        return chat.body(o, out.generation, envelope.accept)

    @staticmethod
    def stream_open(prepared: Prepared[GenItem, GenOptions]) -> bytes:
        return chat.opening(prepared.options)

    @staticmethod
    def stream_text(prepared: Prepared[GenItem, GenOptions], text: str) -> bytes:
        return chat.chunk(prepared.options, {"content": text})
