"""JSON-schema constrained decoding with llguidance.

llguidance compiles a JSON schema into a grammar over the model's own tokens and
computes, before every token, the bitmask of tokens that keep the output valid (the
same library vLLM and SGLang use). Schemas are compiled and checked in ``preprocess``,
so one it cannot handle is a 400 naming why, before any compute; each sequence gets
its own matcher when it starts. llguidance's tokenizer (0.29 s to build for SmolLM2's
49,152 tokens on a 2-core AMD EPYC, most of it holding the GIL) is built at the first
response format that needs it, not at the model's load: a load, and so a miss, of a
model that serves plain text never pays it.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from ...wire import InvalidInput
from ...wire.requests import ResponseFormat

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

try:
    import llguidance
    import llguidance.hf
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "constrained decoding needs llguidance: pip install 'fleetserve[generate]'"
    ) from exc

# Compact JSON: no free whitespace between tokens, so a small model cannot wander off
# into endless newlines before the closing brace.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, object] = {"type": "object"}
FIELD = "response_format"


class Grammars:
    """Compiles response formats for one tokenizer."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_ids: list[int]) -> None:
        self._hf, self._vocab_size, self._eos_ids = hf_tokenizer, vocab_size, eos_ids
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()  # preprocess runs on several threads

    @property
    def built(self) -> bool:
        return self._tokenizer is not None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's tokenizer, built once, when a grammar first needs it."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._vocab_size, eos_token=self._eos_ids or None
                )
            return self._tokenizer

    def compile(self, fmt: ResponseFormat | None) -> tuple[str | None, dict[str, object] | None]:
        """The llguidance grammar and the JSON schema of a response format (None, None
        for plain text); an unusable schema is ``InvalidInput`` naming the reason."""
        if fmt is None or fmt.type == "text":
            return None, None
        if fmt.type == "json_object":
            schema: dict[str, object] = ANY_OBJECT
            where = FIELD
        elif fmt.type == "json_schema":
            where = f"{FIELD}.json_schema.schema"
            if fmt.json_schema is None or fmt.json_schema.schema is None:
                raise InvalidInput(
                    "response_format json_schema needs json_schema.schema", field=where
                )
            schema = dict(fmt.json_schema.schema)
        else:
            raise InvalidInput(
                f"response_format.type must be text, json_object or json_schema, not {fmt.type!r}",
                field=f"{FIELD}.type",
            )
        return self.grammar(schema, where), schema

    def grammar(self, schema: dict[str, object], where: str = FIELD) -> str:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults=JSON_OPTIONS
            )
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"the JSON schema is not valid: {exc}", field=where) from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer
        )
        if is_error:
            why = "; ".join(messages) or "unknown error"
            raise InvalidInput(
                f"the JSON schema cannot be enforced by constrained decoding: {why}", field=where
            )
        return grammar

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence."""
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"grammar failed to load: {m.get_error()}")
        return m
