"""A tier's admission queue when its endpoints change under waiting requests."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import serve_app
from polling_helpers import until

from tiergate.router.admission import Admission, Saturation, TierQueue
from tiergate.router.build import build_app, file_source
from tiergate.router.config import load_config, parse_config
from tiergate.router.discovery.view import build_view
from tiergate.router.tenants.registry import Tenant
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app


async def test_a_larger_capacity_admits_waiters_at_once() -> None:
    queue = TierQueue("batched", capacity=1, max_waiting=16)
    await queue.acquire("standard")  # the one slot, held by a long stream
    waiter = asyncio.create_task(queue.acquire("standard"))
    await asyncio.sleep(0)
    assert queue.waiting == 1 and not waiter.done()
    queue.resize(4, max_waiting=16)  # the tier scaled up
    await asyncio.wait_for(waiter, timeout=5)
    assert queue.active == 2 and queue.waiting == 0
    await asyncio.wait_for(queue.acquire("standard"), timeout=5)  # arrivals go straight in
    assert queue.active == 3


async def test_a_smaller_capacity_sheds_nothing_and_takes_effect_as_requests_end() -> None:
    queue = TierQueue("batched", capacity=2, max_waiting=16)
    first = await queue.acquire("standard")
    second = await queue.acquire("standard")
    queue.resize(1, max_waiting=16)
    assert queue.active == 2
    waiter = asyncio.create_task(queue.acquire("standard"))
    await asyncio.sleep(0)
    queue.release(first)  # 1 active: at capacity, the waiter still waits
    await asyncio.sleep(0)
    assert not waiter.done() and queue.waiting == 1
    queue.release(second)
    await asyncio.wait_for(waiter, timeout=5)
    assert queue.active == 1


# Through the router: a request waits for a slot while its pool's endpoints change.


def test_a_new_endpoint_serves_a_waiting_request_without_another_arriving(tmp_path: Path) -> None:
    """One node with one slot, busy with a long stream, and one request waiting for it. The
    router's file gains a second node: its slot goes to the waiting request at once (not when
    another request arrives), and the request is sent to the new node, the one that is free,
    not to the endpoints it saw when it began to wait."""
    with ExitStack() as stack:
        busy, new = (stack.enter_context(serve_app(one_slot_node())) for _ in range(2))
        config = tmp_path / "router.yaml"
        config.write_text(pools_file(tmp_path, [busy]))
        _, source = file_source(config)
        app = build_app(load_config(config), source)
        url = stack.enter_context(serve_app(app))
        with httpx.Client(base_url=url, timeout=60) as http:
            stream = stack.enter_context(
                http.stream("POST", "/v1/chat/completions", json=chat(5000, stream=True))
            )
            lines = stream.iter_lines()  # kept: a generator let go of closes the stream
            next(lines)  # the busy node's one slot is taken
            queue = app.router.admission.queues["batched"]
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(http.post, "/v1/chat/completions", json=chat(2))
                until(lambda: queue.waiting == 1, "the request did not wait for the slot", 30)
                config.write_text(pools_file(tmp_path, [busy, new]))
                reply = waiting.result(timeout=60)
            assert reply.status_code == 200
            assert served(new) == 1 and served(busy) == 0  # the stream is still going there


def one_slot_node() -> Any:
    serving = ServingSpec(model="llama-3.1-8b", accelerator="h100-sxm",
                          batching=BatchingSpec(max_num_seqs=1))  # fmt: skip
    return create_app(NodeConfig(serving=serving, served_model_names=["m"]))


def pools_file(folder: Path, urls: list[str]) -> str:
    return yaml.safe_dump({
        "router": {"ledgerPath": str(folder / "ledger.sqlite"), "reloadIntervalS": 0.05},
        "pools": [{"name": "one", "tier": "batched", "model": "llama-3.1-8b",
                   "accelerator": "h100-sxm", "servedModelName": "m",
                   "batching": {"maxNumSeqs": 1}, "endpoints": urls}],
    })  # fmt: skip


def chat(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens, **fields}  # fmt: skip


def served(node: str) -> float:
    """Requests `node` finished (its vLLM counter)."""
    text = httpx.get(node + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))  # fmt: skip


# A tier whose models are served by different pools.


def two_models(*, second_pool_model: str = "llama-3.1-70b") -> Admission:
    """The batched tier: pool `small` (llama-3.1-8b, one endpoint of 2 slots) and pool `big`
    (`second_pool_model`, one endpoint of 2 slots), each under its own name."""
    text = yaml.safe_dump({"pools": [
        {"name": "small", "tier": "batched", "model": "llama-3.1-8b", "servedModelName": "s",
         "accelerator": "h100-sxm", "batching": {"maxNumSeqs": 2},
         "endpoints": ["http://127.0.0.1:9000"]},
        {"name": "big", "tier": "batched", "model": second_pool_model,
         "servedModelName": "s" if second_pool_model == "llama-3.1-8b" else "b",
         "accelerator": "h100-sxm", "chips": 4, "batching": {"maxNumSeqs": 2},
         "endpoints": ["http://127.0.0.1:9001"]},
    ]})  # fmt: skip
    admission = Admission(Saturation())
    admission.resize(build_view(parse_config(text).pools, default_catalog()))
    return admission


async def test_one_models_flood_does_not_hold_up_another_models_requests() -> None:
    """Two models in one tier, on pools of their own: the small model's flood fills its pool's
    two slots and waits; the big model's request is admitted at once, to its idle pool."""
    admission = two_models()
    flood = admission.queue_for("s", "batched")
    assert flood is not admission.queue_for("b", "batched")
    assert flood.capacity == 2 and admission.queue_for("b", "batched").capacity == 2
    held = [await flood.acquire("standard", "t") for _ in range(2)]
    waiter = asyncio.create_task(flood.acquire("standard", "t"))
    await asyncio.sleep(0)
    assert flood.waiting == 1 and not admission.has_room("batched", "s")
    assert admission.has_room("batched", "b")
    view = build_view(parse_config("pools: []").pools, default_catalog())
    grant = await asyncio.wait_for(
        admission.admit(view, "b", "standard", ["batched"], Tenant("t"), 10), timeout=5
    )
    assert grant.queue == "batched:big" and grant.waited_s == 0.0
    admission.release(grant)
    admission.release(held[0])
    assert (await asyncio.wait_for(waiter, timeout=5)).queue == "batched:small"


