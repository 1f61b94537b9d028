"""The generation family: chat completions and native generation over causal LMs."""

from .adapter import GenerateAdapter

__all__ = ["GenerateAdapter"]
