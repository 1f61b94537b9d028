"""What to run where nothing was tuned: rules from the hardware's features.

- **Precision**: bf16 where AMX is present (``cpu-amx``), fp16 where AVX512-FP16 is
  (``cpu-avx512fp16``) and on NVIDIA GPUs, fp32 otherwise. A spec's ``budgets`` may
  state a precision for a kind of device (DeBERTa-v3 overflows in fp16, so its cuda
  budget says bf16); that wins over the rule. Generation runs fp32 on CPUs: a
  different precision changes greedy tokens, which the gate would reject anyway.
- **Runtime**: OpenVINO for the families that convert, on ``cpu-amx`` when its extra
  is installed (its AMX bf16 kernels measured 1.8x torch's bf16 autocast on MiniLM);
  otherwise the spec's runtime.
- **Budgets and cost**: the spec's ``budgets`` for the kind (``cpu`` or ``cuda``),
  else the family's defaults below.
- **Always inside the quality gate**: a rule profile below fp32 is checked against an
  fp32 reference when the model loads, and runs fp32 instead if it fails
  (``tune.quality``).

The **fallback chain** of a class lists the classes whose tuned profiles may stand in
for it: those whose features this class also has *and* whose rule precision is the
same, nearest first. A fallback never crosses a feature that changes which precision
wins (AMX, AVX512-FP16): a profile tuned where fp16 won would be 0.4x of the best on
an AMX machine. ``cuda-smXY`` falls back to lower minor versions of the same major.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .hardware import CPU_CLASSES, Hardware
from .spec import ModelSpec, Profile

OPENVINO_FAMILIES = frozenset(
    {"dense", "sparse", "multivector", "cross_encoder", "ner", "zero_shot"}
)
# family defaults when the spec gives no budgets: (max_batch_tokens, max_batch_size)
_CPU_BUDGET = {"generate": (8192, 8), "image": (2048, 16)}
_CUDA_BUDGET = {"generate": (65536, 64), "image": (32768, 256)}


def class_precision(hardware_class: str) -> str:
    """The rule's precision for a class name."""
    if hardware_class == "cpu-amx":
        return "bf16"
    if hardware_class == "cpu-avx512fp16" or hardware_class.startswith("cuda"):
        return "fp16"
    return "fp32"


def fallback_chain(hardware_class: str) -> tuple[str, ...]:
    """Classes whose tuned profiles stand in for ``hardware_class``, nearest first."""
    if hardware_class.startswith("cuda-sm") and hardware_class[7:].isdigit():
        cc = hardware_class[7:]
        major, minor = cc[:-1], int(cc[-1])
        return tuple(f"cuda-sm{major}{m}" for m in range(minor - 1, -1, -1))
    x86 = [c for c in CPU_CLASSES if c != "cpu-arm64"]
    if hardware_class not in x86:
        return ()
    mine = class_precision(hardware_class)
    below = x86[x86.index(hardware_class) + 1 :]
    return tuple(c for c in below if class_precision(c) == mine)


def openvino_installed() -> bool:
    return not missing_extra("openvino")


# a runtime -> (the module it needs, the extra that installs it)
NEEDS = {
    "torch": ("torch", "torch"),
    "torch_compile": ("torch", "torch"),
    "onnx": ("onnxruntime", "onnx"),
    "openvino": ("openvino", "openvino"),
}


def missing_extra(runtime: str) -> str:
    """The extra a runtime needs and this install lacks, or "" if it can run here."""
    module, extra = NEEDS.get(runtime, ("", ""))
    return extra if module and importlib.util.find_spec(module) is None else ""


def rule_profile(spec: ModelSpec, hw: Hardware, hardware_class: str) -> tuple[Profile, str]:
    """The rule's profile for ``spec`` on this machine, and a sentence saying why."""
    kind = "cuda" if hardware_class.startswith("cuda") else "cpu"
    budget: dict[str, Any] = dict(spec.budgets.get(kind, {}))
    why: list[str] = []
    if "precision" in budget:
        precision = str(budget["precision"])
        why.append(f"{precision} as the spec's {kind} budget says")
    elif spec.family == "generate" and kind == "cpu":
        precision = "fp32"
        why.append("fp32 for generation on a CPU")
    else:
        precision = class_precision(hardware_class)
        why.append(f"{precision} for {hardware_class}")
    runtime = ""
    if (
        hardware_class == "cpu-amx"
        and spec.family in OPENVINO_FAMILIES
        and spec.runtime in ("torch", "onnx", "openvino")
        and openvino_installed()
    ):
        runtime = "openvino"
        why.append("on OpenVINO (AMX)")
    if precision == "bf16" and spec.runtime == "onnx" and not runtime:
        precision = "fp32"  # ONNX Runtime runs fp32 or int8
        why.append("fp32: ONNX Runtime has no bf16")
    default = (_CUDA_BUDGET if kind == "cuda" else _CPU_BUDGET).get(spec.family)
    tokens, size = default or ((32768, 512) if kind == "cuda" else (2048, 32))
    fields: dict[str, Any] = {"max_batch_tokens": tokens, "max_batch_size": size}
    fields.update({k: v for k, v in budget.items() if k != "precision"})
    fields.update(precision=precision, runtime=runtime)
    why.append("budgets from the spec" if budget else "the family's default budgets")
    if hw.has("amx_bf16") and hardware_class != "cpu-amx":
        why.append(f"(this machine has AMX; class {hardware_class} was asked for)")
    return Profile.from_dict(hardware_class, fields), ", ".join(why)


__all__ = [
    "OPENVINO_FAMILIES",
    "class_precision",
    "fallback_chain",
    "missing_extra",
    "openvino_installed",
    "rule_profile",
]
