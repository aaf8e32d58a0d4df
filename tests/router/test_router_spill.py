"""Spill-over through the running router over a real sim node: a request leaves its saturated
tier (every router slot held by a long stream) or one predicted to miss its SLO for the
cheapest tier its tenant allows and will pay for; the reply, the ledger, `/v1/usage` and
`/metrics` say where it was served. Pools `b` (batched, $1 per million output tokens) and
`p` (premium, $20) share the node, which has room for both pools' batches."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling_helpers import until
from tenant_router_helpers import KEY, tenant_router
from test_router_saturation import QueuedNode

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.http.app import RouterApp
from tiergate.sim_nodes.catalogs import default_catalog

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

Served = Callable[[Any], AbstractContextManager[str]]

PREMIUM_USD_PER_MTOK = 20.0
SPILL = "spillOver: {to: [premium], maxOutputUsdPerMillion: 30}"
BODY = {"model": "coder", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5, "ignore_eos": True}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
#: The batched pool's GPUs (as the router is told) prefill in ~14 ms, premium's chips in ~0.6.
SLOW_BATCHED = "a100-40gb"
#: Router slots a pool's tier has: its one endpoint's batch cap.
SLOTS = 2
TIGHT_SLO = {"x-slo-ttft-ms": "3"}


@contextmanager
def spill_router(
    served: Served, tmp_path: Path, tenant: str, accelerator: str = "wse-3"
) -> Iterator[tuple[RouterApp, str, str]]:
    """Alice's entry has `tenant` (her spillOver, allowedTiers...); each pool has 2 slots.
    Yields the app, its URL and its metrics port's URL."""
    with (
        tenant_router(
            served,
            tmp_path / "ledger.sqlite",
            tmp_path,
            budget=tenant,
            pool="billing: {outputPerMillionUsd: 1}",
            premium=f"billing: {{outputPerMillionUsd: {PREMIUM_USD_PER_MTOK}}}",
            max_num_seqs=SLOTS,
            node_max_num_seqs=16,
            accelerator=accelerator,
        ) as (app, url),
        served(app.metrics_app) as metrics,
    ):
        yield app, url, metrics


@contextmanager
def batched_held(app: RouterApp, url: str) -> Iterator[list[Callable[[], None]]]:
    """Every batched slot held by a stream that runs far longer than the test; yields one
    closer per stream (a closed stream's slot is freed once the router sees its client go)."""
    long = {**BODY, "max_tokens": 60_000, "stream": True}
    kept: list[Iterator[str]] = []
    with ExitStack() as streams:
        closers = []
        for _ in range(SLOTS):
            held = streams.enter_context(ExitStack())
            reply = held.enter_context(
                httpx.stream("POST", url + "/v1/chat/completions", json=long, headers=KEY,
                             timeout=60)
            )  # fmt: skip
            assert reply.status_code == 200 and reply.headers["x-tiergate-tier"] == "batched"
            lines = reply.iter_lines()
            next(lines)
            kept.append(lines)  # a dropped iterator closes the stream
            closers.append(held.close)
        queue = app.router.admission.queues["batched"]
        assert queue.capacity == queue.active == SLOTS and queue.waiting == 0
        yield closers


def ask(url: str, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions", json=body or BODY, headers={**KEY, **headers}, timeout=60
    )


def ledger_row(tmp_path: Path, request_id: str) -> dict[str, Any]:
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        db.row_factory = sqlite3.Row
        found = db.execute("select * from usage where request_id = ?", (request_id,)).fetchall()
    assert len(found) == 1, found
    return dict(found[0])


def spills_metric(metrics_port: str) -> dict[str, float]:
    """`tiergate_spills_total` series that counted a spill: `from->to reason` -> count (every
    series exists from the start, at zero)."""
    series = {}
    for line in httpx.get(metrics_port + "/metrics").text.splitlines():
        if line.startswith("tiergate_spills_total{"):
            labels, value = line[len("tiergate_spills_total{") :].split("} ")
            parts = dict(part.split("=") for part in labels.split(","))
            key = f"{parts['from_tier']}->{parts['to_tier']} {parts['reason']}".replace('"', "")
            if float(value):
                series[key] = float(value)
    return series


def assert_spilled(reply: httpx.Response, reason: str) -> None:
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tiergate-tier"] == "premium"
    assert reply.headers["x-tiergate-tier-requested"] == "batched"
    assert reply.headers["x-tiergate-spilled-from"] == "batched"
    assert reply.headers["x-tiergate-spill-reason"] == reason
    assert reply.headers["x-tiergate-pool"] == "p"
    assert "x-tiergate-fallback" not in reply.headers
    assert reply.json()["service_tier"] == "priority"


