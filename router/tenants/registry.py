"""Tenants: who is calling, which tiers they may use, and their limits and budget.

The tenants file is YAML with camelCase fields (Kubernetes style), read from a file or from a
directory holding `tenants.yaml`, which is how a mounted Kubernetes Secret looks::

    tenants:
      - name: team-a
        apiKeys: ["sk-team-a-..."]          # plaintext: hashed at load, never kept
        apiKeySha256: ["9f86d081884c7d65..."] # or: hex SHA-256 of the key (preferred)
        allowedTiers: [batched, premium]    # default: every tier
        requestsPerMinute: 600              # optional: absent means unlimited
        tokensPerMinute: 200000             # optional: absent means unlimited
        budgetUsd: 50                       # optional: absent means unlimited
        budgetPeriod: month                 # day | week | month | total (UTC boundaries)
        weight: 2                           # share of a busy tier against others (default 1)
        maxQueued: 64                       # most requests waiting for one tier (default: none)
        spillOver:                          # optional: see router/tenants/spill_policy.py
          to: [premium]
          maxOutputUsdPerMillion: 25

Only SHA-256 digests of keys are kept. Plaintext keys are hashed while the file is parsed and no
reference to them survives `load_tenants` (Python cannot zero an immutable string, so the text
lingers in freed memory until reused; keeping no reference is what a Python process can do).
API keys are random, so looking a key up by its digest reveals nothing useful through timing;
the final comparison still uses `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from tiergate.common.validation import field_path, yaml_position
from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TIERS, Tier
from tiergate.router.tenants.spill_policy import NO_SPILL, SpillOverSpec, SpillPolicy

__all__ = [
    "ANONYMOUS",
    "BudgetPeriod",
    "Tenant",
    "TenantConfigError",
    "TenantRegistry",
    "authorize_tier",
    "key_digest",
    "load_tenants",
    "parse_tenants",
]

logger = logging.getLogger("tiergate.router")

BudgetPeriod = Literal["day", "week", "month", "total"]
SECRET_FILE_NAME = "tenants.yaml"
_PREFIX_BYTES = 8
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
# Tenant names appear in logs, metrics labels and the ledger: keep them plain.
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class TenantConfigError(Exception):
    """The tenants file is unusable; says which file and which field, never a key's value."""

    def __init__(self, path: str, problems: Sequence[tuple[str, str]]) -> None:
        self.path = path
        self.problems = list(problems)
        self.field = self.problems[0][0] if self.problems else ""
        lines = "; ".join(
            f"{field}: {message}" if field else message for field, message in problems
        )
        super().__init__(f"tenants file {path}: {lines}")


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant as the router enforces it. Holds no key material."""

    name: str
    allowed_tiers: tuple[Tier, ...] = TIERS  # in TIERS order
    requests_per_minute: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None  # None: unlimited
    budget_usd: float | None = None  # None: unlimited
    budget_period: BudgetPeriod = "month"
    weight: float = 1.0  # share of a saturated tier, against other tenants' weights
    max_queued: int | None = None  # most requests waiting for one tier; None: no cap of its own
    spill: SpillPolicy = NO_SPILL


#: The tenant of every request when authentication is off.
ANONYMOUS = Tenant(name="anonymous")


class _TenantSpec(BaseModel):
    """One entry of the tenants file (the file schema, not what the router keeps)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)

    name: Annotated[str, Field(pattern=_NAME_PATTERN)] = Field(
        description="The tenant's name, in logs, metric labels and the ledger."
    )
    # SecretStr keeps plaintext keys out of reprs and validation messages.
    api_keys: list[SecretStr] = Field(
        default=[], description="Plaintext API keys, hashed when the file is read."
    )
    api_key_sha256: list[str] = Field(
        default=[], description="API keys as hex SHA-256 digests (preferred to apiKeys)."
    )
    allowed_tiers: Annotated[list[Tier], Field(min_length=1)] = Field(
        default=list(TIERS), description="Tiers the tenant may use; another is refused (403)."
    )
    requests_per_minute: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="Requests a minute (a token bucket); none: unlimited."
    )
    tokens_per_minute: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="Tokens a minute (prompt + output cap, corrected after the reply); "
        "none: unlimited.",
    )
    budget_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None, description="Spend allowed per budget period, USD; none: unlimited."
    )
    budget_period: BudgetPeriod = Field(
        default="month", description="The budget's period, on UTC boundaries."
    )
    weight: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)] = Field(
        default=1.0, description="The tenant's share of a busy tier against other tenants'."
    )
    max_queued: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="Most of its requests waiting for one tier (429 tenant_queue_full past "
        "it); none: no cap of its own.",
    )
    spill_over: SpillOverSpec | None = Field(
        default=None,
        description="Tiers a request may move to when its own is busy; none: it never moves.",
    )

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for key in keys:
            value = key.get_secret_value()
            if not value or value != value.strip() or " " in value:
                raise ValueError("an API key must be non-empty and contain no whitespace")
        return keys

    @field_validator("api_key_sha256")
    @classmethod
    def _hex_digests(cls, digests: list[str]) -> list[str]:
        for index, digest in enumerate(digests):
            if not _HEX_DIGEST.fullmatch(digest):
                # Never echo the value: a plaintext key pasted here by mistake is still a key.
                raise ValueError(f"entry {index} is not a SHA-256 digest (64 hex characters)")
        return [digest.lower() for digest in digests]


