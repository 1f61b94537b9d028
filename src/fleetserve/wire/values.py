"""Value shapes every layer passes around: numpy arrays and decoded JSON documents.

``Array`` is the one spelling of an array whose dtype and shape the code does not pin
(numpy's stubs type those as parameters; a row of logits, a batch of ids, a matrix of
vectors all flow through the same seams). ``JSON`` is what ``json.loads`` gives back;
``JSONObject`` is its object case, for bodies we build and documents we read by key.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np

Array: TypeAlias = np.ndarray[Any, Any]

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
JSONObject: TypeAlias = dict[str, JSON]
