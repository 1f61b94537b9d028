"""Hardware classes: a fingerprint of what matters for speed, and a stable name for it.

The fingerprint holds the CPU's ISA features (avx2, avx512f, avx512_bf16, avx512_fp16,
amx_bf16, amx_int8, vnni; on arm64 its own: asimd, sve, bf16, i8mm...), the usable
cores and the memory the process may use; for a GPU, its name, compute capability and
memory. The class name keeps only what changes which candidate wins:

=================  ===========================================================
``cpu-amx``        x86 with AMX (amx_bf16): bf16 matmuls in tiles (Sapphire Rapids+)
``cpu-avx512fp16`` AVX512-FP16 without AMX (e.g. a VM that hides AMX)
``cpu-avx512bf16`` AVX512-BF16 without FP16 or AMX (Cooper Lake, AMD Zen 4/5)
``cpu-avx512``     AVX-512F (Skylake-SP to Ice Lake)
``cpu-avx2``       AVX2 (AMD Zen 1-3, older Intel)
``cpu-generic``    anything else on x86
``cpu-arm64``      aarch64 (Graviton, Ampere, Apple); features kept in the facts
``cuda-smXY``      an NVIDIA GPU of compute capability X.Y (``cuda-sm90``: H100, H200)
=================  ===========================================================

Core count and memory are facts, not part of the name: a profile records the machine
it was tuned on, and batch budgets carry over between sizes of one class.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cgroup import cgroup_memory_limit

# the features that matter, in /proc/cpuinfo's spelling (x86 "flags", arm "Features")
X86_FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)
ARM_FEATURES = ("asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "svebf16")
CPU_CLASSES = (
    "cpu-amx",
    "cpu-avx512fp16",
    "cpu-avx512bf16",
    "cpu-avx512",
    "cpu-avx2",
    "cpu-generic",
    "cpu-arm64",
)


@dataclass(frozen=True)
class Hardware:
    """What the tuner and the rules look at. Build with :func:`detect`."""

    kind: str  # "cpu" or "cuda"
    arch: str  # x86_64, aarch64, ...
    cpu_model: str
    cores: int  # usable by this process (affinity)
    memory_bytes: int  # the cgroup limit when there is one, else physical RAM
    features: frozenset[str] = field(default_factory=frozenset)
    gpu_name: str = ""
    compute_capability: tuple[int, int] | None = None
    gpu_memory_bytes: int = 0

    @property
    def hardware_class(self) -> str:
        if self.kind == "cuda":
            major, minor = self.compute_capability or (0, 0)
            return f"cuda-sm{major}{minor}"
        return cpu_class(self.arch, self.features)

    def has(self, feature: str) -> bool:
        return feature in self.features

    def facts(self) -> dict[str, Any]:
        """Everything behind the class, for ``fleetserve hardware`` and provenance."""
        out: dict[str, Any] = {
            "class": self.hardware_class,
            "kind": self.kind,
            "arch": self.arch,
            "cpu": self.cpu_model,
            "cores": self.cores,
            "memory_gib": round(self.memory_bytes / 2**30, 1),
            "features": sorted(self.features),
        }
        if self.kind == "cuda":
            cc = self.compute_capability or (0, 0)
            out["gpu"] = self.gpu_name
            out["compute_capability"] = f"{cc[0]}.{cc[1]}"
            out["gpu_memory_gib"] = round(self.gpu_memory_bytes / 2**30, 1)
        return out

    def summary(self) -> str:
        """One line: ``cpu-amx: Intel(R) Xeon(R) Processor, 2 cores, 24 GiB``."""
        if self.kind == "cuda":
            return (
                f"{self.hardware_class}: {self.gpu_name}, "
                f"{self.gpu_memory_bytes / 2**30:.0f} GiB; host {self.cpu_model}, "
                f"{self.cores} cores"
            )
        return (
            f"{self.hardware_class}: {self.cpu_model}, {self.cores} cores, "
            f"{self.memory_bytes / 2**30:.0f} GiB"
        )


# the fewest features that make each x86 class (what cpu_class looks at): where a
# class is asked for (--hardware-class) rather than detected, the rules judge these
CLASS_FEATURES = {
    "cpu-amx": frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"}),
    "cpu-avx512fp16": frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16"}),
    "cpu-avx512bf16": frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}),
    "cpu-avx512": frozenset({"avx2", "fma", "avx512f"}),
    "cpu-avx2": frozenset({"avx2", "fma"}),
    "cpu-generic": frozenset(),
}


def judged_features(hw: Hardware, hardware_class: str) -> frozenset[str]:
    """The features the rules judge: this machine's, or, for a class asked for that is
    not this machine's, the features that make that class."""
    if hardware_class == hw.hardware_class:
        return hw.features
    return CLASS_FEATURES.get(hardware_class, hw.features)