async def test_models_on_the_same_pools_share_the_tier_s_queue() -> None:
    admission = two_models(second_pool_model="llama-3.1-8b")
    assert list(admission.queues) == ["batched", "premium", "wafer-scale"]
    assert admission.queue_for("s", "batched").capacity == 4


async def test_a_queue_the_view_no_longer_asks_for_serves_its_waiters_then_goes() -> None:
    """The big pool is deleted while the small model's requests hold and wait in their queue:
    the tier's queue is one again, and the old one's waiter is served as its holder ends."""
    admission = two_models()
    old = admission.queue_for("s", "batched")
    held = [await old.acquire("standard", "t") for _ in range(2)]
    waiter = asyncio.create_task(old.acquire("standard", "t"))
    await asyncio.sleep(0)
    one = yaml.safe_dump({"pools": [
        {"name": "small", "tier": "batched", "model": "llama-3.1-8b", "servedModelName": "s",
         "accelerator": "h100-sxm", "batching": {"maxNumSeqs": 2},
         "endpoints": ["http://127.0.0.1:9000"]},
    ]})  # fmt: skip
    view = build_view(parse_config(one).pools, default_catalog())
    admission.resize(view)
    assert admission.queue_for("s", "batched") is admission.queues["batched"]
    assert "batched:small" in admission.queues  # still holding and waiting
    admission.release(held[0])
    grant = await asyncio.wait_for(waiter, timeout=5)
    for g in (held[1], grant):
        admission.release(g)
    admission.resize(view)
    assert "batched:small" not in admission.queues


def view_of(pools: list[dict[str, Any]]) -> Any:
    return build_view(parse_config(yaml.safe_dump({"pools": pools})).pools, default_catalog())


def batched(name: str, model: str, served: str, urls: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "tier": "batched", "model": model, "servedModelName": served,
            "accelerator": "h100-sxm", "batching": {"maxNumSeqs": 2}, "endpoints": urls,
            **extra}  # fmt: skip


def test_sets_of_pools_that_share_a_pool_keep_the_tier_s_one_queue() -> None:
    """`s` is served by pools small and big, `x` (small's alias) by small alone: a queue each
    would count small's slots twice, and admit 6 requests to 4 slots."""
    admission = Admission(Saturation())
    admission.resize(view_of([
        batched("small", "llama-3.1-8b", "s", ["http://127.0.0.1:9000"], aliases=["x"]),
        batched("big", "llama-3.1-8b", "s", ["http://127.0.0.1:9001"]),
    ]))  # fmt: skip
    assert list(admission.queues) == ["batched", "premium", "wafer-scale"]
    assert admission.queue_for("x", "batched").capacity == 4


async def test_a_model_with_no_endpoint_waits_in_the_tier_s_queue() -> None:
    """Pool big is scaled to zero: its model has no endpoint, so no set of pools, and waits in
    the tier's queue; once big has its endpoint, that queue is big's and small's caps, and the
    waiter is admitted at once."""
    small = batched("small", "llama-3.1-8b", "s", ["http://127.0.0.1:9000"])
    admission = Admission(Saturation())
    admission.resize(view_of([small, batched("big", "llama-3.1-70b", "b", [], chips=4)]))
    tier = admission.queue_for("b", "batched")
    assert tier is admission.queues["batched"] and "batched:" not in admission.queues
    held = [await tier.acquire("standard", "t") for _ in range(tier.capacity)]
    waiter = asyncio.create_task(tier.acquire("standard", "t"))
    await asyncio.sleep(0)
    assert tier.waiting == 1
    admission.resize(view_of([
        small, batched("big", "llama-3.1-70b", "b", ["http://127.0.0.1:9001"], chips=4),
    ]))  # fmt: skip
    assert admission.queue_for("b", "batched").name == "batched:big"
    await asyncio.wait_for(waiter, timeout=5)
    for grant in held:
        admission.release(grant)
