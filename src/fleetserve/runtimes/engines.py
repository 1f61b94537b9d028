"""The parts of ONNX Runtime's and OpenVINO's objects the runtimes call.

Neither package ships type stubs, so what we hold of them (a session, a compiled
model, its infer request) is typed here by the calls we make, and nothing more: a
call outside these protocols is a change a reader should see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..wire.values import Array

# ONNX Runtime's execution providers: a name, or a name with its options
Provider = str | tuple[str, dict[str, int]]


class NodeArg(Protocol):
    """An ONNX Runtime session's input or output."""

    @property
    def name(self) -> str: ...


class OrtSession(Protocol):
    """``onnxruntime.InferenceSession``."""

    def get_inputs(self) -> Sequence[NodeArg]: ...

    def get_outputs(self) -> Sequence[NodeArg]: ...

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Array]
    ) -> list[Array]: ...


class OvPort(Protocol):
    """An OpenVINO compiled model's input or output."""

    def get_any_name(self) -> str: ...


class OvTensor(Protocol):
    @property
    def data(self) -> Array: ...


class OvInferRequest(Protocol):
    def infer(
        self,
        inputs: Sequence[Array] | None = ...,
        share_inputs: bool = ...,
        share_outputs: bool = ...,
    ) -> object: ...

    def set_tensor(self, name: str, tensor: object) -> None: ...

    def get_output_tensor(self, index: int) -> OvTensor: ...


class OvCompiledModel(Protocol):
    """``openvino.CompiledModel``."""

    @property
    def inputs(self) -> Sequence[OvPort]: ...

    @property
    def outputs(self) -> Sequence[OvPort]: ...

    def create_infer_request(self) -> OvInferRequest: ...

    def get_property(self, name: str) -> object: ...


class OvCore(Protocol):
    """``openvino.Core``."""

    def compile_model(
        self, model: str, device_name: str, config: Mapping[str, str]
    ) -> OvCompiledModel: ...
