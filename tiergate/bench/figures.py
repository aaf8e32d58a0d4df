"""What the per-tier and the per-tenant figures share: percentiles, milliseconds, tier order."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tiergate.router.base.tiers import TIERS

__all__ = ["in_tier_order", "ms", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0..100) of `values`, linearly interpolated; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float | None) -> float | None:
    """Seconds as milliseconds; None stays None."""
    return None if seconds is None else seconds * 1000.0


def in_tier_order(tiers: Iterable[str]) -> list[str]:
    """`tiers` in the order of TIERS, unknown names last (alphabetically)."""
    return sorted(tiers, key=lambda t: (TIERS.index(t) if t in TIERS else len(TIERS), t))
