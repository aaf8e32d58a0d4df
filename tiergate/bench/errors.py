"""The bench's errors: a user error, printed by the CLI as one line (exit 2), and a run
stopped (Ctrl-C) before it sent anything (exit 130)."""

from __future__ import annotations

from tiergate.common.cli import CliError

__all__ = ["BenchError", "BenchInterrupted"]


class BenchError(CliError):
    """A bench that cannot run as asked: bad flags, an unreachable URL, nothing to plot with."""


class BenchInterrupted(Exception):
    """Stopped (Ctrl-C, SIGTERM) before any request was sent: there is nothing to report."""