def assert_stayed(reply: httpx.Response) -> None:
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tiergate-tier"] == "batched"
    assert "x-tiergate-spilled-from" not in reply.headers
    assert "x-tiergate-spill-reason" not in reply.headers
    assert reply.json()["service_tier"] == "default"


# -- saturated: every batched slot taken ------------------------------------------------------


def test_a_saturated_tier_s_request_is_served_and_billed_by_premium(
    served: Served, tmp_path: Path
) -> None:
    with spill_router(served, tmp_path, SPILL) as (app, url, metrics):
        with batched_held(app, url):
            reply = ask(url)
        assert_spilled(reply, "saturated")
        row = ledger_row(tmp_path, reply.headers["x-tiergate-request-id"])
        usage = httpx.get(url + "/v1/usage", headers=KEY).json()["by_tier_served"]["premium"]
        assert spills_metric(metrics) == {"batched->premium saturated": 1.0}
        exposition = httpx.get(metrics + "/metrics").text
    completion_tokens = reply.json()["usage"]["completion_tokens"]
    assert completion_tokens == 5
    cost_usd = completion_tokens * PREMIUM_USD_PER_MTOK / 1e6  # prompts are free here
    assert (row["tier_requested"], row["tier_served"], row["pool"]) == ("batched", "premium", "p")
    assert (row["outcome"], row["http_status"]) == ("ok", 200)
    assert row["cost_usd"] == pytest.approx(cost_usd)
    assert usage["requests"] == 1 and usage["cost_usd"] == pytest.approx(cost_usd)
    served_tokens = reply.json()["usage"]["total_tokens"]
    attained = 'tiergate_tenant_attained_tokens_total{tenant="alice",tier="premium"}'
    assert f"{attained} {float(served_tokens)}" in exposition


def test_a_streamed_spilled_reply_says_premium_in_its_chunks(
    served: Served, tmp_path: Path
) -> None:
    with spill_router(served, tmp_path, SPILL) as (app, url, metrics), batched_held(app, url):
        body = {**BODY, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=KEY,
                          timeout=60) as reply:  # fmt: skip
            assert reply.headers["x-tiergate-tier"] == "premium"
            assert reply.headers["x-tiergate-spilled-from"] == "batched"
            chunks = [line for line in reply.iter_lines() if line.startswith("data: {")]
    assert chunks and all('"service_tier":"priority"' in c.replace(" ", "") for c in chunks)


@pytest.mark.parametrize(
    ("tenant", "body"),
    [
        ("", BODY),  # no policy
        ("spillOver: {to: [premium], maxOutputUsdPerMillion: 19.99}", BODY),  # premium: $20
        ("spillOver: {to: [premium], notForTools: [premium]}", {**BODY, "tools": TOOLS}),
    ],
    ids=["no-policy", "cap-below-premium", "tools-not-for-premium"],
)
def test_a_request_that_may_not_move_waits_for_its_own_tier(
    served: Served, tmp_path: Path, tenant: str, body: dict[str, Any]
) -> None:
    """As without a policy: a standard request queues for its saturated tier (it is not shed),
    and is served there once a slot frees."""
    with (
        spill_router(served, tmp_path, tenant) as (app, url, metrics),
        ThreadPoolExecutor(1) as pool,
        batched_held(app, url) as closers,
    ):
        queue = app.router.admission.queues["batched"]
        pending = pool.submit(ask, url, body)
        until(lambda: queue.waiting == 1, "the request never queued for batched")
        assert app.router.admission.queues["premium"].active == 0  # nothing went there
        closers[0]()  # one stream ends: its slot goes to the waiting request
        reply = pending.result()
        assert_stayed(reply)
        assert spills_metric(metrics) == {}


def test_full_router_slots_make_a_flex_request_wait_not_shed(
    served: Served, tmp_path: Path
) -> None:
    """Flex is shed only by the node-saturation flag (admission.py), not by full router slots."""
    with (
        spill_router(served, tmp_path, "") as (app, url, metrics),
        ThreadPoolExecutor(1) as pool,
        batched_held(app, url) as closers,
    ):
        pending = pool.submit(ask, url, {**BODY, "service_tier": "flex"})
        queue = app.router.admission.queues["batched"]
        until(lambda: queue.waiting == 1, "the flex request never queued for batched")
        closers[0]()
        assert pending.result().status_code == 200


