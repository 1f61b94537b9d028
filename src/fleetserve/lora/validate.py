"""An uploaded PEFT LoRA, checked against its base model before anything is loaded.

:func:`validate` takes the two files' bytes and returns an :class:`AdapterManifest`,
or raises an :class:`~fleetserve.wire.InvalidInput` (a 400) naming what is wrong: a
pickle or anything not safetensors, a config that is not LoRA or is for another base,
a rank or size over the limits, tensors whose shapes do not fit the base's Linear
layers, or a feature the mixed-adapter layer cannot run (DoRA, biases, per-module
ranks, ``modules_to_save``, embeddings). Only headers are parsed; no tensor is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..settings import Settings
from ..wire import InvalidInput
from .manifest import AdapterManifest, LoraModule
from .safetensors_header import check_filename, parse_header, read_file_header
from .shapes import check_shapes, is_embedding, match_modules, strip_peft
from .targets import check_targets

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_TENSOR = re.compile(r"(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight")
# config keys whose non-empty values the mixed-adapter layer cannot run
UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
    "lora_bias": "a LoRA bias (lora_bias)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "modules_to_save": "trained full modules (modules_to_save)",
    "target_parameters": "target_parameters",
    "layer_replication": "layer_replication",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "use_bdlora",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "trainable_token_indices": "trainable tokens (trainable_token_indices)",
    "megatron_config": "megatron_config",
}


@dataclass(frozen=True)
class Limits:
    """What one upload and one tenant may have (from Settings)."""

    max_rank: int = 64
    max_bytes: int = 256 * 1024 * 1024
    max_per_tenant: int = 100
    max_header_bytes: int = 4 * 1024 * 1024  # the weights' safetensors JSON header

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_rank=int(settings.max_adapter_rank),
            max_bytes=int(settings.max_adapter_bytes),
            max_per_tenant=int(settings.max_adapters_per_tenant),
            max_header_bytes=int(settings.max_safetensors_header_bytes),
        )


@dataclass(frozen=True)
class WeightsFile:
    """An uploaded ``adapter_model.safetensors`` on disk (spooled as it arrived): its
    path, size and sha256. Validation reads its header from the file, never its
    tensors; the registry moves the file into the store."""

    path: Path
    size: int
    sha256: str


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(config_sha256: str, weights_sha256: str) -> str:
    """An adapter's content hash: of both files' digests."""
    return sha256_hex(f"{CONFIG}:{config_sha256}\n{WEIGHTS}:{weights_sha256}\n".encode())


def read_config(config_bytes: bytes) -> dict[str, object]:
    try:
        config = json.loads(config_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"{CONFIG} is not JSON: {exc}", field="config") from None
    except RecursionError:  # "[[[[..." within the upload's limit: a 400, not a 500
        raise InvalidInput(f"{CONFIG} is nested too deeply", field="config") from None
    if not isinstance(config, dict):
        raise InvalidInput(f"{CONFIG} must be a JSON object", field="config")
    return config


def config_base(config: Mapping[str, object]) -> str | None:
    name = config.get("base_model_name_or_path")
    return name.strip() or None if isinstance(name, str) else None


def check_base(config: Mapping[str, object], base: str, known: Container[str]) -> None:
    """A config naming another served model is for that one; a local path or a name
    this server does not know is taken to be ``base`` (the uploader said so)."""
    named = config_base(config)
    if named is not None and named != base and named in known:
        raise InvalidInput(f"adapter is for {named}, not {base}", field="base")


def _config_checks(config: Mapping[str, object], limits: Limits) -> tuple[int, float, bool]:
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise InvalidInput(
            f"{CONFIG}: peft_type is {peft_type!r}; only LORA adapters are served",
            field="config",
        )
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise InvalidInput(
                f"{CONFIG}: {what} is not supported: the mixed-adapter layer runs plain "
                "LoRA on Linear layers",
                field="config",
            )
    bias = config.get("bias", "none")
    if bias not in ("none", None):
        raise InvalidInput(
            f"{CONFIG}: bias={bias!r} is not supported (trained biases); the mixed-adapter "
            "layer runs bias='none' only",
            field="config",
        )
    r = config.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise InvalidInput(f"{CONFIG}: r must be a positive integer, not {r!r}", field="config")
    if r > limits.max_rank:
        raise InvalidInput(
            f"{CONFIG}: rank r={r} is over this server's limit of {limits.max_rank} "
            "(max_adapter_rank)",
            field="config",
        )
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise InvalidInput(f"{CONFIG}: lora_alpha must be a number, not {alpha!r}", field="config")
    return r, float(alpha), bool(config.get("use_rslora", False))


def _pairs(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """Module (as in the file) -> {"A": tensor name, "B": tensor name}."""
    pairs: dict[str, dict[str, str]] = {}
    for name in names:
        m = _TENSOR.fullmatch(name)
        if m is None:
            if ".lora_embedding_" in name:
                why = "a LoRA on an embedding; the mixed-adapter layer runs Linear layers only"
            elif ".lora_magnitude_vector" in name:
                why = "DoRA's magnitude vector; DoRA is not supported"
            else:
                why = "not a lora_A or lora_B weight (modules_to_save or a trained head?)"
            raise InvalidInput(f"{WEIGHTS}: tensor {name!r} is {why}", field="weights")
        slot = pairs.setdefault(m["module"], {})
        if m["ab"] in slot:
            raise InvalidInput(
                f"{WEIGHTS}: module {strip_peft(m['module'])!r} has two lora_{m['ab']}",
                field="weights",
            )
        slot[m["ab"]] = name
    for module, slot in pairs.items():
        for ab in "AB":
            if ab not in slot:
                raise InvalidInput(
                    f"{WEIGHTS}: module {strip_peft(module)!r} has no lora_{ab} weight",
                    field="weights",
                )
    if not pairs:
        raise InvalidInput(f"{WEIGHTS} holds no LoRA weights", field="weights")
    return pairs


def validate(
    config_bytes: bytes,
    weights_bytes: bytes | WeightsFile,
    filenames: Iterable[str] = (),
    *,
    base_model: str,
    base_shapes: Mapping[str, tuple[int, int]],
    limits: Limits,
    known: Container[str] = (),
    allow_regex: bool = False,
) -> AdapterManifest:
    """The manifest of a valid adapter for ``base_model`` (whose Linear layers are
    ``base_shapes``); ``known`` are the served model ids (a config naming another one
    of them is for that model). A regex ``target_modules`` is refused (403) unless
    ``allow_regex`` (the uploader is an admin): see :mod:`.targets`."""
    for name in filenames:
        check_filename(name)
    size = weights_bytes.size if isinstance(weights_bytes, WeightsFile) else len(weights_bytes)
    if size > limits.max_bytes:
        raise InvalidInput(
            f"{WEIGHTS} is {size} bytes, over this server's limit of "
            f"{limits.max_bytes} (max_adapter_bytes)",
            field="weights",
        )
    config = read_config(config_bytes)
    r, alpha, rslora = _config_checks(config, limits)
    check_base(config, base_model, known)
    if isinstance(weights_bytes, WeightsFile):
        header = read_file_header(
            weights_bytes.path, what=WEIGHTS, field="weights", max_header=limits.max_header_bytes
        )
    else:
        header = parse_header(weights_bytes, what=WEIGHTS, max_header=limits.max_header_bytes)
    pairs = _pairs(header.tensors)
    dtypes = {t.dtype for t in header.tensors.values()}
    if len(dtypes) > 1:
        raise InvalidInput(f"{WEIGHTS} mixes dtypes {sorted(dtypes)}; use one", field="weights")
    for module in pairs:
        if is_embedding(strip_peft(module)):
            raise InvalidInput(
                f"target module {strip_peft(module)!r} is an embedding, not a Linear layer; "
                "the mixed-adapter layer runs LoRA on Linear layers only",
                field="weights",
            )
    check_targets(
        config.get("target_modules"), [strip_peft(m) for m in pairs], allow_regex=allow_regex
    )
    matched = match_modules(pairs, base_shapes)
    modules = []
    for module, slot in pairs.items():
        a, b = header.tensors[slot["A"]], header.tensors[slot["B"]]
        check_shapes(strip_peft(module), a.shape, b.shape, base_shapes, matched[module], r)
        modules.append(LoraModule(matched[module], slot["A"], slot["B"], a.shape, b.shape))
    modules.sort(key=lambda m: m.module)
    config_sha = sha256_hex(config_bytes)
    if isinstance(weights_bytes, WeightsFile):
        weights_sha = weights_bytes.sha256
    else:
        weights_sha = sha256_hex(weights_bytes)
    return AdapterManifest(
        base=base_model,
        rank=r,
        alpha=alpha,
        scaling=alpha / math.sqrt(r) if rslora else alpha / r,
        use_rslora=rslora,
        target_modules=tuple(m.module for m in modules),
        modules=tuple(modules),
        dtype=dtypes.pop(),
        config_sha256=config_sha,
        weights_sha256=weights_sha,
        sha256=content_hash(config_sha, weights_sha),
        bytes=len(config_bytes) + size,
    )
