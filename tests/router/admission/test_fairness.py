"""Weighted fair share inside a saturated tier, on real processes: two routers, one admitting
fairly and one first come, first served, each in front of a sim node of its own. Tenants flood
the tiers from closed loops of clients; the routers' own counts of the tokens they served each
tenant give the shares, and the clients time the first token.

The shares are measured on both tiers at once (a share is a ratio: a busy machine slows every
tenant alike). The light tenant's times to first token are measured one tier at a time, each
flood with the machine to itself, as its idle times are: two floods side by side slow both
routers' and nodes' event loops, which the idle times would not show.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flood_clients import Caller, attained_tokens, flood, p90, shares, side_by_side
from process_helpers import Running, start_router, start_sim_node

#: Shares and times to first token on real processes: measured with the machine to itself.
pytestmark = pytest.mark.serial

#: Tenants, their weights: the flooders a, b, c and the pair heavy, light.
WEIGHTS = {"a": 1, "b": 1, "c": 2, "heavy": 1, "light": 1}
#: How far a share may be from its weight's, relative to it.
SHARE_TOLERANCE = 0.10

CONFIG = """\
router:
  tenantsFile: {tenants}
  ledgerPath: {ledger}
  admissionOrder: {order}
pools:
  - {{name: b, tier: batched, servedModelName: coder, endpoints: [{node}], {serving}}}
"""


def key(tenant: str) -> str:
    return f"{tenant}-key-0123456789"


@dataclass
class Routers:
    fair: Running
    fcfs: Running


def two_routers(
    tmp: Path, model: str, accelerator: str, chips: int, seqs: int
) -> Iterator[Routers]:
    """A fair and a fcfs router, each in front of a sim node of its own serving `model` on
    `chips` x `accelerator`, `seqs` sequences at once."""
    tenants = tmp / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        + "".join(
            f"  - {{name: {t}, apiKeys: [{key(t)}], weight: {w}}}\n" for t, w in WEIGHTS.items()
        )
    )
    serving = (
        f"model: {model}, accelerator: {accelerator}, chips: {chips}, "
        f"batching: {{maxNumSeqs: {seqs}}}"
    )
    nodes: list[Running] = []
    routers: dict[str, Running] = {}
    try:
        for order in ("fair", "fcfs"):
            node = start_sim_node(
                tmp / f"node-{order}.log", "--model", model, "--accelerator", accelerator,
                "--chips", str(chips), "--served-model-name", "coder", "--max-num-seqs", str(seqs),
            )  # fmt: skip
            nodes.append(node)
            config = tmp / f"router-{order}.yaml"
            config.write_text(
                CONFIG.format(
                    tenants=tenants,
                    ledger=tmp / f"ledger-{order}.sqlite",
                    order=order,
                    node=node.url,
                    serving=serving,
                )  # fmt: skip
            )
            routers[order] = start_router(config, tmp / f"router-{order}.log")
        yield Routers(**routers)
    finally:
        for running in [*routers.values(), *nodes]:
            running.stop()


@pytest.fixture(scope="module")
def small_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routers]:
    """An 8B model on one H100, 4 sequences at once: replies of 32 tokens in about 0.2 s."""
    yield from two_routers(tmp_path_factory.mktemp("small"), "llama-3.1-8b", "h100-sxm", 1, 4)


@pytest.fixture(scope="module")
def wide_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routers]:
    """A 70B model on four A100s, 16 sequences at once: a slot frees every decode step or so,
    and a 1000-token prompt takes about 0.25 s to its first token on the idle tier."""
    yield from two_routers(tmp_path_factory.mktemp("wide"), "llama-3.1-70b", "a100-80gb", 4, 16)


async def flooded_shares(router: Running) -> dict[str, float]:
    """Tenants a, b, c (weights 1, 1, 2) from 24, 8 and 8 clients: ten times the tier's four
    slots. Their shares of the tokens served over a window after the queue filled."""
    callers = [Caller("a", 24), Caller("b", 8), Caller("c", 8)]
    load = asyncio.create_task(flood(router.url, callers, 14.0, key))
    await asyncio.sleep(3.0)  # the queue fills and the shares settle
    before = await asyncio.to_thread(attained_tokens, router.metrics_url)
    await asyncio.sleep(10.0)
    after = await asyncio.to_thread(attained_tokens, router.metrics_url)
    await load
    return shares(before, after)


def off_by(found: dict[str, float], tenants: list[str]) -> dict[str, float]:
    """Each tenant's share relative to what its weight gives it, less one."""
    total = sum(WEIGHTS[t] for t in tenants)
    return {t: found.get(t, 0.0) / (WEIGHTS[t] / total) - 1 for t in tenants}


def test_a_saturated_tier_shares_its_tokens_by_weight_and_fcfs_does_not(
    small_tier: Routers,
) -> None:
    measured = side_by_side(flooded_shares(small_tier.fair), flooded_shares(small_tier.fcfs))
    fair, fcfs = (off_by(found, ["a", "b", "c"]) for found in measured)
    report = f"fair admission off by {fair}; fcfs off by {fcfs}"
    assert all(abs(x) <= SHARE_TOLERANCE for x in fair.values()), report
    # First come, first served gives each tenant what its clients grab: a's 24 of 40.
    assert fcfs["a"] > SHARE_TOLERANCE and fcfs["c"] < -SHARE_TOLERANCE, report


async def light_ttfts(url: str, *, flooded: bool) -> list[float]:
    """Time to first token of a light tenant's requests (one client, a 1000-token prompt
    every second and a half or so), alone or while a heavy tenant floods the tier from 48
    clients. Counted in tokens, the light tenant asks for less than half of what the tier
    serves: a fair tier serves it as soon as a slot frees.
    A light request that got no first token (shed) counts as an infinite time."""
    light = Caller("light", 1, prompt_tokens=1000, max_tokens=8, pause_s=1.5)
    heavy = Caller("heavy", 48, prompt_tokens=16, max_tokens=16, vary=True)
    if not flooded:
        sent = await flood(url, [light], 10.0, key)
    else:
        sent = await flood(url, [light, heavy], 20.0, key)
        sent = [s for s in sent if s.sent_s >= 3.0]  # once the queue is full
    # A request shed (429) never saw a first token.
    return [math.inf if s.ttft_s is None else s.ttft_s for s in sent if s.tenant == "light"]


def test_a_light_tenant_keeps_its_time_to_first_token_while_another_floods(
    wide_tier: Routers,
) -> None:
    idle = p90(asyncio.run(light_ttfts(wide_tier.fair.url, flooded=False)))
    # One tier at a time, like the idle times (module docstring).
    fair = p90(asyncio.run(light_ttfts(wide_tier.fair.url, flooded=True)))
    fcfs = p90(asyncio.run(light_ttfts(wide_tier.fcfs.url, flooded=True)))
    report = f"light TTFT p90 s: idle {idle:.3f}, fair {fair:.3f}, fcfs {fcfs:.3f}"
    assert fair <= 2 * idle, report
    # First come, first served: it waits behind the heavy tenant's queue.
    assert fcfs > 2 * idle, report
