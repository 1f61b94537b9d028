from __future__ import annotations

import base64

import numpy as np
import pytest

from fleetserve.families.dense import _b64_rows


@pytest.mark.parametrize("dim", [384, 32, 3, 5])
def test_b64_rows_equal_per_row_encoding(dim: int) -> None:
    arr = np.random.default_rng(0).standard_normal((7, dim)).astype("<f4")
    want = [base64.b64encode(r.tobytes()).decode() for r in arr]
    assert _b64_rows(arr) == want
