"""One wording for the two ways a user's file can be wrong: YAML syntax, and a schema.

Every loader of user input (catalogs, pool files, traces, the router's configuration, CLI
flags built into models) reports the *first* problem as ``field.path: message`` and a YAML
syntax error by its position, never by quoting the offending text (it may hold a secret).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml
from pydantic import ValidationError

# The members of a union as pydantic names them in an error's location ("int", "list[str]",
# "function-after[...]"): not fields the user wrote, so left out of the path.
_TYPE_TAG = re.compile(
    r"(int|float|str|bool|bytes|none|url|constrained-\w+|[a-z-]+\[.*\])", re.DOTALL
)


def field_path(loc: Sequence[int | str]) -> list[int | str]:
    """An error location as the user wrote it: union members' type tags left out."""
    return [p for p in loc if isinstance(p, int) or not _TYPE_TAG.fullmatch(p)]


def first_problem(exc: ValidationError, *, default_field: str = "") -> str:
    """``field.path: message`` of the first error in `exc` (without pydantic's "Value error, "
    before a validator's own words)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in field_path(first["loc"])) or default_field
    msg = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def yaml_position(exc: yaml.YAMLError) -> str:
    """`` (line L, column C)`` of a YAML syntax error, or an empty string if unknown."""
    mark = getattr(exc, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
