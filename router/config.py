"""The router's configuration file: the router's own settings and its pools.

A pool has the fields of an InferencePool spec (camelCase, `ServingSpec` plus tier, names and
replicas) and, for the static discovery source, the URLs of its endpoints. `tiergate up`
uses the same file and starts the endpoints itself (`replicas` sim nodes per pool), so a
pool there needs no URLs; `background` configures those sim nodes' other-tenant load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from tiergate.operator.api import DNS_LABEL, BackgroundLoad, InferencePoolSpec, ReferenceWorkload
from tiergate.sim_nodes.validation import first_problem, yaml_position

__all__ = [
    "BackgroundLoad",
    "Billing",
    "ConfigError",
    "LocalSettings",
    "PoolSpec",
    "ReferenceWorkload",
    "RouterConfig",
    "RouterSettings",
    "load_config",
]


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class Billing(_Model):
    """What the router charges per token served by a pool (default: the envelope's cost)."""

    output_per_million_usd: float | None = Field(default=None, ge=0)
    input_per_million_usd: float = Field(default=0.0, ge=0)


class PoolSpec(InferencePoolSpec):
    """One pool: an InferencePool spec plus its name, where its endpoints are and billing."""

    name: str = Field(pattern=DNS_LABEL, max_length=63, description="The pool's name.")
    endpoints: list[str] = Field(default_factory=list, description="Base URLs (static source).")
    billing: Billing = Field(default_factory=Billing, description="Price override.")

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {url!r} is not an http(s) URL")
        return [u.rstrip("/") for u in urls]


class RouterSettings(_Model):
    """How the router itself runs."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    tenants_file: Path | None = Field(
        default=None, description="Tenants YAML, or a mounted Secret folder; none: open mode."
    )
    ledger_path: Path = Field(default=Path(".tiergate/ledger.sqlite"))
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    upstream_attempts: int = Field(default=3, ge=1, le=10)
    scrape_interval_s: float = Field(default=0.5, gt=0)
    reload_interval_s: float = Field(default=1.0, gt=0)


class LocalSettings(_Model):
    """`tiergate up`: where the sim nodes listen."""

    host: str = "127.0.0.1"
    first_port: int = Field(default=9000, ge=1, le=65535)


class RouterConfig(_Model):
    """A whole configuration file."""

    router: RouterSettings = Field(default_factory=RouterSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    pools: list[PoolSpec]
    kind: Literal["TiergateConfig"] = "TiergateConfig"

    @field_validator("pools")
    @classmethod
    def _unique(cls, pools: list[PoolSpec]) -> list[PoolSpec]:
        seen: set[str] = set()
        for p in pools:
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} is used twice")
            seen.add(p.name)
        return pools


def load_config(path: Path) -> RouterConfig:
    """Read and validate a configuration file; ConfigError says where it is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_config(text, str(path))


def parse_config(text: str, origin: str = "<config>") -> RouterConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML{yaml_position(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping with `pools`")
    try:
        return RouterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {first_problem(exc)}") from None
