"""The one spelling of a numpy array whose dtype and shape the code does not pin.

numpy's stubs type an array by its shape and dtype; a row of logits, a batch of ids
and a matrix of vectors all flow through the same seams (runtimes, families, the
wire codecs), so they share this alias rather than spelling numpy's two type
parameters at each use. Where the dtype is known and matters, say so with ``npt.NDArray``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

Array: TypeAlias = np.ndarray[Any, Any]
