"""Tier saturation through the running router: worked out after each scrape round.

The node is a small ASGI double whose `/metrics` reports as many waiting requests as the test
says; the router, its scraper and its admission are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.scraper import WAITING
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog

REPLY = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "coder",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()


class QueuedNode:
    """Answers every completion at once; `/metrics` reports `waiting` queued requests."""

    def __init__(self) -> None:
        self.waiting = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/metrics":
            text = f"# TYPE {WAITING} gauge\n{WAITING} {self.waiting}\n"
            payload, kind = text.encode(), b"text/plain"
        else:
            payload, kind = REPLY, b"application/json"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        await send({"type": "http.response.body", "body": payload})


async def test_flex_is_shed_once_a_scrape_round_finds_every_endpoint_queued(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    nodes = [QueuedNode(), QueuedNode()]
    with served(nodes[0]) as first, served(nodes[1]) as second:
        config = parse_config(
            f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}, scrapeIntervalS: 0.05}}\n"
            "pools:\n"
            "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm,\n"
            "     servedModelName: coder, batching: {maxNumSeqs: 8},\n"
            f"     endpoints: [{first}, {second}]}}\n"
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
        await app.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:

                async def flex_status() -> int:
                    r = await client.post(
                        "/v1/chat/completions", json={**body, "service_tier": "flex"}
                    )
                    return r.status_code

                assert await flex_status() == 200
                for node in nodes:
                    node.waiting = 20.0
                deadline = time.monotonic() + 10
                while await flex_status() != 429:  # shed once a round has seen both queues
                    assert time.monotonic() < deadline, "flex was never shed"
                    await asyncio.sleep(0.01)
                r = await client.post("/v1/chat/completions", json={**body, "service_tier": "flex"})
                assert r.json()["error"]["code"] == "tier_saturated"
                # Standard requests still queue for the tier rather than being shed.
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
                nodes[1].waiting = 0.0  # one endpoint frees up: no longer saturated
                while await flex_status() != 200:
                    assert time.monotonic() < deadline, "flex stayed shed"
                    await asyncio.sleep(0.01)
        finally:
            await app.stop()
