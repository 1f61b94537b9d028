"""The suite runs in a home of its own, and writes nothing into the developer's.

fleetserve keeps what it computes once under ``~/.cache/fleetserve`` (conversions,
exports, compiled models, gate verdicts, measured peaks, adapters, uploads) and reads
tuned profiles from ``~/.config/fleetserve``. A test's server that named no
``cache_dir`` used the developer's: one clean clone's ``make test`` left 265 MB there
(the bundled MiniLM's OpenVINO conversion, keyed by the clone's path, besides tiny
models'), run after run, and what one run left there the next one read.

So HOME, for the tests and everything they start, is a directory of the run: `make
test` makes one for its three pytest runs (``FLEETSERVE_TESTS_HOME``, so that they
share conversions as they shared the developer's cache before) and removes it; a pytest
run without it makes its own, which its xdist workers and subprocesses inherit, and
removes it at exit. conftest imports this module before fleetserve, some of whose
modules expand ``~`` at import.

tests/home_guard.py fails a session that writes into the developer's own fleetserve
folders all the same (a path built from the real home)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

VAR = "FLEETSERVE_TESTS_HOME"
REAL_VAR = "FLEETSERVE_TESTS_REAL_HOME"  # the developer's, for the processes of the run

REAL_HOME = Path(os.environ.get(REAL_VAR) or Path.home())
os.environ[REAL_VAR] = str(REAL_HOME)
if not os.environ.get(VAR):
    os.environ[VAR] = tempfile.mkdtemp(prefix="fleetserve-tests-home-")
    atexit.register(shutil.rmtree, os.environ[VAR], True)
os.environ["HOME"] = os.environ[VAR]
