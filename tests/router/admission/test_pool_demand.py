"""The requests waiting in the router's tier queues, per pool: counted by admission, shared
among the pools that serve them, and exported on /metrics for the operator's autoscaler."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tiergate.router.admission import Admission, Saturation
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.http.pool_demand_metrics import POOL_WAITING, PoolWaitingCollector
from tiergate.router.pool_demand import waiting_per_pool
from tiergate.router.tenants.registry import ANONYMOUS
from tiergate.sim_nodes.catalogs import default_catalog

POOLS = """
pools:
  - name: big
    tier: batched
    model: llama-3.1-8b
    accelerator: h100-sxm
    batching: {maxNumSeqs: 6}
    endpoints: [http://127.0.0.1:9000, http://127.0.0.1:9001]
  - name: small
    tier: batched
    model: llama-3.1-8b
    accelerator: h100-sxm
    batching: {maxNumSeqs: 4}
    endpoints: [http://127.0.0.1:9002]
  - name: fast
    tier: premium
    model: llama-3.1-8b
    accelerator: h100-sxm
    batching: {maxNumSeqs: 2}
    endpoints: [http://127.0.0.1:9003]
  - name: starting
    tier: wafer-scale
    model: llama-3.1-8b
    servedModelName: spark
    accelerator: wse-3
    batching: {maxNumSeqs: 4}
    endpoints: []
  - name: starting-too
    tier: wafer-scale
    model: llama-3.1-8b
    servedModelName: spark
    accelerator: wse-3
    batching: {maxNumSeqs: 4}
    endpoints: []
"""


@pytest.fixture(scope="module")
def view() -> PoolView:
    return build_view(parse_config(POOLS).pools, default_catalog())


def test_a_tiers_waiting_requests_are_shared_by_the_slots_each_pool_offers(
    view: PoolView,
) -> None:
    # big offers 2 x 6 slots, small 1 x 4: 12 of 16 and 4 of 16.
    shares = waiting_per_pool(
        view, {("batched", "llama-3.1-8b"): 8, ("premium", "llama-3.1-8b"): 3}
    )
    assert shares == {"big": 6.0, "small": 2.0, "fast": 3.0, "starting": 0.0, "starting-too": 0.0}


def test_pools_without_endpoints_share_evenly_and_unknown_or_empty_entries_count_nothing(
    view: PoolView,
) -> None:
    shares = waiting_per_pool(
        view,
        {
            ("wafer-scale", "spark"): 3,
            ("batched", "no-such-model"): 5,
            ("premium", "llama-3.1-8b"): 0,
        },
    )
    assert shares["starting"] == shares["starting-too"] == 1.5
    assert shares["big"] == shares["small"] == shares["fast"] == 0.0
    assert sum(shares.values()) == 3.0


async def test_admission_counts_a_request_while_it_waits_and_not_after(view: PoolView) -> None:
    admission = Admission(Saturation())
    admission.resize(view)
    premium = admission.queues["premium"]  # fast: 1 endpoint x 2 slots
    held = [await admission.admit(view, "llama-3.1-8b", "standard", ["premium"], ANONYMOUS, 10)
            for _ in range(2)]  # fmt: skip
    assert admission.waiting() == {}  # admitted at once: never waiting
    waiter = asyncio.create_task(
        admission.admit(view, "llama-3.1-8b", "standard", ["premium"], ANONYMOUS, 10)
    )
    leaver = asyncio.create_task(
        admission.admit(view, "llama-3.1-8b", "standard", ["premium"], ANONYMOUS, 10)
    )
    await asyncio.sleep(0)
    assert premium.waiting == 2
    assert admission.waiting() == {("premium", "llama-3.1-8b"): 2}
    leaver.cancel()  # the client left while waiting
    with pytest.raises(asyncio.CancelledError):
        await leaver
    assert admission.waiting() == {("premium", "llama-3.1-8b"): 1}
    admission.release(held[0])
    grant = await asyncio.wait_for(waiter, timeout=5)
    assert admission.waiting() == {}
    admission.release(grant)
    admission.release(held[1])


def test_the_gauge_lists_every_pool_with_its_tier(view: PoolView) -> None:
    collector = PoolWaitingCollector(lambda: view, lambda: {("batched", "llama-3.1-8b"): 4})
    (family,) = list(collector.collect())
    assert family.name == POOL_WAITING
    found = {(s.labels["pool"], s.labels["tier"]): s.value for s in family.samples}
    assert found == {
        ("big", "batched"): 3.0, ("small", "batched"): 1.0, ("fast", "premium"): 0.0,
        ("starting", "wafer-scale"): 0.0, ("starting-too", "wafer-scale"): 0.0,
    }  # fmt: skip
    # What the operator parses: the text exposition round-trips.
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    (parsed,) = [f for f in text_string_to_metric_families(text) if f.name == POOL_WAITING]
    assert len(parsed.samples) == 5