def test_a_tenant_s_max_queued_refuses_its_extra_waiter_429(served: Served, tmp_path: Path) -> None:
    with (
        spill_router(served, tmp_path, "maxQueued: 1") as (app, url, metrics),
        ThreadPoolExecutor(1) as pool,
        batched_held(app, url) as closers,
    ):
        pending = pool.submit(ask, url)
        queue = app.router.admission.queues["batched"]
        until(lambda: queue.waiting == 1, "the first request never queued for batched")
        refused = ask(url)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "tenant_queue_full"
        assert refused.headers["retry-after"] == "1"
        closers[0]()
        assert_stayed(pending.result())


def test_the_router_s_queues_take_its_admission_order(served: Served, tmp_path: Path) -> None:
    with tenant_router(
        served, tmp_path / "ledger.sqlite", tmp_path, budget="", router="admissionOrder: fcfs"
    ) as (app, url):
        assert ask(url).status_code == 200
        assert app.router.admission.queues["batched"].order == "fcfs"


async def test_a_tier_whose_nodes_all_queue_moves_its_request(
    served: Served, tmp_path: Path
) -> None:
    """The other saturation: the router has free slots, but the scrape finds every batched
    endpoint with queued requests (load from other clients of the nodes)."""
    batched, premium = QueuedNode(), QueuedNode()
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f"tenants:\n  - {{name: alice, apiKeys: [alice-key-0123456789], {SPILL}}}\n")
    with served(batched) as batched_url, served(premium) as premium_url:
        config = parse_config(
            f"router: {{tenantsFile: {tenants}, ledgerPath: {tmp_path / 'ledger.sqlite'},"
            " scrapeIntervalS: 0.05}\npools:\n"
            + "".join(
                f"  - {{name: {name}, tier: {tier}, model: llama-3.1-8b, accelerator: h100-sxm,"
                f" servedModelName: coder, batching: {{maxNumSeqs: 8}}, endpoints: [{url}],"
                f" billing: {{outputPerMillionUsd: {price}}}}}\n"
                for name, tier, url, price in (
                    ("b", "batched", batched_url, 1),
                    ("p", "premium", premium_url, PREMIUM_USD_PER_MTOK),
                )
            )
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        await app.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:

                async def tier_served() -> str:
                    reply = await client.post("/v1/chat/completions", json=BODY, headers=KEY)
                    assert reply.status_code == 200, reply.text
                    return reply.headers["x-tiergate-tier"]

                assert await tier_served() == "batched"
                batched.waiting = 20.0
                deadline = time.monotonic() + 10
                while await tier_served() != "premium":  # once a scrape round saw the queue
                    assert time.monotonic() < deadline, "never spilled"
                    await asyncio.sleep(0.01)
                reply = await client.post("/v1/chat/completions", json=BODY, headers=KEY)
                assert_spilled(reply, "saturated")
        finally:
            await app.stop()


# -- a tier predicted to miss the request's SLO ---------------------------------------------


def test_an_slo_its_tier_is_predicted_to_miss_moves_the_request(
    served: Served, tmp_path: Path
) -> None:
    with spill_router(served, tmp_path, SPILL, accelerator=SLOW_BATCHED) as (_, url, metrics):
        assert_spilled(ask(url, **TIGHT_SLO), "slo")
        assert_stayed(ask(url, **{"x-slo-ttft-ms": "1000"}))  # met where it is
        assert_stayed(ask(url))  # no SLO: nothing to miss
        assert spills_metric(metrics) == {"batched->premium slo": 1.0}


@pytest.mark.parametrize(
    ("tenant", "body", "headers"),
    [
        ("", BODY, {}),
        ("", BODY, {"x-tiergate-spill-to": "premium"}),
        ("", BODY, {"x-tiergate-spill-to": "premium", "x-tiergate-spill-max-usd-per-mtok": "1e9"}),
        (SPILL, BODY, {"x-tiergate-spill-to": "none"}),
        (SPILL, BODY, {"x-tiergate-spill-max-usd-per-mtok": "19.99"}),
        ("spillOver: {to: [premium], notForTools: [premium]}", {**BODY, "tools": TOOLS}, {}),
        ("spillOver: {to: [premium], notForTools: [premium]}", {**BODY, "tools": TOOLS},
         {"x-tiergate-spill-to": "premium"}),
    ],
    ids=["no-policy", "no-policy-header-to", "no-policy-both-headers", "header-none",
         "header-cap-below", "tools", "tools-header-to"],
)  # fmt: skip
def test_a_request_that_may_not_move_stays_whatever_its_slo(
    served: Served, tmp_path: Path, tenant: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    with spill_router(served, tmp_path, tenant, accelerator=SLOW_BATCHED) as (app, url, metrics):
        reply = ask(url, body, **TIGHT_SLO, **headers)
        assert reply.status_code == 503, reply.text  # as today: no batched endpoint meets it
        assert reply.json()["error"]["code"] == "slo_unattainable"
        assert "x-tiergate-spilled-from" not in reply.headers
        assert app.router.admission.queues["premium"].active == 0
        assert spills_metric(metrics) == {}


def test_the_price_header_replaces_the_tenant_s_cap(served: Served, tmp_path: Path) -> None:
    cheap = "spillOver: {to: [premium], maxOutputUsdPerMillion: 5}"
    with spill_router(served, tmp_path, cheap, accelerator=SLOW_BATCHED) as (_, url, metrics):
        assert ask(url, **TIGHT_SLO).status_code == 503  # the tenant's cap: premium too dear
        price = {"x-tiergate-spill-max-usd-per-mtok": str(PREMIUM_USD_PER_MTOK)}  # exactly
        assert_spilled(ask(url, **TIGHT_SLO, **price), "slo")


def test_the_to_header_moves_a_request_to_a_tier_outside_the_tenant_s_list(
    served: Served, tmp_path: Path
) -> None:
    """The header replaces the tenant's list, within its allowedTiers."""
    tenant = "spillOver: {to: [wafer-scale]}"
    with spill_router(served, tmp_path, tenant, accelerator=SLOW_BATCHED) as (_, url, metrics):
        assert_spilled(ask(url, **TIGHT_SLO, **{"x-tiergate-spill-to": "premium"}), "slo")
        assert spills_metric(metrics) == {"batched->premium slo": 1.0}


# -- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"x-tiergate-spill-to": "fast"}, 400, "invalid_spill_policy"),
        ({"x-tiergate-spill-to": ""}, 400, "invalid_spill_policy"),
        ({"x-tiergate-spill-to": "wafer-scale"}, 403, "tier_not_allowed"),
        ({"x-tiergate-spill-max-usd-per-mtok": "cheap"}, 400, "invalid_spill_policy"),
        ({"x-tiergate-spill-max-usd-per-mtok": "-1"}, 400, "invalid_spill_policy"),
        ({"x-tiergate-spill-max-usd-per-mtok": "nan"}, 400, "invalid_spill_policy"),
        ({"x-tiergate-spill-max-usd-per-mtok": "inf"}, 400, "invalid_spill_policy"),
    ],
)
def test_a_bad_spill_header_is_an_openai_error_and_bills_nothing(
    served: Served, tmp_path: Path, headers: dict[str, str], status: int, code: str
) -> None:
    tenant = f"allowedTiers: [batched, premium], {SPILL}"
    with spill_router(served, tmp_path, tenant) as (_, url, metrics):
        reply = ask(url, **headers)
        usage = httpx.get(url + "/v1/usage", headers=KEY).json()
        row = ledger_row(tmp_path, reply.headers["x-tiergate-request-id"])
    assert reply.status_code == status
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["code"] == code
    assert error["type"] == ("permission_error" if status == 403 else "invalid_request_error")
    assert "Traceback" not in reply.text and "RouterError" not in reply.text
    assert (row["outcome"], row["http_status"], row["tier_served"]) == ("rejected", status, None)
    assert row["cost_usd"] == 0 and usage["totals"]["cost_usd"] == 0
    assert usage["budget"]["spent_usd"] == 0


