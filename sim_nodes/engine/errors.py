"""The engine layer's errors: one base type, mapped once by the server and the CLI."""

from __future__ import annotations

__all__ = ["EngineCapacityError", "EngineError", "EngineStoppedError"]


class EngineError(ValueError):
    """A request or configuration the engine cannot accept (bad values, duplicate ids)."""


class EngineCapacityError(EngineError):
    """Something can never fit: a request larger than the KV cache, or too much background."""


class EngineStoppedError(RuntimeError):
    """The engine's step loop ended on an error: nothing submitted now would ever be served."""
