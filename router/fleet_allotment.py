"""How a tier's slots are shared out among the router processes of a fleet: a pure function of
what each process published (router/fleet_share.py exchanges it through PostgreSQL).

Each process claims, per tenant, the slots the tenant holds there and the requests it has
waiting there. The tier's slots go to tenants by weighted max-min fairness over their demand
across the fleet (water-filling: no tenant gets more than it asks, and a tenant that asks more
than its weight's share gets that share of what the others leave). A tenant's slots are split
over the processes it waits in by its demand there. Slots are whole: a slot that fractions
leave over goes to the tenant the fleet served least lately per unit of weight, and within a
tenant to the process that served it least lately per request it claims, so over time each
share follows its fraction. A process holding such a slot cannot keep it by handing it on to
its next waiter: when the turn moves, to another tenant or to another of the tenant's
processes, the next takes it once the request holding it ends; a tenant asking for less than
its share takes its slot at once, its request waiting at the engine if it must. Slots nobody
asks for are spare, split evenly over the live processes, so a process admits a burst at
once without waiting for an exchange.

Every process computes the same answer from the same claims, in whatever order they come (sums
of floats are correctly rounded, ties go by name), so the slots handed out add up to the
tier's, less those still held where a part moved away: turns going round the tenants that ask
for more than their share never fill more than the tier's slots, nor a headroom slot."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

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
    for any request. `held_over`: per tenant, the slots it claimed to hold here beyond its part
    (a part that moved away), when the fleet holds every such slot back where the parts went,
    so that the process may count them apart from its headroom (empty when it does not: a
    tenant asking less than its share took one at once, or the fleet holds more than the tier
    already)."""

    tenants: Mapping[str, int]
    spare: int = 0
    held_over: Mapping[str, int] = field(default_factory=dict)

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
        level = left / math.fsum(weight[t] for t in active)
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
    served: dict[str, list[float]] = {}
    holding: dict[str, int] = {}
    for c in claims:
        demand[c.tenant] = demand.get(c.tenant, 0) + c.demand
        weight[c.tenant] = max(weight.get(c.tenant, 0.0), c.weight)
        served.setdefault(c.tenant, []).append(c.served)
        holding[c.tenant] = holding.get(c.tenant, 0) + c.holding
    shares = water_fill(slots, demand, weight)
    tenant_slots = _whole(shares, served, weight)
    spare = slots - sum(tenant_slots.values())
    met = {t for t, share in shares.items() if share >= demand[t] - _EPS}
    tenant_slots = _withhold(tenant_slots, holding, served, weight, met)
    live = sorted({*holders, *(c.holder for c in claims)})
    out: dict[str, dict[str, int]] = {h: {} for h in live}
    for tenant, n in tenant_slots.items():
        mine = [c for c in claims if c.tenant == tenant and c.demand > 0]
        for holder, part in _split(n, mine).items():
            if part:
                out[holder][tenant] = part
    each, extra = divmod(spare, len(live)) if live else (0, 0)
    over: dict[str, dict[str, int]] = {h: {} for h in live}
    for c in claims:
        if c.holding > (part := out[c.holder].get(c.tenant, 0)):
            over[c.holder][c.tenant] = c.holding - part
    filled = spare + sum(max(c.holding, out[c.holder].get(c.tenant, 0)) for c in claims)
    withheld = filled <= slots  # every process keeping what it holds fits in the tier
    return {
        h: HolderSlots(out[h], each + (i < extra), over[h] if withheld else {})
        for i, h in enumerate(live)
    }


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
    shares: Mapping[str, float], served: Mapping[str, list[float]], weight: Mapping[str, float]
) -> dict[str, int]:
    """Whole slots from fractional shares: each tenant its share rounded down, and the slots
    the fractions add up to go to the tenants with a fraction the fleet served least lately
    per unit of weight (on a tie, the larger fraction, then the name)."""
    per_weight = {t: math.fsum(served[t]) / weight[t] for t in shares}
    return _rounded(shares, lambda t, fraction: (per_weight[t], -fraction, t))


def _withhold(
    slots: Mapping[str, int],
    holding: Mapping[str, int],
    served: Mapping[str, list[float]],
    weight: Mapping[str, float],
    met: Collection[str],
) -> dict[str, int]:
    """`slots` (each tenant's whole slots) less those withheld from the tenants they go to
    while another tenant still holds them: a slot whose turn moved from one tenant to another
    is the second's once the first's request holding it ends (the tenant served most lately per
    unit of weight waits first), so turns going round the tenants that ask for more than their
    share never fill more slots than the tier shares out. A tenant whose demand is `met` in
    full (it asks for less than its share) is never made to wait so: its request may wait at
    the engine for the next slot to free instead, as it would for the next slot in one
    process. A tenant is never cut below what it holds."""
    out = dict(slots)
    over = sum(max(holding.get(t, 0) - n, 0) for t, n in out.items())
    ranked = sorted(
        (t for t in out if t not in met),
        key=lambda t: (math.fsum(served[t]) / weight[t], t),
        reverse=True,
    )
    for t in ranked:
        withheld = min(over, max(out[t] - holding.get(t, 0), 0))
        out[t] -= withheld
        over -= withheld
    return out


def _split(n: int, claims: list[Claim]) -> dict[str, int]:
    """`n` slots of one tenant over the processes it claims demand in, by their demand, never
    more than a process's demand.

    The slots the fractions leave go to the processes with a fraction that served the tenant
    least lately per request they claim (on a tie, the larger fraction, then the process
    holding more, then the name), so with equal demand they take turns. Slots the tenant
    still holds in a process whose part they left are withheld from the processes they go to
    (the one served most lately first) until those requests end: a turn that moves does not
    let the tenant hold its last slot and its next at once."""
    total = sum(c.demand for c in claims)
    if not total:
        return {}
    exact = {c.holder: n * c.demand / total for c in claims}
    per_demand = {c.holder: c.served / c.demand for c in claims}
    holding = {c.holder: c.holding for c in claims}
    parts = _rounded(exact, lambda h, fraction: (per_demand[h], -fraction, -holding[h], h))
    over = sum(max(holding[h] - part, 0) for h, part in parts.items())
    for h in sorted(parts, key=lambda h: (per_demand[h], h), reverse=True):
        withheld = min(over, max(parts[h] - holding[h], 0))
        parts[h] -= withheld
        over -= withheld
    return parts


def _rounded(
    exact: Mapping[str, float], rank: Callable[[str, float], tuple[float | str, ...]]
) -> dict[str, int]:
    """`exact` rounded down, and one more each for as many of the keys left with a fraction as
    the fractions add up to, the first in the order of `rank` (of the key and its fraction)."""
    whole = {k: math.floor(x + _EPS) for k, x in exact.items()}
    left = round(math.fsum(exact.values())) - sum(whole.values())
    fraction = {k: x - whole[k] for k, x in exact.items() if x - whole[k] > _EPS}
    for k in sorted(fraction, key=lambda k: rank(k, fraction[k]))[: max(left, 0)]:
        whole[k] += 1
    return whole
