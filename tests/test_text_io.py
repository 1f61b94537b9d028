"""Text I/O names its encoding (ruff's PLW1514, a preview rule, so not in the project's
stable rule set). OpenVINO sets the process's C locale while it writes a compiled blob
(``CACHE_DIR``), so a read without an encoding on another thread meanwhile decodes
ASCII: a README test failed on it beside a background compile of LoRA slots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_text_io_names_its_encoding() -> None:
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "--preview",
           "--select", "PLW1514", "src", "tests", "benchmarks"]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
