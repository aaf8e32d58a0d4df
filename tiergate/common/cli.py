"""The command-line toolkit every tiergate command shares: the user error, logging, listening
sockets, argument types and plain tables."""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tiergate.common.validation import first_problem

_Profile = TypeVar("_Profile", bound=BaseModel)


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def configure_logging(level: str, *, context: str = "") -> None:
    """Structured (key=value) logs on stderr, the same for every tiergate process.

    `context`: key=value fields on every line of this process, e.g. a worker's `worker=1`, so
    that the lines of processes writing to one stream can be told apart.
    """
    fields = f"{context.replace('%', '%%')} " if context else ""
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"ts=%(asctime)s level=%(levelname)s {fields}logger=%(name)s %(message)s",
    )
    # httpx logs every request at INFO: the router's metrics scrapes alone would be two lines
    # a second per endpoint. Shown with --log-level debug.
    if level.lower() != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)


def port_number(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port, where the command allows it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {value}")
    return value


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, for uvicorn to serve on (so a port already in use is one
    clear line, before anything else starts); inheritable by the server's workers."""
    sock = _bound(host, port, reuse_port=False)
    sock.set_inheritable(True)
    return sock


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT: processes that each bind one share the
    port, and the kernel spreads new connections over those that listen. CliError (one line)
    when the port is held by a socket without it."""
    return _bound(host, port, reuse_port=True)


def _bound(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CliError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    """Argument type: a whole number from `low` to `high`, both included."""

    def parse(text: str) -> int:
        value = _whole(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value

    parse.__name__ = f"int_between_{low}_{high}"
    return parse


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def unit_interval(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
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


def profile_json(kind: type[_Profile]) -> Callable[[str], _Profile]:
    """Argument type: a JSON object validated as `kind` (an inline catalog profile).

    Errors say where, never quote the text back (the whole profile would be one long line).
    """

    def parse(text: str) -> _Profile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(
                f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
        if not isinstance(data, dict):
            raise argparse.ArgumentTypeError("expected a JSON object")
        try:
            return kind.model_validate(data)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(first_problem(exc)) from None

    parse.__name__ = f"{kind.__name__}_json"
    return parse


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
