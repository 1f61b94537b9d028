"""stack: the one builder of what serves a process's models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import NO_USER_PROFILES, TINY_CLASS
from .tinymodels import build_bert, write_spec

BUILD = """if True:
    import gc, json, sys
    from rich.console import Console
    from fleetserve.assembly import build_catalog
    from fleetserve.metrics import Metrics
    from fleetserve.settings import Settings
    from fleetserve.stack import build_stack
    s = Settings.load(overrides={"catalog": sys.argv[1], "device": "cpu",
                                 "hardware_class": sys.argv[2], "profile_dir": sys.argv[3]})
    before = "torch" in sys.modules
    stack = build_stack(s, build_catalog(s), Metrics(), Console(stderr=True))
    print(json.dumps({
        "before": before,
        "imported": [m for m in ("torch", "transformers.modeling_utils") if m in sys.modules],
        "frozen": gc.get_freeze_count(),
        "tracked": len(gc.get_objects()),
        "loaded": [m for m, r in stack.runners.items() if r.loaded],
    }))
"""


def test_the_stack_imports_its_runtimes_and_freezes_them_before_any_load(tmp_path: Path) -> None:
    """A torch model's first load imports torch and transformers' model code: some
    350,000 objects that every full collection (each eviction's) walked. The stack
    imports them before anything loads and leaves them out of the collections."""
    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/lazy", build_bert(tmp_path / "m"))  # loaded on first use
    args = [str(cat), TINY_CLASS, NO_USER_PROFILES]
    out = subprocess.run(
        [sys.executable, "-c", BUILD, *args], capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.splitlines()[-1])
    assert not got["before"] and got["loaded"] == [], got
    assert got["imported"] == ["torch", "transformers.modeling_utils"], got
    assert got["frozen"] > 200_000 and got["tracked"] < 20_000, got
