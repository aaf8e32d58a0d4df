"""Branch and bound over screened configurations, in the order of their floor cost.

Each configuration is simulated at the fewest replicas that meet the SLO, below the cost it
must beat (never one whose floor alone is more than the replicas allowed); once a
configuration's steady-state floor alone costs at least that, it is pruned (and, past the
runner-up's cost, so is every one after it). Two costs are beaten: the plan's, and the
runner-up's, the cheapest on another accelerator than the plan's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .confirm import Trial, fewest_replicas
from .screen import Screen

__all__ = ["Found", "Progress", "branch_and_bound"]


class Progress(Protocol):
    """Where the search reports how far it got (a terminal bar, or nothing)."""

    def start(self, what: str, total: int) -> None: ...

    def advance(self, steps: int = 1) -> None: ...


@dataclass(slots=True)
class Found:
    """What the branch and bound confirmed, missed and pruned."""

    met: list[tuple[Screen, Trial]] = field(default_factory=list)
    #: (configuration, its closest trial, whether its replicas were capped by cost).
    misses: list[tuple[Screen, Trial, bool]] = field(default_factory=list)
    #: (configuration, the cost it could not beat).
    pruned: list[tuple[Screen, float]] = field(default_factory=list)
    #: Configurations whose steady-state floor alone is more than the replicas allowed.
    beyond: list[Screen] = field(default_factory=list)
    simulated: int = 0
    simulations: int = 0

    def best(self, other_than: str | None = None) -> tuple[Screen, Trial]:
        """The cheapest met (most attained on a tie), optionally on another accelerator."""
        return min(
            (m for m in self.met if m[0].candidate.accelerator != other_than),
            key=lambda m: (m[1].cost_per_hour_usd, -m[1].attainment),
        )

    def cost_of_best(self, other_than: str | None = None) -> float:
        try:
            return self.best(other_than)[1].cost_per_hour_usd
        except ValueError:
            return math.inf


def branch_and_bound(
    feasible: list[Screen],
    trial_of: Callable[[Screen], Callable[[int], Trial]],
    max_replicas: int,
    progress: Progress,
) -> Found:
    """Confirm configurations in floor-cost order: the cheapest that meets the SLO, and the
    cheapest on another accelerator (the runner-up), pruning what cannot beat either."""
    found = Found()
    for i, s in enumerate(feasible):
        best_cost = found.cost_of_best()
        best_accelerator = found.best()[0].candidate.accelerator if found.met else None
        alternative_cost = found.cost_of_best(other_than=best_accelerator)
        if s.floor_cost_per_hour_usd >= alternative_cost:  # >= best_cost too: nothing left
            found.pruned += [(rest, best_cost) for rest in feasible[i:]]
            break
        # On the best's accelerator a configuration can only matter by beating it.
        same = s.candidate.accelerator == best_accelerator
        bound = best_cost if same else alternative_cost
        if s.floor_cost_per_hour_usd >= bound:
            found.pruned.append((s, bound))
            continue
        if s.floor_replicas > max_replicas:
            found.beyond.append(s)  # no simulation can make it meet
            progress.advance()
            continue
        price = s.cost_per_replica_hour_usd
        affordable = max_replicas if math.isinf(bound) else math.ceil(bound / price) - 1
        limit = min(max_replicas, affordable)
        met, runs = fewest_replicas(trial_of(s), s.floor_replicas, limit)
        progress.advance()
        found.simulated += 1
        found.simulations += len(runs)
        if met is not None:
            found.met.append((s, met))
        else:
            closest = max(runs, key=lambda t: (t.attainment, -t.replicas))
            found.misses.append((s, closest, limit < max_replicas))
    return found
