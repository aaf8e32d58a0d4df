"""Fair share across a fleet, on real processes: three `tiergate router` processes on one
PostgreSQL ledger in front of one sim node with 8 slots, tenants a, b and c (weights 1, 1, 2)
each flooding the tier through a router of its own, and a light tenant sending now and then
through the first. The routers' own counts of the tokens they served each tenant, added up,
give the shares; the light tenant's client times its first tokens (a uniquely named module:
conftest names clash). benchmarks/fleet_fairness.py prints the same figures.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flood_clients import Caller, attained_tokens, flood, p90, shares
from process_helpers import ROUTER_LISTENING, Running, launch, start_sim_node, wait_listening

#: Tenants and their weights: the flooders a, b, c, and the light tenant.
WEIGHTS = {"a": 1, "b": 1, "c": 2, "light": 1}
#: The node's batch cap: the tier's slots.
SLOTS = 8
#: Which router each flooder sends through (the light tenant uses the first).
FLOODERS = ("a", "b", "c")

CONFIG = """\
router:
  tenantsFile: {tenants}
  ledgerUrl: '{dsn}'
  fleetFairShareIntervalS: {interval}
  headroomPerPool: {headroom}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, chips: 1,
      servedModelName: coder, batching: {{maxNumSeqs: {slots}}}, endpoints: [{node}]}}
"""


def key(tenant: str) -> str:
    return f"{tenant}-key-0123456789"


@dataclass
class Fleet:
    routers: list[Running]
    node: Running


@contextmanager
def fleet(
    folder: Path, dsn: str, *, interval_s: float | None, headroom: int = 0
) -> Iterator[Fleet]:
    """Three routers on the ledger at `dsn` in front of one sim node of SLOTS slots,
    exchanging fair-share claims every `interval_s` (None: each on its own). Every process is
    stopped on exit."""
    tenants = folder / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        + "".join(
            f"  - {{name: {t}, apiKeys: [{key(t)}], weight: {w}}}\n" for t, w in WEIGHTS.items()
        )
    )
    node = start_sim_node(
        folder / "node.log", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm",
        "--served-model-name", "coder", "--max-num-seqs", str(SLOTS),
    )  # fmt: skip
    config = folder / "router.yaml"
    config.write_text(
        CONFIG.format(
            tenants=tenants,
            dsn=dsn,
            slots=SLOTS,
            node=node.url,
            headroom=headroom,
            interval="null" if interval_s is None else interval_s,
        )  # fmt: skip
    )
    started: list[Running] = []
    try:
        command = ["router", "--config", str(config), "--port", "0", "--metrics-port", "0"]
        for i in range(len(FLOODERS)):
            started.append(launch(command, folder / f"router-{i}.log"))
        for router in started:
            wait_listening(router, ROUTER_LISTENING)
        yield Fleet(started, node)
    finally:
        for router in started:
            router.stop()
        node.stop()


@dataclass
class Measured:
    """Each flooder's share of the tokens the fleet served it and the others over the
    window, the tokens per second the fleet served them, and the light tenant's times to first
    token (inf for one refused)."""

    shares: dict[str, float]
    light_ttfts_s: list[float]
    flood_tokens_per_s: float = 0.0

    @property
    def light_p90_s(self) -> float:
        return p90(self.light_ttfts_s)

    def off_by(self) -> dict[str, float]:
        """Each flooder's share relative to what its weight gives it, less one."""
        total = sum(WEIGHTS[t] for t in FLOODERS)
        return {t: self.shares.get(t, 0.0) / (WEIGHTS[t] / total) - 1 for t in FLOODERS}


#: The light tenant: one client, a short prompt, a few tokens, a pause between requests.
LIGHT = Caller("light", 1, prompt_tokens=64, max_tokens=8, pause_s=0.7)


def light_alone(fleet: Fleet, seconds: float = 7.0) -> list[float]:
    """The light tenant's times to first token on the idle tier (but the first request's,
    which opens the connections)."""
    sent = asyncio.run(flood(fleet.routers[0].url, [LIGHT], seconds, key))
    return [math.inf if s.ttft_s is None else s.ttft_s for s in sent[1:]]


async def flooded(
    fleet: Fleet, *, clients: int = 12, warmup_s: float = 4.0, window_s: float = 12.0
) -> Measured:
    """a, b and c flood through routers 0, 1 and 2 (`clients` each, closed loops of 32-token
    replies) while the light tenant sends through router 0; shares over a window after
    `warmup_s`, and the light tenant's TTFTs within it (two fleets at once:
    flood_clients.side_by_side)."""
    duration_s = warmup_s + window_s

    def tokens() -> dict[str, float]:
        found: dict[str, float] = {}
        for router in fleet.routers:
            for tenant, n in attained_tokens(router.metrics_url).items():
                found[tenant] = found.get(tenant, 0.0) + n
        return {t: found.get(t, 0.0) for t in FLOODERS}

    loads = [
        asyncio.create_task(
            flood(router.url, [Caller(tenant, clients, vary=True)], duration_s, key)
        )
        for router, tenant in zip(fleet.routers, FLOODERS, strict=True)
    ]
    light = asyncio.create_task(flood(fleet.routers[0].url, [LIGHT], duration_s, key))
    await asyncio.sleep(warmup_s)
    before = await asyncio.to_thread(tokens)
    await asyncio.sleep(window_s)
    after = await asyncio.to_thread(tokens)
    await asyncio.gather(*loads)
    sent = await light
    ttfts = [math.inf if s.ttft_s is None else s.ttft_s for s in sent if s.sent_s >= warmup_s]
    served = sum(after.values()) - sum(before.values())
    return Measured(shares(before, after), ttfts, served / window_s)
