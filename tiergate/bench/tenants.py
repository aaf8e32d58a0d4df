"""`--tenants FILE`: the callers of a bench run, each with its own API key and closed loop.

```yaml
tenants:
  - name: heavy
    apiKeyEnv: HEAVY_KEY   # the key is read from this environment variable, or
    concurrency: 24        # given as `apiKey:` in the file (never on the command line)
  - name: light
    apiKey: sk-light-...
    concurrency: 1
```

Every problem is a one-line BenchError naming the file and the field. No message quotes a
key: pydantic's messages leave out the input, and a YAML syntax error is reported by its
position only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from tiergate.bench.errors import BenchError
from tiergate.common.validation import field_path, yaml_position

__all__ = ["MAX_CONCURRENCY", "BenchTenant", "load_tenants", "parse_tenants"]

#: The most requests in flight at once, a tenant's or the bench's: one task and one connection
#: each, far past what one process can drive, and bounded so that a typo is an error, not
#: memory filled with tasks.
MAX_CONCURRENCY = 100_000

#: As the router's tenants file spells names, so a bench tenant can carry the router's name.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


@dataclass(frozen=True, slots=True)
class BenchTenant:
    """One caller of the run: its requests carry `api_key` as a bearer token."""

    name: str
    api_key: str = field(repr=False)
    concurrency: int


class _TenantEntry(BaseModel):
    """One entry of the file (its schema; `BenchTenant` is what the run uses)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    # SecretStr keeps the key out of reprs.
    api_key: SecretStr | None = None
    api_key_env: Annotated[str, Field(pattern=_ENV_NAME_PATTERN)] | None = None
    concurrency: Annotated[StrictInt, Field(ge=1, le=MAX_CONCURRENCY)]

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None:
            problem = _key_problem(key.get_secret_value())
            if problem is not None:
                raise ValueError(f"the key {problem}")
        return key

    @model_validator(mode="after")
    def _one_key_source(self) -> _TenantEntry:
        if (self.api_key is None) == (self.api_key_env is None):
            raise ValueError("give exactly one of apiKey and apiKeyEnv")
        return self


class _TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: Annotated[list[_TenantEntry], Field(min_length=1)]


def load_tenants(path: Path, environ: Mapping[str, str] | None = None) -> list[BenchTenant]:
    """The tenants of the file at `path`, keys read from `environ` (default: os.environ)."""
    where = f"--tenants {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"{where}: cannot read: {type(exc).__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # By position only: PyYAML's text quotes the file (an alias or tag it cannot resolve
        # may be an API key written unquoted).
        raise BenchError(f"{where}: not valid YAML{yaml_position(exc)}") from None
    return parse_tenants(data, source=where, environ=environ)


def parse_tenants(
    data: Any, *, source: str = "--tenants", environ: Mapping[str, str] | None = None
) -> list[BenchTenant]:
    """The tenants of an already-parsed file (`{"tenants": [...]}`); `source` heads errors."""
    environ = os.environ if environ is None else environ
    if not isinstance(data, dict):
        what = "an empty file" if data is None else f"a {type(data).__name__}"
        raise BenchError(f"{source}: expected a mapping with `tenants:`, got {what}")
    try:
        spec = _TenantsFile.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_input=False, include_url=False)[0]
        problem = str(error["msg"]).removeprefix("Value error, ")
        raise BenchError(f"{source}: {_field(error['loc'])}: {problem}") from None
    tenants: list[BenchTenant] = []
    holders: dict[str, str] = {}  # key -> the field that gave it first
    for index, entry in enumerate(spec.tenants):
        here = f"tenants[{index}]"
        if any(t.name == entry.name for t in tenants):
            raise BenchError(f"{source}: {here}.name: duplicate tenant name {entry.name!r}")
        key, key_field = _key(entry, environ, f"{source}: {here}")
        first = holders.setdefault(key, f"{here}.{key_field}")
        if first != f"{here}.{key_field}":
            # The router would see one tenant: the report would split its service in two.
            raise BenchError(f"{source}: {here}.{key_field}: the same API key as {first}")
        tenants.append(BenchTenant(entry.name, key, entry.concurrency))
    return tenants


def _key(entry: _TenantEntry, environ: Mapping[str, str], where: str) -> tuple[str, str]:
    """The entry's key and the field it came from (apiKey, apiKeyEnv)."""
    if entry.api_key is not None:
        return entry.api_key.get_secret_value(), "apiKey"
    assert entry.api_key_env is not None  # one of the two, as validated
    name = entry.api_key_env
    value = environ.get(name, "").strip()
    if not value:
        raise BenchError(f"{where}.apiKeyEnv: environment variable {name} is not set")
    problem = _key_problem(value)
    if problem is not None:
        raise BenchError(f"{where}.apiKeyEnv: the value of {name} {problem}")
    return value, "apiKeyEnv"


def _key_problem(value: str) -> str | None:
    """Why `value` cannot be a bearer token, or None when it can (never quoting it)."""
    if not value:
        return "is empty"
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        return "must be printable ASCII without whitespace"
    return None


def _field(loc: tuple[int | str, ...]) -> str:
    """`tenants[0].apiKey` from a pydantic error location."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in field_path(loc))
    return path.lstrip(".") or "tenants"
