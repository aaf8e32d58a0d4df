"""Reading a user's plan file or trace with bounds, so no input can hang or crash the planner.

Only regular files are read (a device such as /dev/zero or a pipe never ends), up to
`MAX_FILE_BYTES`; text must be UTF-8. Parsers recurse per level of nesting, so a document
nested deeper than Python's stack, or a number longer than Python converts, is refused as a
PlanError naming the file, like any other mistake in it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from tiergate.common.validation import yaml_position

from .errors import PlanError

__all__ = ["MAX_FILE_BYTES", "parse_json", "parse_yaml", "read_text"]

#: A plan file or trace larger than this is refused (a trace of ~200,000 requests fits).
MAX_FILE_BYTES = 32 * 1024 * 1024


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of the regular file at `path`; PlanError naming `what` (plan, trace)."""
    try:
        with path.open("rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise PlanError(f"{what} {str(path)!r} is not a regular file")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise PlanError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PlanError(
            f"{what} {str(path)!r} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{what} {str(path)!r} is not UTF-8 text") from None


def parse_yaml(text: str, name: str) -> Any:
    """The YAML document in `text` (from the file `name`); PlanError when it is not one."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"{name}: not valid YAML{yaml_position(exc)}") from None
    except RecursionError:
        raise PlanError(f"{name}: nested too deeply to read") from None
    except ValueError as exc:  # a value YAML's constructors refuse (a 5,000-digit number)
        raise PlanError(f"{name}: not valid YAML: {_why(exc)}") from None


def parse_json(text: str, where: str) -> Any:
    """The JSON value in `text` (at `where`, e.g. a trace line); PlanError when it is not one."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise PlanError(f"{where}: nested too deeply to read") from None
    except ValueError as exc:
        raise PlanError(f"{where}: not JSON ({_why(exc)})") from None


def _why(exc: ValueError) -> str:
    text = str(exc)
    if "digits" in text and "integer string conversion" in text:
        return "a number has too many digits"
    return text.splitlines()[0] if text else type(exc).__name__
