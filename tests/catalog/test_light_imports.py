"""Reading the catalog and routing by family never imports an optional dependency."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("PIL", "torch", "transformers", "gguf", "llguidance", "onnxruntime", "openvino")

SCRIPT = f"""
import json, sys
from fleetserve.catalog import Catalog
from fleetserve.families import family_tasks
tasks = {{s.id: sorted(family_tasks(s.family)) for s in Catalog.load()}}
print(json.dumps({{"tasks": tasks, "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def test_catalog_and_family_tasks_leave_optional_deps_unimported() -> None:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(r.stdout)
    assert got["heavy"] == []
    assert len(got["tasks"]) >= 9 and all(got["tasks"].values())
