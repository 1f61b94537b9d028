"""Model specs and tuned profiles, read from YAML."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Profile:
    """How to run a model on one hardware class."""

    hardware: str
    precision: str = "fp32"
    runtime: str = ""  # the runtime on this hardware ("": the spec's runtime)
    max_batch_tokens: int = 2048
    max_batch_size: int = 64
    cost: CostModel = field(default_factory=CostModel)

    @classmethod
    def from_dict(cls, hardware: str, d: dict[str, Any]) -> Profile:
        precision = str(d.get("precision", "fp32"))
        if precision not in PRECISIONS:
            raise ValueError(f"profile {hardware}: precision must be one of {PRECISIONS}")
        return cls(
            hardware=hardware,
            precision=precision,
            runtime=str(d.get("runtime", "")),
            max_batch_tokens=int(d.get("max_batch_tokens", 2048)),
            max_batch_size=int(d.get("max_batch_size", 64)),
            cost=CostModel(**{k: float(v) for k, v in (d.get("cost") or {}).items()}),
        )


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
    profiles: dict[str, Profile] = field(default_factory=dict)
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
                description=str(d.get("description", "")),
                options=dict(d.get("options") or {}),
                runtime_options=dict(d.get("runtime_options") or {}),
                size=str(d.get("size", "")),
            )
        except KeyError as exc:
            raise ValueError(f"model spec is missing {exc.args[0]!r}") from None

    def profile(self, hardware: str) -> Profile:
        """The tuned profile for this hardware class, else ``cpu``, else defaults."""
        if hardware in self.profiles:
            return self.profiles[hardware]
        family = hardware.split("-", 1)[0]
        for name, prof in self.profiles.items():
            if name.split("-", 1)[0] == family:
                return prof
        return Profile(hardware=hardware)
