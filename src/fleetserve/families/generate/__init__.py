"""The generation family: chat completions and native generation over causal LMs."""

from .family import GenerateFamily

__all__ = ["GenerateFamily"]
