"""How the benchmarks start their children: ``popen``, ``subprocess.Popen`` unless
replaced. The suite replaces it (tests/benchmarks/conftest.py) to fork each
``python -m`` child from an interpreter that has imported torch already
(tests/forked.py): it runs the harness at its smallest, and no figure of it counts."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

popen: Callable[..., subprocess.Popen[Any]] = subprocess.Popen
