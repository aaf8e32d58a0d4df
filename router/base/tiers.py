"""Tier resolution: which tier a request asks for (first match wins).

1. header `x-tiergate-tier: batched|premium|wafer-scale`
2. Anthropic style `"speed": "fast"` -> premium
3. OpenAI `service_tier`: `priority` -> premium; `flex` -> batched at the lowest priority;
   `default`, `auto` or absent state no preference and fall through
4. a model served only by wafer-scale pools (e.g. a distilled `*-spark`) -> wafer-scale
5. otherwise batched

`service_tier: auto` additionally lets admission serve the request on another tier when its
own is saturated; the resolution records that.

A reply's `service_tier` field speaks OpenAI's vocabulary, which clients switch on
(`openai_service_tier`): premium is `priority`; batched is `default`, or `flex` when asked for
at flex priority; wafer-scale is `default` (OpenAI offers its wafer-served model as a model of
its own, not as a service tier). The tier's own name is in the `x-tiergate-tier` header.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tiergate.common.tiers import DEFAULT_TIER, DEFINITIONS, TIERS, Priority, Tier
from tiergate.router.base.errors import RouterError

__all__ = [
    "DEFAULT_TIER",
    "TIERS",
    "TIER_HEADER",
    "Priority",
    "Tier",
    "TierChoice",
    "openai_service_tier",
    "resolve_tier",
]
TIER_HEADER = "x-tiergate-tier"

#: `"speed": "fast"` and OpenAI's `service_tier` values that name a tier (tiergate/common/tiers.py).
_FAST = next(t.name for t in DEFINITIONS.values() if t.speed_fast)
_BY_SERVICE_TIER: dict[str, Tier] = {
    t.openai_service_tier: t.name for t in DEFINITIONS.values() if t.openai_service_tier
}
#: The `service_tier` values a request may send: those, plus flex and those that state no tier.
_SERVICE_TIERS = sorted({*_BY_SERVICE_TIER, "flex", "default", "auto"})


@dataclass(frozen=True, slots=True)
class TierChoice:
    """The resolved tier and how it was chosen."""

    tier: Tier
    source: str  # header | speed | service_tier | model | default
    priority: Priority
    may_fall_back: bool  # service_tier: auto


def resolve_tier(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    tiers_serving_model: Collection[Tier],
) -> TierChoice:
    """Resolve the tier of one request; raise RouterError(400) for an unknown tier name.

    `headers` must have lower-case names. `tiers_serving_model` are the tiers with at least one
    pool serving the requested model (empty when none does; that 404 is decided elsewhere).
    """
    service_tier = body.get("service_tier")
    may_fall_back = service_tier == "auto"
    header = headers.get(TIER_HEADER)
    if header is not None:
        tier = header.strip().lower()
        if tier not in DEFINITIONS:
            raise RouterError(
                400,
                f"unknown tier {header!r} in {TIER_HEADER}; choose one of: {', '.join(TIERS)}",
                code="unknown_tier",
                param=TIER_HEADER,
            )
        known = DEFINITIONS[tier].name
        return TierChoice(known, "header", _priority(known, service_tier), may_fall_back)

    speed = body.get("speed")
    if speed is not None and speed not in ("fast", "standard"):
        raise RouterError(
            400,
            f"unknown speed {speed!r}; choose one of: fast, standard",
            code="unknown_tier",
            param="speed",
        )
    if speed == "fast":
        return TierChoice(_FAST, "speed", _priority(_FAST, None), may_fall_back)

    if service_tier is not None and service_tier not in _SERVICE_TIERS:
        raise RouterError(
            400,
            f"unknown service_tier {service_tier!r}; choose one of: {', '.join(_SERVICE_TIERS)}",
            code="unknown_tier",
            param="service_tier",
        )
    named = _BY_SERVICE_TIER.get(service_tier) if isinstance(service_tier, str) else None
    if named is not None:
        return TierChoice(named, "service_tier", _priority(named, None), may_fall_back)
    if service_tier == "flex":
        return TierChoice(DEFAULT_TIER, "service_tier", "flex", may_fall_back)

    serving = set(tiers_serving_model)
    if len(serving) == 1:
        (only,) = serving
        if DEFINITIONS[only].by_model:
            return TierChoice(only, "model", _priority(only, None), may_fall_back)
    return TierChoice(DEFAULT_TIER, "default", "standard", may_fall_back)


def _priority(tier: Tier, service_tier: object) -> Priority:
    """A tier's own priority; `service_tier: flex` lowers a standard one."""
    own = DEFINITIONS[tier].priority
    return "flex" if own == "standard" and service_tier == "flex" else own


def openai_service_tier(tier: Tier, priority: Priority) -> str:
    """The `service_tier` of a reply served in `tier` at `priority`, in OpenAI's words."""
    return "flex" if priority == "flex" else DEFINITIONS[tier].reply_service_tier
