"""Model specs and tuned profiles, read from YAML."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..runtimes import RUNTIMES

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


PROFILE_FIELDS = (
    "precision",
    "runtime",
    "threads",
    "processes",
    "max_batch_tokens",
    "max_batch_size",
    "cost",
    "memory_bytes",
)
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

    @classmethod
    def from_dict(cls, hardware: str, d: dict[str, Any]) -> Profile:
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
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields a profile file holds (``hardware`` is its key or file name)."""
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            "threads": self.threads,
            "processes": self.processes,
            "max_batch_tokens": self.max_batch_tokens,
            "max_batch_size": self.max_batch_size,
            "cost": {k: round(getattr(self.cost, k), 6) for k in COST_FIELDS},
            "memory_bytes": self.memory_bytes,
        }


def _count(d: dict[str, Any], key: str, default: int, where: str, minimum: int = 1) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"profile {where}: field {key} must be an integer >= {minimum}, not {v!r}")
    return v


def _number(d: dict[str, Any], key: str, where: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"profile {where}: field cost.{key} must be a number >= 0, not {v!r}")
    return float(v)


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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        try:
            src = d.get("sources", d.get("source"))
            sources = (src,) if isinstance(src, str) else tuple(str(s) for s in src or ())
            if not sources:
                raise ValueError("needs a source")
            pooling = str(d.get("pooling", "mean"))
            if pooling not in ("mean", "cls", "none"):
                raise ValueError(f"pooling must be mean, cls or none, not {pooling!r}")
            profiles = {
                str(hw): Profile.from_dict(str(hw), p or {})
                for hw, p in (d.get("profiles") or {}).items()
            }
            budgets = {str(k): dict(b or {}) for k, b in (d.get("budgets") or {}).items()}
            for kind, b in budgets.items():
                Profile.from_dict(f"budgets.{kind}", b)  # validated here, applied by the rules
            return cls(
                id=str(d["id"]),
                family=str(d.get("family", "dense")),
                runtime=str(d.get("runtime", "torch")),
                sources=sources,
                pooling=pooling,
                normalize=bool(d.get("normalize", True)),
                max_seq_len=int(d.get("max_seq_len", 512)),
                dimensions=int(d["dimensions"]) if d.get("dimensions") else None,
                pinned=bool(d.get("pinned", False)),
                profiles=profiles,
                budgets=budgets,
                description=str(d.get("description", "")),
                options=dict(d.get("options") or {}),
                runtime_options=dict(d.get("runtime_options") or {}),
                size=str(d.get("size", "")),
            )
        except KeyError as exc:
            raise ValueError(f"model spec is missing {exc.args[0]!r}") from None
