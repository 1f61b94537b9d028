"""What the registry asks about base models: served or not, family, Linear shapes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from ..catalog import Catalog
from ..catalog.weights import weights_path
from ..settings import Settings
from ..wire import InvalidInput, ModelNotFound
from .shapes import linear_shapes

# the families whose runners host mixed-adapter batches
ADAPTER_FAMILIES = frozenset({"dense", "sparse", "multivector", "cross_encoder", "ner", "generate"})
# ... and those whose adapters may run inside a graph with LoRA slots, on these runtimes
IN_GRAPH = ADAPTER_FAMILIES - {"generate"}
SLOT_RUNTIMES = ("openvino", "onnx")
Shapes = Mapping[str, tuple[int, int]]


def check_takes_adapters(model: str, family: str) -> None:
    """A 400 naming the model unless its family takes adapters."""
    if family not in ADAPTER_FAMILIES:
        raise InvalidInput(
            f"model {model!r} ({family}) cannot take adapters; families that can: "
            + ", ".join(sorted(ADAPTER_FAMILIES)),
            field="adapter",
        )


class Bases(Protocol):
    """The served base models, as the registry needs them."""

    def family(self, model: str) -> str | None:
        """The family of served model ``model``; None if it is not served."""
        ...

    async def shapes(self, model: str) -> Shapes:
        """Module name -> (out_features, in_features) of each Linear layer of ``model``."""
        ...


class StaticBases:
    """Bases given outright: model -> (family, shapes). For tests and tools."""

    def __init__(self, models: Mapping[str, tuple[str, Shapes]]) -> None:
        self._models = dict(models)

    def family(self, model: str) -> str | None:
        entry = self._models.get(model)
        return entry[0] if entry else None

    async def shapes(self, model: str) -> Shapes:
        return self._models[model][1]


class CatalogBases:
    """The catalog's models; shapes read from their weights' safetensors headers on
    first ask (resolving the weights as a load would: fetched or converted once) and
    kept."""

    def __init__(self, catalog: Catalog, settings: Settings) -> None:
        self.catalog = catalog
        self.settings = settings
        self._shapes: dict[str, Shapes] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def family(self, model: str) -> str | None:
        return self.catalog.get(model).family if model in self.catalog else None

    async def shapes(self, model: str) -> Shapes:
        if model in self._shapes:
            return self._shapes[model]
        async with self._locks.setdefault(model, asyncio.Lock()):
            if model not in self._shapes:
                self._shapes[model] = await asyncio.to_thread(self._read, model)
        return self._shapes[model]

    def _read(self, model: str) -> Shapes:
        try:
            path = weights_path(self.catalog.get(model), self.settings)
        except ModelNotFound as exc:
            raise InvalidInput(
                f"cannot check an adapter against {model}: {exc.message}", field="base"
            ) from None
        return linear_shapes(path)
