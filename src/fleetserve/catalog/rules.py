"""What to run where nothing was tuned: rules from the evidence of what was.

- **Runtime and precision** come from a table derived from the bundled profiles'
  winners (``catalog.evidence``): for this machine's class, the runtime and precision
  that won most of its tunes in the model's group of families; for a class with no
  tunes, those of the nearest class by features, at fp32 where this CPU has no native
  instructions for the winner's precision. A runtime is switched to only when it can
  run from the spec's weights at load (OpenVINO converts torch and ONNX models; an ONNX
  Runtime or torch.compile winner leaves a torch model on torch) and its extra is
  installed; ONNX Runtime runs fp32. With no evidence at all: the spec's runtime at the
  class's precision (below).
- A spec's ``budgets`` may state a precision for a kind of device (DeBERTa-v3
  overflows in fp16, so its cuda budget says bf16); that wins over the table. Where
  no tune of generation is in evidence, it runs fp32 on CPUs (a different precision
  may change greedy tokens, which the gate checks). NVIDIA GPUs run fp16.
- **Budgets and cost**: the spec's ``budgets`` for the kind (``cpu`` or ``cuda``),
  else the family's defaults below.
- **Always inside the quality gate**: a rule profile below fp32 is checked against an
  fp32 reference when the model loads, and runs fp32 instead if it fails
  (``tune.quality``).

The **fallback chain** of a class lists the classes whose tuned profiles may stand in
for it: those whose features this class also has *and* whose precision is the same,
nearest first. A fallback never crosses a feature that changes which precision wins
(AMX, AVX512-FP16): a profile tuned where fp16 won would be 0.4x of the best on an AMX
machine. ``cuda-smXY`` falls back to lower minor versions of the same major.
"""

from __future__ import annotations

import importlib.util

from .evidence import ENCODER_FAMILIES, RuleTable
from .hardware import CPU_CLASSES, Hardware, judged_features
from .spec import ModelSpec, Profile

EXPORT_FAMILIES = ENCODER_FAMILIES  # the families that export to ONNX, and so to OpenVINO
# family defaults when the spec gives no budgets: (max_batch_tokens, max_batch_size)
_CPU_BUDGET = {"generate": (8192, 8), "image": (2048, 16)}
_CUDA_BUDGET = {"generate": (65536, 64), "image": (32768, 256)}


# a runtime the table names -> the spec runtimes whose weights it can run from
# (only OpenVINO for now: an ONNX export or a torch.compile at every cold load of a torch
# model made a fleet with evictions time out, benchmarks/fleet's trace on cpu-avx2)
RUNS_FROM = {"openvino": frozenset({"torch", "onnx", "openvino"})}  # converts either


def class_precision(hardware_class: str) -> str:
    """The precision a class name implies: what its fallback chain keeps, and the
    rule's where there is no evidence."""
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


# the extras that bring torch: pip takes its CPU build from PyTorch's index (PyPI's is
# the CUDA one, gigabytes more)
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
_WITH_TORCH = frozenset({"torch", "train"})  # any extra list that names one of them


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (torch's from the CPU index)."""
    line = f"pip install 'fleetserve[{extra}]'"
    torch = bool(_WITH_TORCH & set(extra.split(",")))
    return f"{line} --extra-index-url {TORCH_INDEX}" if torch else line


# a family -> what it needs beside its runtime: (the module, the extra that installs it)
FAMILY_NEEDS = {
    "image": (("PIL", "image"),),
    "generate": (("torch", "torch"), ("llguidance", "generate")),
}


def missing_extras(spec: ModelSpec, runtime: str) -> list[str]:
    """The extras serving ``spec`` on ``runtime`` needs and this install lacks, in the
    order to name them: the runtime's, the family's, GGUF weights' conversion."""
    needs = [NEEDS.get(runtime, ("", "")), *FAMILY_NEEDS.get(spec.family, ())]
    if any(s.startswith("gguf:") or s.lower().endswith(".gguf") for s in spec.sources):
        needs.append(("gguf", "generate"))
    out: list[str] = []
    for module, extra in needs:
        if module and extra not in out and importlib.util.find_spec(module) is None:
            out.append(extra)
    return out


def rule_profile(
    spec: ModelSpec, hw: Hardware, hardware_class: str, table: RuleTable | None = None
) -> tuple[Profile, str]:
    """The rule's profile for ``spec`` on this machine, and a sentence saying why.
    ``table``: the evidence (``Profiles`` passes the bundled profiles'); none: no
    evidence, the spec's runtime at the class's precision."""
    kind = "cuda" if hardware_class.startswith("cuda") else "cpu"
    budget: dict[str, object] = dict(spec.budgets.get(kind, {}))
    features = judged_features(hw, hardware_class)
    pick = table.pick(spec.family, hardware_class, features) if table and kind == "cpu" else None
    why: list[str] = []
    if "precision" in budget:
        precision = str(budget["precision"])
        why.append(f"{precision} as the spec's {kind} budget says")
    elif pick is not None:
        precision = pick.precision
        why.append(f"{precision} {pick.reason}")
    elif spec.family == "generate" and kind == "cpu":
        precision = "fp32"
        why.append("fp32 for generation on a CPU")
    else:
        precision = class_precision(hardware_class)
        why.append(f"{precision} for {hardware_class}")
    runtime = ""
    if (
        pick is not None
        and pick.runtime != spec.runtime
        and spec.runtime in RUNS_FROM.get(pick.runtime, ())
        and not missing_extra(pick.runtime)
    ):
        runtime = pick.runtime
        why.append(f"on {runtime} as the tunes there chose")
    elif pick is not None and pick.runtime != spec.runtime and missing_extra(pick.runtime):
        extra = missing_extra(pick.runtime)
        why.append(f"on {spec.runtime}: {pick.runtime} won there (fleetserve[{extra}])")
    if precision == "bf16" and (runtime or spec.runtime) == "onnx":
        precision = "fp32"  # ONNX Runtime runs fp32 or int8
        why.append("fp32: ONNX Runtime has no bf16")
    default = (_CUDA_BUDGET if kind == "cuda" else _CPU_BUDGET).get(spec.family)
    tokens, size = default or ((32768, 512) if kind == "cuda" else (2048, 32))
    fields: dict[str, object] = {"max_batch_tokens": tokens, "max_batch_size": size}
    fields.update({k: v for k, v in budget.items() if k != "precision"})
    fields.update(precision=precision, runtime=runtime)
    why.append("budgets from the spec" if budget else "the family's default budgets")
    if hw.has("amx_bf16") and hardware_class != "cpu-amx":
        why.append(f"(this machine has AMX; class {hardware_class} was asked for)")
    return Profile.from_dict(hardware_class, fields), ", ".join(why)


__all__ = [
    "EXPORT_FAMILIES",
    "RUNS_FROM",
    "class_precision",
    "fallback_chain",
    "missing_extra",
    "openvino_installed",
    "rule_profile",
]