class _TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # An empty list would refuse every request; running without keys is `TenantRegistry.open()`.
    tenants: Annotated[list[_TenantSpec], Field(min_length=1)]


def key_digest(api_key: str) -> bytes:
    """SHA-256 of an API key, the only form in which the router keeps keys."""
    return hashlib.sha256(api_key.encode("utf-8")).digest()


class TenantRegistry:
    """Authenticates requests against the known key digests.

    Built by `load_tenants`/`parse_tenants`, or `TenantRegistry.open()` for local use without
    authentication. Immutable: a reload builds a new registry and swaps it in.
    """

    def __init__(self, tenants: Iterable[tuple[Tenant, Iterable[bytes]]]) -> None:
        self._by_prefix: dict[bytes, list[tuple[bytes, Tenant]]] = {}
        self._tenants: dict[str, Tenant] = {}
        for tenant, digests in tenants:
            self._tenants[tenant.name] = tenant
            for digest in digests:
                self._by_prefix.setdefault(digest[:_PREFIX_BYTES], []).append((digest, tenant))
        self._open = False

    @classmethod
    def open(cls) -> TenantRegistry:
        """A registry serving every request as tenant `anonymous`: all tiers, no limits."""
        registry = cls([(ANONYMOUS, ())])
        registry._open = True
        logger.warning(
            "authentication is off: every request is served as tenant anonymous "
            "event=auth_disabled tenant=anonymous"
        )
        return registry

    @property
    def authentication_enabled(self) -> bool:
        """False for the unauthenticated registry of `open()`."""
        return not self._open

    @property
    def tenants(self) -> Mapping[str, Tenant]:
        """Tenants by name."""
        return self._tenants

    def authenticate(self, authorization_header: str | None) -> Tenant:
        """The tenant owning the bearer key in an `Authorization` header value.

        Raises RouterError(401) when the header is missing or malformed (`missing_api_key`)
        or the key is unknown (`invalid_api_key`). The key never appears in the error.
        """
        if self._open:
            return ANONYMOUS
        api_key = _bearer_key(authorization_header)
        if api_key is None:
            raise RouterError(
                401,
                "missing API key: send it as 'Authorization: Bearer <key>'",
                type="authentication_error",
                code="missing_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        digest = key_digest(api_key)
        # Look up by a digest prefix, then compare the whole digest in constant time.
        for known, tenant in self._by_prefix.get(digest[:_PREFIX_BYTES], ()):
            if hmac.compare_digest(digest, known):
                return tenant
        raise RouterError(
            401,
            "invalid API key",
            type="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )


def _bearer_key(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    credentials = credentials.strip()
    # The scheme is case-insensitive (RFC 9110); the key itself is not.
    if scheme.lower() != "bearer" or not credentials or " " in credentials:
        return None
    return credentials


def authorize_tier(tenant: Tenant, tier: Tier) -> None:
    """Raise RouterError(403) unless `tenant` may use `tier`; the message names allowed tiers."""
    if tier not in tenant.allowed_tiers:
        raise RouterError(
            403,
            f"tenant {tenant.name!r} may not use tier {tier!r}; "
            f"allowed tiers: {', '.join(tenant.allowed_tiers)}",
            type="permission_error",
            code="tier_not_allowed",
        )


def load_tenants(path: str | Path) -> TenantRegistry:
    """Read a tenants file, or `tenants.yaml` inside a directory (a mounted Secret)."""
    path = Path(path)
    if path.is_dir():
        path = path / SECRET_FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TenantConfigError(str(path), [("", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantConfigError(str(path), [("", f"cannot read: {type(exc).__name__}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # By position only: PyYAML's text quotes the file (an alias or tag it cannot resolve
        # may be an API key written unquoted).
        raise TenantConfigError(str(path), [("", f"not valid YAML{yaml_position(exc)}")]) from None
    del text
    return parse_tenants(data, source=str(path))


def parse_tenants(data: Any, *, source: str = "<tenants>") -> TenantRegistry:
    """Build a registry from already-parsed tenants data (`{"tenants": [...]}`)."""
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise TenantConfigError(source, [("", f"expected a mapping with `tenants:`, got {what}")])
    try:
        spec = _TenantsFile.model_validate(data)
    except ValidationError as exc:
        raise TenantConfigError(source, _problems(exc)) from None
    problems: list[tuple[str, str]] = []
    first_seen: dict[bytes, tuple[str, str]] = {}  # digest -> (field, tenant name)
    names: set[str] = set()
    entries: list[tuple[Tenant, list[bytes]]] = []
    for index, entry in enumerate(spec.tenants):
        where = f"tenants[{index}]"
        if entry.name in names:
            problems.append((f"{where}.name", f"duplicate tenant name {entry.name!r}"))
        elif entry.name == ANONYMOUS.name:
            # Its ledger rows would mix with those of unauthenticated local use.
            problems.append((f"{where}.name", "'anonymous' is reserved for running without keys"))
        names.add(entry.name)
        keyed = [
            (f"{where}.apiKeys[{i}]", key_digest(k.get_secret_value()))
            for i, k in enumerate(entry.api_keys)
        ]
        keyed += [
            (f"{where}.apiKeySha256[{i}]", bytes.fromhex(h))
            for i, h in enumerate(entry.api_key_sha256)
        ]
        if not keyed:
            problems.append((where, f"tenant {entry.name!r} has no apiKeys or apiKeySha256"))
        for field, digest in keyed:
            first = first_seen.setdefault(digest, (field, entry.name))
            if first[0] != field:
                problems.append(
                    (field, f"duplicate API key: same key as {first[0]} (tenant {first[1]!r})")
                )
        tiers = tuple(tier for tier in TIERS if tier in entry.allowed_tiers)
        spill = entry.spill_over.policy() if entry.spill_over is not None else NO_SPILL
        for tier in spill.to:
            if tier not in tiers:
                problems.append((f"{where}.spillOver.to", f"tier {tier!r} is not in allowedTiers"))
        tenant = Tenant(
            name=entry.name,
            allowed_tiers=tiers,
            requests_per_minute=entry.requests_per_minute,
            tokens_per_minute=entry.tokens_per_minute,
            budget_usd=entry.budget_usd,
            budget_period=entry.budget_period,
            weight=entry.weight,
            max_queued=entry.max_queued,
            spill=spill,
        )
        entries.append((tenant, [digest for _, digest in keyed]))
    if problems:
        raise TenantConfigError(source, problems)
    logger.info("tenants loaded event=tenants_loaded source=%s tenants=%d", source, len(entries))
    return TenantRegistry(entries)


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        field = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}"
            for part in field_path(error["loc"])
        )
        problems.append((field.lstrip("."), error["msg"]))
    return problems
