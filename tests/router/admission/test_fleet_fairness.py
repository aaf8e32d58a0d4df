"""Fair share across three router processes on one PostgreSQL ledger (router/fleet_share.py),
on real processes: tenants a, b and c (weights 1, 1, 2) each flood one sim node of 8 slots
through a router of its own, and a light tenant sends now and then through the first
(tests/router/fleet_fairness_helpers.py). With the routers exchanging their claims, the
tokens served follow the weights and the light tenant starts about as fast as on an idle
tier; with each router on its own (`fleetFairShareIntervalS: null`), each admits a whole
batch, the node serves the surplus first come, first served, and neither holds.

A router killed under load leaves its slots to the others once its claims expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet_fairness_helpers import Fleet, fleet, flooded, key, light_alone
from flood_clients import Caller, flood, p90, side_by_side
from polling_helpers import until
from postgres_server import PostgresServer
from prometheus_client.parser import text_string_to_metric_families

#: Shares and times to first token on real processes: measured with the machine to itself.
pytestmark = pytest.mark.serial

#: How far a share may be from its weight's, relative to it.
SHARE_TOLERANCE = 0.10
#: Slots of each pool held for a tenant below its share: what takes a light tenant within a
#: step of idle while others flood (docs/concepts/admission.md).
HEADROOM = 1


def near_idle_s(idle_p90_s: float) -> float:
    """The light tenant's TTFT p90 under the flood counted as near idle: twice idle, plus
    200 ms for a busy machine (on their own, the routers leave it about half a second behind
    the others' surplus at the node)."""
    return 2 * idle_p90_s + 0.2


@pytest.fixture(scope="module")
def exchanging(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    dsn = postgres.dsn(postgres.create_database())
    folder = tmp_path_factory.mktemp("fleet-fair")
    with fleet(folder, dsn, interval_s=0.2, headroom=HEADROOM) as routers:
        yield routers


@pytest.fixture(scope="module")
def on_their_own(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    dsn = postgres.dsn(postgres.create_database())
    folder = tmp_path_factory.mktemp("fleet-own")
    with fleet(folder, dsn, interval_s=None, headroom=HEADROOM) as routers:
        yield routers


def test_three_routers_share_the_tier_by_weight_only_when_they_exchange_claims(
    exchanging: Fleet, on_their_own: Fleet
) -> None:
    idle = p90(light_alone(exchanging))
    fair, own = side_by_side(flooded(exchanging), flooded(on_their_own))
    report = (
        f"exchanging: shares {fair.shares}, light TTFT p90 {fair.light_p90_s:.3f} s; "
        f"on their own: shares {own.shares}, light TTFT p90 {own.light_p90_s:.3f} s; "
        f"light alone p90 {idle:.3f} s"
    )
    assert all(abs(x) <= SHARE_TOLERANCE for x in fair.off_by().values()), report
    assert fair.light_p90_s <= near_idle_s(idle), report
    # On their own, each router admits a batch's worth: the node serves about a third each,
    # and the light tenant waits behind the others' surplus at the node.
    assert own.off_by()["c"] < -SHARE_TOLERANCE, report
    assert own.light_p90_s > near_idle_s(idle), report


def slots(metrics_url: str) -> float:
    """The batched tier's slots the fleet allotted one router (tiergate_fair_share_slots)."""
    text = httpx.get(metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tiergate_fair_share_slots" and sample.labels["tier"] == "batched":
                return sample.value
    return 0.0


def test_a_router_killed_under_load_leaves_its_slots_to_the_others(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    dsn = postgres.dsn(postgres.create_database())
    with fleet(tmp_path, dsn, interval_s=0.2) as three:
        first, second, third = three.routers

        async def until_it_dies(http: httpx.AsyncClient) -> None:
            """One of c's clients on the third router, sending until the router is gone."""
            body = {"model": "coder", "messages": [{"role": "user", "content": "go"}],
                    "max_tokens": 32}  # fmt: skip
            headers = {"authorization": f"Bearer {key('c')}"}
            while True:
                try:
                    await http.post(third.url + "/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError:
                    return

        async def load() -> None:
            async with httpx.AsyncClient(timeout=30) as http:
                await asyncio.gather(
                    *(
                        flood(router.url, [Caller(tenant, 12, vary=True)], 12.0, key)
                        for router, tenant in ((first, "a"), (second, "b"))
                    ),
                    *(until_it_dies(http) for _ in range(12)),
                )

        async def watch() -> None:
            task = asyncio.create_task(load())
            killed = False
            try:

                def shared_by_three() -> bool:
                    """Each router holds some of the 8 slots, the third too. Allotments are
                    computed every 0.2 s from claims each router reads at its own time: while
                    the load ramps up, two may each count slots the other also counts."""
                    held = [slots(r.metrics_url) for r in three.routers]
                    return min(held) > 0 and held[0] + held[1] < 8

                await asyncio.to_thread(
                    until, shared_by_three, "the three routers never shared the slots", 10.0
                )
                third.stop(signal.SIGKILL)  # its clients' requests fail from now on
                killed = True

                def the_others_have_all() -> bool:
                    return slots(first.metrics_url) + slots(second.metrics_url) == 8

                await asyncio.to_thread(until, the_others_have_all, "slots lost", 5.0)
            finally:
                if not killed:  # a check failed first: the third's clients would send forever
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        asyncio.run(watch())
