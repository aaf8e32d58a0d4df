"""Shared helpers for sim_nodes commands: argument types, errors, tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from ..catalogs import DTYPES


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def int_or(keyword: str) -> Callable[[str], int | str]:
    """Argument type accepting a positive whole number or one keyword (e.g. auto, max)."""

    def parse(text: str) -> int | str:
        if text == keyword:
            return keyword
        try:
            return positive_int(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} or {keyword!r}") from None

    parse.__name__ = f"int_or_{keyword}"
    return parse


def add_dtype_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight-dtype", choices=DTYPES, default="bf16", help="weight dtype")
    parser.add_argument(
        "--kv-dtype", choices=DTYPES, default="bf16", help="KV cache dtype"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """A plain, aligned text table: the first `left` columns (names) left-aligned, numbers right."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)
