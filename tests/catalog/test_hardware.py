"""Hardware classes: the fingerprint read from /proc and /sys, and its stable name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetserve.catalog.hardware import Hardware, cpu_class, detect, gpu_present, memory_limit

MINILM = "sentence-transformers/all-MiniLM-L6-v2"

# /proc/cpuinfo "flags" of machines seen in sessions (trimmed to what matters, plus noise)
AMX = "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16 avx_vnni"  # noqa: E501
FP16_NO_AMX = "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16"
ZEN4 = "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16"
SKYLAKE = "fpu sse2 avx avx2 fma avx512f avx512bw avx512vl"
ZEN2 = "fpu sse2 avx avx2 fma"
OLD = "fpu sse2"


def fake_root(tmp: Path, flags: str, model: str = "Test CPU", cgroup: str | None = None) -> Path:
    (tmp / "proc").mkdir(parents=True)
    cpus = "".join(
        f"processor\t: {i}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n" for i in range(2)
    )
    (tmp / "proc/cpuinfo").write_text(cpus)
    (tmp / "proc/meminfo").write_text("MemTotal:       24576000 kB\nMemFree: 1 kB\n")
    if cgroup is not None:
        (tmp / "sys/fs/cgroup").mkdir(parents=True)
        (tmp / "sys/fs/cgroup/memory.max").write_text(cgroup + "\n")
    return tmp


@pytest.mark.parametrize(
    ("flags", "cls"),
    [
        (AMX, "cpu-amx"),
        (FP16_NO_AMX, "cpu-avx512fp16"),
        (ZEN4, "cpu-avx512bf16"),
        (SKYLAKE, "cpu-avx512"),
        (ZEN2, "cpu-avx2"),
        (OLD, "cpu-generic"),
    ],
)
def test_x86_classes_from_cpuinfo(tmp_path: Path, flags: str, cls: str) -> None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the x86 cases read an x86 /proc/cpuinfo layout; this is not x86_64")
    hw = detect("cpu", root=fake_root(tmp_path, flags))
    assert hw.hardware_class == cls
    assert hw.kind == "cpu" and hw.cpu_model == "Test CPU"
    assert "fpu" not in hw.features  # only the flags that matter are kept
    facts = hw.facts()
    assert facts["class"] == cls and facts["cores"] >= 1
    assert facts["memory_gib"] == pytest.approx(23.4, abs=0.1)


def test_arm64_is_its_own_class() -> None:
    assert cpu_class("aarch64", frozenset({"asimd", "sve", "bf16"})) == "cpu-arm64"
    assert cpu_class("arm64", frozenset()) == "cpu-arm64"


def test_memory_is_the_cgroup_limit_when_lower(tmp_path: Path) -> None:
    root = fake_root(tmp_path / "a", ZEN2, cgroup=str(4 * 2**30))
    assert memory_limit(root) == 4 * 2**30
    unlimited = fake_root(tmp_path / "b", ZEN2, cgroup="max")
    assert memory_limit(unlimited) == 24576000 * 1024


def test_a_gpu_is_looked_for_in_dev_before_torch_is_asked(tmp_path: Path) -> None:
    """Where /dev shows no NVIDIA or AMD GPU, ``detect("auto")`` is the CPU and never
    imports torch (a second of every CLI command on a machine without one)."""
    root = fake_root(tmp_path, ZEN2)
    assert not gpu_present(root)
    for node in ("dev/nvidia0", "dev/kfd"):
        (root / node).parent.mkdir(exist_ok=True)
        (root / node).touch()
        assert gpu_present(root)
        (root / node).unlink()
    (root / "dev/nvidiactl").touch()  # the driver's control node alone: no device
    assert not gpu_present(root)
    script = (
        "import sys; from pathlib import Path; from fleetserve.catalog.hardware import detect; "
        f"hw = detect('auto', root=Path({str(root)!r})); "
        "print(hw.kind, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert out == ["cpu", "False"]


def test_cuda_classes_name_the_compute_capability() -> None:
    h200 = Hardware(
        kind="cuda",
        arch="x86_64",
        cpu_model="host",
        cores=16,
        memory_bytes=128 * 2**30,
        gpu_name="NVIDIA H200",
        compute_capability=(9, 0),
        gpu_memory_bytes=141 * 2**30,
    )
    assert h200.hardware_class == "cuda-sm90"
    assert h200.facts()["compute_capability"] == "9.0"
    assert "NVIDIA H200" in h200.summary()


def test_this_machine_has_a_class() -> None:
    hw = detect()
    assert hw.hardware_class.startswith("cpu-")
    assert hw.cores >= 1 and hw.memory_bytes > 0


@pytest.mark.slow
def test_fleetserve_hardware_prints_the_class_and_its_facts_at_80_columns() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fleetserve", "hardware", "--profile-dir", "/dev/null/none"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    cls = detect().hardware_class
    assert f"hardware class: {cls}" in out
    assert "features" in out and "fallback chain" in out and "rule for a dense model" in out
    assert "sentence-transformers/all-MiniLM-L6-v2" in out  # the profiles it would run
    assert max(len(line) for line in out.splitlines()) <= 80
    # the longest bundled id whole on its row (it wrapped at 80 columns before)
    assert re.search(r"^sentence-transformers/all-MiniLM-L6-v2-multivector \w", out, re.M)


@pytest.mark.slow
def test_fleetserve_hardware_shows_what_a_class_with_nothing_bundled_gets() -> None:
    """``--bundled-profiles false``: the class's own tunes leave the table too, so the
    rule comes from the nearest class, and every model runs on the rule."""
    argv = [sys.executable, "-m", "fleetserve", "hardware", "--profile-dir", "/dev/null/none",
            "--hardware-class", "cpu-avx2"]  # fmt: skip
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    rows = {}
    for extra in ((), ("--bundled-profiles", "false")):
        r = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if x.startswith(MINILM + " "))
        rows[bool(extra)] = (r.stdout, line.split()[-1])
    assert rows[False][1] == "tuned" and "as tuned on cpu-avx2\n" in rows[False][0]
    assert rows[True][1] == "rule" and "the nearest class by features" in rows[True][0]
