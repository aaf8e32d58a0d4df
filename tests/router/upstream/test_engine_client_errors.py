"""An engine's own 4xx (a request it refuses: too long, a bad parameter) reaches the client as
the engine's OpenAI error envelope, and is the request's fault: it ejects no endpoint however
often it happens. The engines are small ASGI doubles answering as vLLM does; the router is
the real one, on real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog

Served = Callable[[Any], AbstractContextManager[str]]
#: vLLM's reply to a prompt longer than its context (its envelope, as it writes it).
REFUSAL = {
    "error": {
        "message": "This model's maximum context length is 2048 tokens. However, your request "
        "has 6010 input tokens.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
IDLE_METRICS = (
    b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"
)


async def refuses(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An engine that answers every completion with vLLM's 400 envelope."""
    if scope["type"] != "http":
        return
    if scope["method"] != "POST":  # the router's scrapes of /metrics
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": IDLE_METRICS})
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(REFUSAL).encode()})


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_s_4xx_passes_through_and_ejects_nothing(
    served: Served, tmp_path: Path, stream: bool
) -> None:
    with ExitStack() as stack:
        engines = [stack.enter_context(served(refuses)) for _ in range(2)]
        config = parse_config(
            f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\npools:\n"
            "  - {name: e, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, "
            f"servedModelName: m, batching: {{maxNumSeqs: 8}}, endpoints: {json.dumps(engines)}}}\n"
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        router = stack.enter_context(served(app))
        metrics = stack.enter_context(served(app.metrics_app))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        for _ in range(12):  # more than the outlier detector's streak, on either endpoint
            reply = httpx.post(router + "/v1/chat/completions", json=body, timeout=30)
            assert reply.status_code == 400
            assert reply.headers["content-type"].startswith("application/json")
            assert reply.json() == REFUSAL
        text = httpx.get(metrics + "/metrics", timeout=10).text
        assert 'tiergate_pool_endpoints{pool="e",state="ready",tier="batched"} 2.0' in text
        assert 'tiergate_pool_endpoints{pool="e",state="ejected",tier="batched"} 0.0' in text
