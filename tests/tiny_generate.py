"""A tiny random Llama causal LM with a byte-level tokenizer and a chat template.

Built in milliseconds for the generation family's tests: hidden size 32, 2 layers, a
vocabulary of the 256 byte symbols plus three specials, so that any text (JSON too)
can be tokenized and llguidance can constrain it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2


def build_tokenizer(path: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))


def build_llama(path: Path, *, seed: int = 0, max_positions: int = 256, hidden: int = 32) -> Path:
    """A random LlamaForCausalLM (hidden 32 unless told, 2 layers) and its tokenizer in
    ``path``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    build_tokenizer(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + 256,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=EOS_ID
    )
    model.save_pretrained(str(path))
    return path


def load_adapter(path: Path, *, max_seq_len: int = 256, **options: object) -> Any:
    """A loaded GenerateFamily on CPU over the model directory at ``path``."""
    from fleetserve.catalog import ModelSpec
    from fleetserve.families.generate import GenerateFamily
    from fleetserve.runtimes.torch import TorchRuntime

    spec = ModelSpec(
        id="tiny/llama",
        family="generate",
        runtime="torch",
        sources=(str(path),),
        max_seq_len=max_seq_len,
        options=dict(options),
    )
    adapter = GenerateFamily(spec, TorchRuntime(device="cpu"), path)
    adapter.load()
    return adapter


def envelope(task: str = "chat", accept: str = "application/json", deadline: float = 0.0) -> Any:
    import time

    from fleetserve.wire import Encoding, Envelope, Task

    return Envelope(
        request_id="req-1",
        model="tiny/llama",
        task=Task(task),
        content_type=Encoding.JSON,
        accept=Encoding(accept),
        cost_hint=1,
        deadline=deadline or time.time() + 60,
    )


def chat_body(content: str = "hello", **fields: object) -> bytes:
    import json

    body = {"model": "tiny/llama", "messages": [{"role": "user", "content": content}]}
    body.update(fields)
    return json.dumps(body).encode()


async def stop(task: Any) -> None:
    """Cancel a runner's task and wait for it to end."""
    import asyncio
    import contextlib

    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
