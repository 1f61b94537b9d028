"""The benchmarks' children (servers, workers, gateways) are forked from an interpreter
that has imported torch already (tests/forked.py): the tests run each harness at its
smallest, and no figure of theirs counts. A child that must be fresh (another source
tree on its ``PYTHONPATH``, as ``fleet --cold-src`` starts) still is."""

from __future__ import annotations

import pytest

from benchmarks import launch

from .. import forked


@pytest.fixture(autouse=True)
def _forked_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "popen", forked.popen)
