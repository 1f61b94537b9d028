"""What a validated adapter is (:class:`AdapterManifest`) and what the registry holds
about it (:class:`AdapterRecord`), with the JSON form kept in the store's ``info.json``."""

from __future__ import annotations

import builtins
import json
from dataclasses import asdict, dataclass
from typing import Any

from ..wire import AdapterId


@dataclass(frozen=True, slots=True)
class LoraModule:
    """One adapted Linear layer: its base module name and its two tensors in the file."""

    module: str  # the base model's module name (as in its weights)
    a: str  # tensor name of lora_A in adapter_model.safetensors
    b: str  # tensor name of lora_B
    a_shape: tuple[int, ...]  # [r, in_features]
    b_shape: tuple[int, ...]  # [out_features, r]


@dataclass(frozen=True, slots=True)
class AdapterManifest:
    """A valid adapter: its base, rank and scaling, and where each tensor goes."""

    base: str
    rank: int
    alpha: float
    scaling: float  # alpha / r, or alpha / sqrt(r) with rsLoRA
    use_rslora: bool
    target_modules: tuple[str, ...]  # base module names, sorted
    modules: tuple[LoraModule, ...]
    dtype: str  # F32, F16 or BF16
    config_sha256: str
    weights_sha256: str
    sha256: str  # the content hash: of both files' digests
    bytes: int  # both files

    @property
    def tensors(self) -> dict[str, str]:
        """Tensor name in the file -> the base module it adapts."""
        out = {m.a: m.module for m in self.modules}
        out.update({m.b: m.module for m in self.modules})
        return out

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AdapterManifest:
        modules = tuple(
            LoraModule(m["module"], m["a"], m["b"], tuple(m["a_shape"]), tuple(m["b_shape"]))
            for m in d["modules"]
        )
        return cls(
            base=str(d["base"]),
            rank=int(d["rank"]),
            alpha=float(d["alpha"]),
            scaling=float(d["scaling"]),
            use_rslora=bool(d["use_rslora"]),
            target_modules=tuple(d["target_modules"]),
            modules=modules,
            dtype=str(d["dtype"]),
            config_sha256=str(d["config_sha256"]),
            weights_sha256=str(d["weights_sha256"]),
            sha256=str(d["sha256"]),
            bytes=int(d["bytes"]),
        )


@dataclass(frozen=True, slots=True)
class AdapterRecord:
    """A registered adapter: its id (with its version) and manifest, when and how."""

    id: AdapterId
    manifest: AdapterManifest
    created: float  # epoch seconds
    pinned: bool = False

    @property
    def base(self) -> str:
        return self.manifest.base

    @property
    def rank(self) -> int:
        return self.manifest.rank

    @property
    def alpha(self) -> float:
        return self.manifest.alpha

    @property
    def scaling(self) -> float:
        return self.manifest.scaling

    @property
    def target_modules(self) -> tuple[str, ...]:
        return self.manifest.target_modules

    @property
    def sha256(self) -> str:
        return self.manifest.sha256

    @property
    def bytes(self) -> int:
        return self.manifest.bytes

    @property
    def version(self) -> int:
        assert self.id.version is not None
        return self.id.version

    def to_dict(self) -> dict[str, object]:
        """The API's view (``GET /v1/adapters/{id}``)."""
        return {
            "object": "adapter",
            "id": str(self.id),
            "tenant": self.id.tenant,
            "name": self.id.name,
            "version": self.id.version,
            "base": self.base,
            "model": f"{self.base}:{self.id}",  # what to call it as
            "rank": self.rank,
            "alpha": self.alpha,
            "scaling": self.scaling,
            "target_modules": list(self.target_modules),
            "dtype": self.manifest.dtype,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "created": self.created,
            "pinned": self.pinned,
        }

    def dumps(self) -> builtins.bytes:
        """The ``info.json`` the store keeps (the commit marker of an upload)."""
        body = {
            "id": str(self.id),
            "created": self.created,
            "pinned": self.pinned,
            "manifest": self.manifest.to_json(),
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: builtins.bytes) -> AdapterRecord:
        from ..wire import parse_adapter_id

        d = json.loads(data)
        return cls(
            id=parse_adapter_id(d["id"]),
            manifest=AdapterManifest.from_json(d["manifest"]),
            created=float(d["created"]),
            pinned=bool(d.get("pinned", False)),
        )