def test_a_flex_request_never_spills(served: Served, tmp_path: Path) -> None:
    """Flex asked to be served late and cheap: it waits for its own tier, never a dearer one."""
    with (
        spill_router(served, tmp_path, SPILL) as (app, url, metrics),
        ThreadPoolExecutor(1) as pool,
        batched_held(app, url) as closers,
    ):
        pending = pool.submit(ask, url, {**BODY, "service_tier": "flex"})
        until(lambda: app.router.admission.queues["batched"].waiting == 1, "flex never queued")
        assert app.router.admission.queues["premium"].active == 0
        closers[0]()
        reply = pending.result()
        assert reply.headers["x-tiergate-tier"] == "batched"
        assert reply.json()["service_tier"] == "flex" and spills_metric(metrics) == {}


def test_a_request_that_stays_holds_only_its_own_tier_s_price(
    served: Served, tmp_path: Path
) -> None:
    """The budget holds the dearest tier a request will be tried in: premium only when it is
    moving there. $0.01 covers 1000 tokens at batched's $1 per million, not at premium's $20."""
    tenant = f"budgetUsd: 0.01, budgetPeriod: day, {SPILL}"
    with spill_router(served, tmp_path, tenant) as (app, url, metrics):
        reply = ask(url, {**BODY, "max_tokens": 1000})
    assert_stayed(reply)
