"""How a tier's slots are shared out among the router processes of a fleet: a pure function of
what each process published (router/fleet_share.py exchanges it through PostgreSQL).

Each process claims, per tenant, the slots the tenant holds there and the requests it has
waiting there. The tier's slots go to tenants by weighted max-min fairness over their demand
across the fleet (water-filling: no tenant gets more than it asks, and a tenant that asks more
than its weight's share gets that share of what the others leave). Slots are whole: the slot a
fraction leaves over goes to the tenant the fleet served least lately, per unit of weight, so
over time each tenant's share follows its fraction. A tenant's slots are split over the
processes it waits in by its demand there. Slots nobody asks for are spare, split evenly over
the live processes, so a process admits a burst at once without waiting for an exchange.

Every process computes the same answer from the same claims, so the slots handed out add up to
the tier's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Claim", "HolderSlots", "allot", "water_fill"]

#: Below this, a fraction of a slot is rounding error.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Claim:
    """What one router process (`holder`) published for one tenant in one tier: the slots it
    holds there, its requests waiting there, and the tokens the tier served it there lately
    (`served`, decayed: router/fleet_share.py)."""

    holder: str
    tenant: str
    weight: float
    holding: int
    waiting: int
    served: float = 0.0

    @property
    def demand(self) -> int:
        return self.holding + self.waiting


@dataclass(frozen=True, slots=True)
class HolderSlots:
    """What one process may fill of a tier: slots for each of its tenants, and `spare` slots
    for any request."""

    tenants: Mapping[str, int]
    spare: int = 0

    @property
    def total(self) -> int:
        return sum(self.tenants.values()) + self.spare


def water_fill(
    slots: float, demand: Mapping[str, int], weight: Mapping[str, float]
) -> dict[str, float]:
    """Weighted max-min fair shares of `slots`: each tenant with demand gets at most its
    demand, and those asking more than their weight's share of what is left split it by
    weight. Tenants without demand get nothing (and are left out)."""
    active = {t for t, d in demand.items() if d > 0}
    shares: dict[str, float] = {}
    left = float(slots)
    while active:
        level = left / sum(weight[t] for t in active)
        satisfied = {t for t in active if demand[t] <= level * weight[t] + _EPS}
        if not satisfied:
            shares.update({t: level * weight[t] for t in active})
            break
        for t in satisfied:
            shares[t] = float(demand[t])
            left -= demand[t]
        active -= satisfied
    return shares


def allot(
    slots: int, claims: Iterable[Claim], holders: Iterable[str] = ()
) -> dict[str, HolderSlots]:
    """Each live process's slots of a tier of `slots` slots, from every process's `claims`.

    `holders` names the live processes that claim nothing (they get a part of the spare
    slots); a process that claims something is live. A process that is gone is simply not
    among them: its tenants' slots go to the others. ValueError for a negative slot count, a
    weight that is not a positive number, negative counts, or a tenant claimed twice by one
    process."""
    if slots < 0:
        raise ValueError(f"a tier has no negative slots ({slots})")
    claims = list(claims)
    _check(claims)
    demand: dict[str, int] = {}
    weight: dict[str, float] = {}
    served: dict[str, float] = {}
    for c in claims:
        demand[c.tenant] = demand.get(c.tenant, 0) + c.demand
        weight[c.tenant] = max(weight.get(c.tenant, 0.0), c.weight)
        served[c.tenant] = served.get(c.tenant, 0.0) + c.served
    tenant_slots = _whole(water_fill(slots, demand, weight), served, weight)
    live = sorted({*holders, *(c.holder for c in claims)})
    out: dict[str, dict[str, int]] = {h: {} for h in live}
    for tenant, n in tenant_slots.items():
        mine = [c for c in claims if c.tenant == tenant and c.demand > 0]
        for holder, part in _split(n, mine).items():
            if part:
                out[holder][tenant] = part
    spare = slots - sum(tenant_slots.values())
    each, extra = divmod(spare, len(live)) if live else (0, 0)
    return {h: HolderSlots(out[h], each + (i < extra)) for i, h in enumerate(live)}


def _check(claims: list[Claim]) -> None:
    seen: set[tuple[str, str]] = set()
    for c in claims:
        if not (math.isfinite(c.weight) and c.weight > 0):
            raise ValueError(f"tenant {c.tenant!r}: a weight must be a positive number")
        if c.holding < 0 or c.waiting < 0 or not (math.isfinite(c.served) and c.served >= 0):
            raise ValueError(f"tenant {c.tenant!r}: negative holding, waiting or served")
        if (c.holder, c.tenant) in seen:
            raise ValueError(f"tenant {c.tenant!r} claimed twice by {c.holder!r}")
        seen.add((c.holder, c.tenant))


def _whole(
    shares: Mapping[str, float], served: Mapping[str, float], weight: Mapping[str, float]
) -> dict[str, int]:
    """Whole slots from fractional shares: each tenant its share rounded down, and the slots
    the fractions add up to go to the tenants with a fraction the fleet served least lately
    per unit of weight (on a tie, the larger fraction, then the name)."""
    whole = {t: math.floor(x + _EPS) for t, x in shares.items()}
    left = round(sum(shares.values())) - sum(whole.values())
    fractional = [t for t, x in shares.items() if x - whole[t] > _EPS]
    fractional.sort(key=lambda t: (served[t] / weight[t], whole[t] - shares[t], t))
    for t in fractional[: max(left, 0)]:
        whole[t] += 1
    return whole


def _split(n: int, claims: list[Claim]) -> dict[str, int]:
    """`n` slots of one tenant over the processes it claims demand in, by their demand (the
    slots fractions leave go to the largest fraction, then the process holding more, then by
    name), never more than a process's demand."""
    total = sum(c.demand for c in claims)
    if not total:
        return {}
    exact = {c.holder: n * c.demand / total for c in claims}
    parts = {h: math.floor(x + _EPS) for h, x in exact.items()}
    holding = {c.holder: c.holding for c in claims}
    order = sorted(exact, key=lambda h: (parts[h] - exact[h], -holding[h], h))
    for h in order[: n - sum(parts.values())]:
        parts[h] += 1
    return parts
