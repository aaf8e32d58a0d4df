"""Spill-over policy: which tiers a tenant's request may move to when its own tier is busy,
and the most the tenant will pay there.

In the tenants file, per tenant::

    spillOver:
      to: [premium]                 # tiers a request may move to
      maxOutputUsdPerMillion: 25    # the most per million output tokens where it moves
      notForTools: [wafer-scale]    # tiers a request with tools never moves to

A request of a tenant with a policy may say otherwise for itself:
`x-tiergate-spill-to: premium,wafer-scale` (or `none`) replaces `to`, and
`x-tiergate-spill-max-usd-per-mtok: 12.5` replaces the price cap. Neither reaches past the
tenant's `allowedTiers`, and `notForTools` always holds. A tenant without a policy is never
moved: the headers are checked, and change nothing, since whether a tenant's requests may move
at all is the tenants file's to say, not its clients'. Where a request goes is decided in
router/request/spill.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TIERS, Tier

__all__ = [
    "SPILL_PRICE_HEADER",
    "SPILL_TO_HEADER",
    "SpillOverSpec",
    "SpillPolicy",
    "parse_spill_headers",
]

SPILL_TO_HEADER = "x-tiergate-spill-to"
SPILL_PRICE_HEADER = "x-tiergate-spill-max-usd-per-mtok"


@dataclass(frozen=True, slots=True)
class SpillPolicy:
    """Where a request may move, and the most it may cost there per million output tokens
    (None: no cap). An empty `to` moves nothing."""

    to: tuple[Tier, ...] = ()
    max_output_usd_per_million: float | None = None
    not_for_tools: tuple[Tier, ...] = ()

    def tiers_for(self, has_tools: bool) -> tuple[Tier, ...]:
        """The tiers a request may move to (with tools: but those excluded for tools)."""
        if not has_tools:
            return self.to
        return tuple(t for t in self.to if t not in self.not_for_tools)


#: No spill-over: the policy of a tenant whose entry has none.
NO_SPILL = SpillPolicy()


class SpillOverSpec(BaseModel):
    """A tenant's `spillOver` in the tenants file."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, frozen=True)

    to: Annotated[list[Tier], Field(min_length=1)] = Field(
        description="Tiers a request may move to (within allowedTiers); "
        "the header x-tiergate-spill-to replaces it for one request."
    )
    max_output_usd_per_million: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="The most a moved request may cost per million output tokens; "
        "x-tiergate-spill-max-usd-per-mtok replaces it. None: no cap.",
    )
    not_for_tools: list[Tier] = Field(
        default=[], description="Tiers a request with tools never moves to."
    )

    def policy(self) -> SpillPolicy:
        return SpillPolicy(
            to=tuple(t for t in TIERS if t in self.to),
            max_output_usd_per_million=self.max_output_usd_per_million,
            not_for_tools=tuple(t for t in TIERS if t in self.not_for_tools),
        )


def parse_spill_headers(
    headers: Mapping[str, str], policy: SpillPolicy, allowed: tuple[Tier, ...], tenant: str
) -> SpillPolicy:
    """`policy` with what the request's spill headers replace; 400 for a header the router
    cannot read, 403 for a tier the tenant may not use. Without a policy (no tier to move to)
    the headers are checked all the same and `policy` is returned as it is."""
    to_header = headers.get(SPILL_TO_HEADER)
    price_header = headers.get(SPILL_PRICE_HEADER)
    to, price = policy.to, policy.max_output_usd_per_million
    if to_header is not None:
        to = _tiers(to_header, allowed, tenant)
    if price_header is not None:
        price = _price(price_header)
    if not policy.to or (to_header is None and price_header is None):
        return policy
    return SpillPolicy(to, price, policy.not_for_tools)


def _tiers(value: str, allowed: tuple[Tier, ...], tenant: str) -> tuple[Tier, ...]:
    names = [part.strip().lower() for part in value.split(",") if part.strip()]
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in TIERS]
    if unknown or not names:
        raise RouterError(
            400,
            f"{SPILL_TO_HEADER}: expected tiers separated by commas (of: {', '.join(TIERS)}) "
            f"or none, got {value[:64]!r}",
            code="invalid_spill_policy",
            param=SPILL_TO_HEADER,
        )
    refused = [n for n in names if n not in allowed]
    if refused:
        raise RouterError(
            403,
            f"tenant {tenant!r} may not use tier {refused[0]!r}, named in {SPILL_TO_HEADER}; "
            f"allowed tiers: {', '.join(allowed)}",
            type="permission_error",
            code="tier_not_allowed",
        )
    return tuple(t for t in TIERS if t in names)


def _price(value: str) -> float:
    try:
        price = float(value.strip())
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise RouterError(
            400,
            f"{SPILL_PRICE_HEADER}: expected USD per million output tokens, a number >= 0, "
            f"got {value[:32]!r}",
            code="invalid_spill_policy",
            param=SPILL_PRICE_HEADER,
        )
    return price
