"""The requests waiting in the router's tier queues, attributed to the pools that will serve
them: what the operator's autoscaler adds to the load it reads at a pool's pods.

A request waits for a tier, not a pool: which pool serves it is picked once a slot frees. So
the requests waiting for a (tier, model) are shared among the pools of that tier serving that
model in proportion to the slots each offers (its endpoints times its batch cap), which is how
admission sizes the tier's queue and so how its slots free. The usual case, one pool per
(tier, model), gets them all. With no endpoint yet they are shared evenly among the pools
that name the model. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from tiergate.router.base.tiers import Tier
from tiergate.router.discovery.view import PoolView

__all__ = ["waiting_per_pool"]


def waiting_per_pool(view: PoolView, waiting: Mapping[tuple[Tier, str], int]) -> dict[str, float]:
    """Every pool of `view` (zeros included) and the requests of `waiting` ((tier, model)
    -> requests) attributed to it."""
    share = dict.fromkeys(view.pools, 0.0)
    for (tier, model), count in waiting.items():
        if count <= 0:
            continue
        slots: dict[str, float] = {}
        for endpoint in view.candidates(model, tier):
            pool = view.pools.get(endpoint.pool)
            if pool is not None:
                slots[pool.spec.name] = slots.get(pool.spec.name, 0.0) + pool.slots
        if not slots:
            named = [
                name
                for name, pool in view.pools.items()
                if pool.spec.tier == tier and model in pool.spec.names
            ]
            slots = dict.fromkeys(named, 1.0)
        total = sum(slots.values())
        for name, offered in slots.items():
            share[name] += count * offered / total
    return share
