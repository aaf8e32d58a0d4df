"""The README stays a first screen and a tour: at most 200 lines, and its two commands first."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
#: The longest the README may grow; past it, move detail into docs/.
MAX_LINES = 200


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_readme_s_first_screen_gives_the_two_commands() -> None:
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen
