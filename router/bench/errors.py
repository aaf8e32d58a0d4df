"""The bench's one error type: a user error, printed by the CLI as one line (exit 2)."""

from __future__ import annotations

from tiergate.sim_nodes.commands.common import CliError

__all__ = ["BenchError"]


class BenchError(CliError):
    """A bench that cannot run as asked: bad flags, an unreachable URL, nothing to plot with."""
