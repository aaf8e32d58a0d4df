"""The `tiergate` command run in the test's process: its exit status, whether `main()` returns
it or argparse exits with it (a usage error, a flag value refused), and what it printed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tiergate.cli import main


def exit_status(argv: Sequence[str]) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:  # argparse refuses a flag by exiting
        return int(exc.code or 0)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tiergate ARGV...`."""
    status = exit_status(argv)
    out, err = capsys.readouterr()
    return status, out, err
