"""The planner's one error type: a plan file or trace a user must fix (exit status 2)."""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """A plan file, trace or search space that cannot be planned; the message is one line."""
