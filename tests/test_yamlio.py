from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import fleetserve
from fleetserve import yamlio

BUNDLED = sorted(Path(fleetserve.__file__).parent.rglob("*.yaml"))


def test_libyaml_reads_where_pyyaml_has_it() -> None:
    if not yaml.__with_libyaml__:
        pytest.skip("this PyYAML was built without libyaml")
    assert yamlio._Loader is yaml.CSafeLoader


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.parent.name + "/" + p.name)
def test_each_bundled_file_reads_as_the_pure_python_loader_reads_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert yamlio.load_yaml(text) == yaml.safe_load(text)


def test_a_python_tag_is_refused_as_safe_load_refuses_it() -> None:
    with pytest.raises(yaml.YAMLError):
        yamlio.load_yaml("!!python/object/apply:os.system ['true']")