def cpu_class(arch: str, features: frozenset[str]) -> str:
    if arch in ("aarch64", "arm64"):
        return "cpu-arm64"
    if "amx_bf16" in features:
        return "cpu-amx"
    if "avx512_fp16" in features:
        return "cpu-avx512fp16"
    if "avx512_bf16" in features:
        return "cpu-avx512bf16"
    if "avx512f" in features:
        return "cpu-avx512"
    if "avx2" in features:
        return "cpu-avx2"
    return "cpu-generic"


def detect(device: str = "cpu", *, root: Path = Path("/")) -> Hardware:
    """The fingerprint of ``device`` (``cpu``, ``cuda``, ``cuda:N`` or ``auto``).

    ``root`` is where ``/proc`` and ``/sys`` are read from (tests point it elsewhere).
    """
    arch = platform.machine().lower() or "unknown"
    model, features = _cpuinfo(root / "proc/cpuinfo", arch)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    cpu = Hardware(
        kind="cpu",
        arch=arch,
        cpu_model=model,
        cores=cores or os.cpu_count() or 1,
        memory_bytes=memory_limit(root),
        features=features,
    )
    if device.startswith("cuda") or device == "auto":
        gpu = _cuda(device, cpu, root)
        if gpu is not None:
            return gpu
    return cpu


def memory_limit(root: Path = Path("/")) -> int:
    """Bytes this process may use: its own cgroup's limit (v2 or v1), else MemTotal."""
    return memory_source(root)[0]


def memory_source(root: Path = Path("/")) -> tuple[int, str]:
    """``memory_limit`` and where it comes from: "cgroup" or "ram". The cgroup is the
    process's own (``/proc/self/cgroup``) and its ancestors, not the root's: see
    ``catalog.cgroup``."""
    total = 0
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    limit = cgroup_memory_limit(root)
    if limit is not None and (total == 0 or limit < total):
        return limit, "cgroup"
    return total, "ram"


def _cpuinfo(file: Path, arch: str) -> tuple[str, frozenset[str]]:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or arch, frozenset()
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    wanted = ARM_FEATURES if arch in ("aarch64", "arm64") else X86_FEATURES
    return model or platform.processor() or arch, frozenset(f for f in flags if f in wanted)


def gpu_present(root: Path = Path("/")) -> bool:
    """Whether the machine shows a GPU that torch's CUDA (or ROCm) build could use: an
    NVIDIA device node (``/dev/nvidia0``, ...) or AMD's ``/dev/kfd``. Where there is
    none, torch (a second to import) is not asked."""
    dev = root / "dev"
    return (dev / "kfd").exists() or any(dev.glob("nvidia[0-9]*"))


def _cuda(device: str, host: Hardware, root: Path = Path("/")) -> Hardware | None:
    if not gpu_present(root):
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    index = int(device.partition(":")[2] or 0)
    props = torch.cuda.get_device_properties(index)
    return Hardware(
        kind="cuda",
        arch=host.arch,
        cpu_model=host.cpu_model,
        cores=host.cores,
        memory_bytes=host.memory_bytes,
        features=host.features,
        gpu_name=str(props.name),
        compute_capability=(int(props.major), int(props.minor)),
        gpu_memory_bytes=int(props.total_memory),
    )


__all__ = ["CPU_CLASSES", "Hardware", "cpu_class", "detect", "memory_limit", "memory_source"]
