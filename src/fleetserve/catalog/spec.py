"""Model specs and tuned profiles, read from YAML."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..wire import InvalidInput, parse_duration
from .adapter_specs import AdapterDecl, parse_adapters
from .names import FAMILY_NAMES, RUNTIMES

PRECISIONS = ("fp32", "bf16", "fp16", "int8")  # int8: ONNX Runtime, behind a quality guard


@dataclass(frozen=True)
class CostModel:
    """Predicted batch cost in ms: fixed + per real token + per padded slot.

    Padded slots are ``max_len * batch_size``; the fit comes from the autotuner.
    """

    fixed_ms: float = 1.0
    per_token_ms: float = 0.0
    per_padded_token_ms: float = 0.1

    def predict_ms(self, tokens: int, max_len: int, batch_size: int) -> float:
        padded = max_len * batch_size
        return self.fixed_ms + self.per_token_ms * tokens + self.per_padded_token_ms * padded

    def tokens_within(self, ms: float) -> int:
        """The largest batch (padded tokens, a multiple of 64, at least 64) predicted to
        run within ``ms``. Dense batches (every row full) are the worst case, so real
        tokens count as padded ones."""
        per_token = self.per_token_ms + self.per_padded_token_ms
        if per_token <= 0:
            return 1 << 30
        return max(64, int(max(0.0, ms - self.fixed_ms) / per_token) // 64 * 64)

    def efficient_tokens(self, max_batch_tokens: int, share: float) -> int:
        """The smallest batch (padded tokens, a multiple of 64) predicted to run at
        ``share`` of the per-token rate of a full ``max_batch_tokens`` batch. Solved
        from ``P / (f + sP) >= share * M / (f + sM)``, dense batches as above."""
        s = self.per_token_ms + self.per_padded_token_ms
        f, m = self.fixed_ms, float(max_batch_tokens)
        if f <= 0 or s <= 0:
            return 64  # no fixed cost to amortize: any batch runs at the full rate
        need = share * m * f / (f + s * m * (1.0 - share))
        return min(max_batch_tokens, max(64, -(-int(need) // 64) * 64))

    def interactive_cap(self, max_batch_tokens: int) -> int:
        """The batch cap while interactive work waits: the largest batch predicted to
        run within ``INTERACTIVE_BATCH_MS`` (a query waits for at most one), unless a
        batch that small cannot amortize the fixed cost: then the smallest that keeps
        ``INTERACTIVE_SHARE`` of a full batch's rate. On cpu-amx a 110M model's 25 ms
        batch is 64 tokens, at about half its full rate, and the cap held for seconds
        after each query cost its bulk traffic a fifth of its throughput."""
        cap = max(
            self.tokens_within(INTERACTIVE_BATCH_MS),
            self.efficient_tokens(max_batch_tokens, INTERACTIVE_SHARE),
        )
        return min(cap, max_batch_tokens)


INTERACTIVE_BATCH_MS = 25.0  # a batch that runs while a query waits should take about this
# ... unless it runs below this share of a full batch's rate per token (see interactive_cap)
INTERACTIVE_SHARE = 0.85


PROFILE_FIELDS = (
    "precision",
    "runtime",
    "threads",
    "processes",
    "max_batch_tokens",
    "max_batch_size",
    "cost",
    "memory_bytes",
    "interactive_cost",
    "priority_cap",
    "adapters",
)
# where a tuned model's LoRA adapters run: in its runtime's graph, with slots, or on a
# torch copy ("": not judged; a server judges the slots when they are made)
ADAPTER_PATHS = ("", "in_graph", "torch")
COST_FIELDS = ("fixed_ms", "per_token_ms", "per_padded_token_ms")


@dataclass(frozen=True)
class Profile:
    """How to run a model on one hardware class."""

    hardware: str
    precision: str = "fp32"
    runtime: str = ""  # the runtime on this hardware ("": the spec's runtime)
    max_batch_tokens: int = 2048
    max_batch_size: int = 64
    cost: CostModel = field(default_factory=CostModel)
    threads: int = 0  # intra-op threads per process (0: the runtime's default, all cores)
    processes: int = 1  # worker processes per device (fleetserve worker --devices)
    memory_bytes: int = 0  # measured footprint: weights plus the activation peak (0: unknown)
    # requests predicted to cost at most this many tokens are interactive by default
    interactive_cost: int = 2048
    # the largest batch (padded tokens) while interactive work waits; `fleetserve tune`
    # sets it from the fitted cost model so that such a batch runs in about 25 ms
    # (0: see ``Choice.interactive_batch_tokens``)
    priority_cap: int = 0
    # where adapters run (one of ADAPTER_PATHS): the tuner's verdict of the slots' gate
    adapters: str = ""

    @classmethod
    def from_dict(cls, hardware: str, d: Mapping[str, object]) -> Profile:
        """Read a profile; a wrong or unknown field is a ``ValueError`` naming it."""
        if not isinstance(d, dict):
            raise ValueError(f"profile {hardware}: must be a mapping, not {type(d).__name__}")
        unknown = sorted(set(d) - set(PROFILE_FIELDS))
        if unknown:
            raise ValueError(
                f"profile {hardware}: unknown field {unknown[0]!r} "
                f"(known: {', '.join(PROFILE_FIELDS)})"
            )
        precision = str(d.get("precision", "fp32"))
        if precision not in PRECISIONS:
            raise ValueError(
                f"profile {hardware}: field precision must be one of {', '.join(PRECISIONS)}, "
                f"not {precision!r}"
            )
        runtime = str(d.get("runtime", "") or "")
        if runtime and runtime not in RUNTIMES:
            raise ValueError(
                f"profile {hardware}: field runtime must be one of {', '.join(RUNTIMES)}, "
                f"not {runtime!r}"
            )
        adapters = d.get("adapters", "") or ""
        if adapters not in ADAPTER_PATHS:
            raise ValueError(
                f"profile {hardware}: field adapters must be in_graph or torch, not {adapters!r}"
            )
        cost = d.get("cost") or {}
        if not isinstance(cost, dict) or set(cost) - set(COST_FIELDS):
            raise ValueError(f"profile {hardware}: field cost takes {', '.join(COST_FIELDS)}")
        return cls(
            hardware=hardware,
            precision=precision,
            runtime=runtime,
            max_batch_tokens=_count(d, "max_batch_tokens", 2048, hardware),
            max_batch_size=_count(d, "max_batch_size", 64, hardware),
            cost=CostModel(**{k: _number(cost, k, hardware) for k in cost}),
            threads=_count(d, "threads", 0, hardware, minimum=0),
            processes=_count(d, "processes", 1, hardware),
            memory_bytes=_count(d, "memory_bytes", 0, hardware, minimum=0),
            interactive_cost=_count(d, "interactive_cost", 2048, hardware, minimum=0),
            priority_cap=_count(d, "priority_cap", 0, hardware, minimum=0),
            adapters=str(adapters),
        )

    def to_dict(self) -> dict[str, object]:
        """The fields a profile file holds (``hardware`` is its key or file name)."""
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "threads": self.threads,
            "processes": self.processes,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_size": self.max_batch_size,
            "cost": {
                "fixed_ms": round(self.cost.fixed_ms, 6),
                "per_token_ms": round(self.cost.per_token_ms, 6),
                "per_padded_token_ms": round(self.cost.per_padded_token_ms, 6),
            },
            "memory_bytes": self.memory_bytes,
            "interactive_cost": self.interactive_cost,
            "priority_cap": self.priority_cap,
        } | ({"adapters": self.adapters} if self.adapters else {})


def _count(d: Mapping[str, object], key: str, default: int, where: str, minimum: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"profile {where}: field {key} must be an integer >= {minimum}, not {v!r}")
    return v


def _number(d: Mapping[str, object], key: str, where: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"profile {where}: field cost.{key} must be a number >= 0, not {v!r}")
    return float(v)


SPEC_FIELDS = (
    "id",
    "family",
    "runtime",
    "sources",
    "source",  # one source, the same as sources: [it]
    "pooling",
    "normalize",
    "max_seq_len",
    "dimensions",
    "pinned",
    "keep_alive",
    "max_keep_alive",
    "profiles",
    "budgets",
    "description",
    "options",
    "runtime_options",
    "size",
    "adapters",  # LoRA adapters registered at start: [{name, source, pinned}]
)
POOLINGS = ("mean", "cls", "none")
KEEP_ALIVE_MAX = 86400.0  # a day; for longer, `pinned: true`


@dataclass(frozen=True)
class ModelSpec:
    """One catalog entry: where the weights are and how the family should treat them."""

    id: str
    family: str
    runtime: str
    sources: tuple[str, ...]
    pooling: str = "mean"
    normalize: bool = True
    max_seq_len: int = 512
    dimensions: int | None = None
    pinned: bool = False
    profiles: dict[str, Profile] = field(default_factory=dict)  # declared, by class or kind
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)  # rules' starting points
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # family-specific settings
    runtime_options: dict[str, Any] = field(default_factory=dict)  # e.g. an external URL
    size: str = ""  # declared size for `fleetserve models` when the weights are absent
    keep_alive: float = 0.0  # seconds resident after its last use (0: evictable when idle)
    max_keep_alive: float | None = None  # the most X-Keep-Alive may ask (None: the setting's)
    adapters: tuple[AdapterDecl, ...] = ()  # declared LoRA adapters (catalog/adapters.py)
    # the keys the spec file gave ("source" counts as "sources"); the catalog fills the
    # others it can from the model's own files (catalog/complete.py). A spec built in
    # code gave them all.
    given: frozenset[str] = field(default=frozenset(SPEC_FIELDS), compare=False, repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ModelSpec:
        """Read a spec strictly: an unknown key, family, runtime or pooling, a missing
        ``id`` or a value of the wrong type is a one-line ``ValueError`` naming the key
        and what it allows (the caller adds the file)."""
        if not isinstance(d, dict):
            raise ValueError(
                f"a model spec must be a mapping of keys ({', '.join(SPEC_FIELDS)}), "
                f"not {type(d).__name__}"
            )
        for key in d:
            if key not in SPEC_FIELDS:
                raise ValueError(
                    f"unknown key {str(key)!r}{_did_you_mean(str(key), SPEC_FIELDS)}; "
                    f"allowed: {', '.join(SPEC_FIELDS)}"
                )
        model_id = d.get("id")
        if model_id is None:
            raise ValueError(
                "missing 'id' (required: the model's name that requests use, e.g. org/name)"
            )
        if not isinstance(model_id, str) or not model_id.strip():
            raise ValueError(f"key 'id' must be a non-empty string, not {model_id!r}")
        if ":" in model_id:
            raise ValueError(
                f"key 'id' {model_id!r} has a ':', which calls an adapter (base:adapter); "
                "name the model without one"
            )
        family = _choice(d, "family", "dense", FAMILY_NAMES)
        runtime = _choice(d, "runtime", "torch", RUNTIMES)
        pooling = _choice(d, "pooling", "mean", POOLINGS)
        profiles = {
            str(hw): Profile.from_dict(str(hw), p or {})
            for hw, p in _mapping(d, "profiles", "hardware classes to profiles").items()
        }
        budgets: dict[str, dict[str, Any]] = {}
        for kind, b in _mapping(d, "budgets", "hardware kinds to budgets").items():
            Profile.from_dict(f"budgets.{kind}", b or {})  # validated here, applied by the rules
            budgets[str(kind)] = dict(b or {})
        dimensions = d.get("dimensions")
        if dimensions is not None:
            dimensions = _integer(d, "dimensions", 0)
        try:
            keep_alive = parse_duration(
                d.get("keep_alive", 0.0), "keep_alive", maximum=KEEP_ALIVE_MAX
            )
            raw_max = d.get("max_keep_alive")
            max_keep_alive = (
                None
                if raw_max is None
                else parse_duration(raw_max, "max_keep_alive", maximum=KEEP_ALIVE_MAX)
            )
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return cls(
            id=model_id,
            family=family,
            runtime=runtime,
            sources=_sources(d),
            pooling=pooling,
            normalize=_flag(d, "normalize", True),
            max_seq_len=_integer(d, "max_seq_len", 512),
            dimensions=dimensions,
            pinned=_flag(d, "pinned", False),
            profiles=profiles,
            budgets=budgets,
            description=_text(d, "description"),
            options=_mapping(d, "options", "family-specific settings"),
            runtime_options=_mapping(d, "runtime_options", "runtime settings"),
            size=_text(d, "size"),
            keep_alive=keep_alive,
            max_keep_alive=max_keep_alive,
            adapters=parse_adapters(d.get("adapters")),
            given=frozenset("sources" if k == "source" else str(k) for k in d),
        )


def _did_you_mean(word: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(d: Mapping[str, object], key: str, default: str, allowed: tuple[str, ...]) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or v not in allowed:
        hint = _did_you_mean(v, allowed) if isinstance(v, str) else ""
        raise ValueError(f"key {key!r}: unknown {key} {v!r}{hint}; allowed: {', '.join(allowed)}")
    return v


def _integer(d: Mapping[str, object], key: str, default: int, minimum: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"key {key!r} must be an integer >= {minimum}, not {v!r}")
    return v


def _flag(d: Mapping[str, object], key: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"key {key!r} must be true or false, not {v!r}")
    return v


def _text(d: Mapping[str, object], key: str) -> str:
    v = d.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise ValueError(f"key {key!r} must be a string, not {v!r}")
    return v


def _mapping(d: Mapping[str, object], key: str, what: str) -> dict[str, Any]:
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"key {key!r} must be a mapping of {what}, not {type(v).__name__}")
    return dict(v)


SOURCE_FORMS = "a local path, file://, package:<module>/<dir>, hf:<org>/<name>, s3://, gguf:"


def _sources(d: Mapping[str, object]) -> tuple[str, ...]:
    if "sources" in d and "source" in d:
        raise ValueError("keys 'sources' and 'source' both given; allowed: one of them")
    key = "source" if "source" in d else "sources"
    src = d.get(key)
    if src is None:
        raise ValueError(
            f"needs a source: key 'sources' lists where the weights are ({SOURCE_FORMS})"
        )
    items = [src] if isinstance(src, str) else src
    if not isinstance(items, list) or not all(isinstance(s, str) and s.strip() for s in items):
        raise ValueError(
            f"key {key!r} must be a source or a list of sources ({SOURCE_FORMS}), not {src!r}"
        )
    if not items:
        raise ValueError(
            f"needs a source: key 'sources' lists where the weights are ({SOURCE_FORMS})"
        )
    return tuple(items)
