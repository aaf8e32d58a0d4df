"""The real engine as a hosted pool: vLLM started with an API key (`--api-key`), as a
provider's API would be, behind a router pool with `endpoint: {url, model, apiKeyFile}`.

The router sends the pool's key and never the tenant's (the engine refuses any other), asks for
the engine's model name while the client sees the pool's, and bills at the pool's stated price
with the engine's own token counts, streams included. A router holding the wrong key gets the
engine's 401: a 503 envelope for the client, a log line naming the pool, nothing billed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_process import EngineProcess
from engine_router import (
    BILLING,
    INPUT_PER_MILLION_USD,
    KEYS,
    MODEL,
    OUTPUT_PER_MILLION_USD,
    PROVIDER_KEY,
    ledger_rows,
    start_engine_router,
)
from process_helpers import Running

#: The pool's model name: what clients ask for and see; the engine serves `MODEL`.
POOL_MODEL = "chat-hosted"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def _hosted_pool(url: str, key_file: Path) -> str:
    return (
        f"  - {{name: hosted, tier: batched, model: llama-3.2-1b, servedModelName: {POOL_MODEL},"
        f" {BILLING}, endpoint: {{url: '{url}/v1', model: {MODEL}, apiKeyFile: '{key_file}',"
        " maxContextTokens: 2048}}\n"
    )


def _router(engine: EngineProcess, folder: Path, key: str) -> Running:
    key_file = folder / "provider-key"
    key_file.write_text(key + "\n")
    return start_engine_router(folder, _hosted_pool(engine.url, key_file))


@pytest.fixture(scope="module")
def router(
    keyed_engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    running = _router(keyed_engine, tmp_path_factory.mktemp("hosted-router"), PROVIDER_KEY)
    try:
        yield running
    finally:
        running.stop()


def _client(router: Running, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key=KEYS[tenant], max_retries=0)


def _stated_cost(prompt_tokens: int, completion_tokens: int) -> float:
    return (
        prompt_tokens * INPUT_PER_MILLION_USD + completion_tokens * OUTPUT_PER_MILLION_USD
    ) / 1e6


def test_the_engine_refuses_a_tenant_s_key(keyed_engine: EngineProcess) -> None:
    """What makes the next tests mean something: only the provider's key is let in."""
    reply = httpx.post(
        keyed_engine.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4},
        headers={"authorization": f"Bearer {KEYS['carol']}"},
        timeout=60,
    )
    assert reply.status_code == 401


def test_a_chat_is_served_with_the_pool_s_key_and_billed_at_the_stated_price(
    router: Running,
) -> None:
    reply = _client(router, "alice").chat.completions.create(
        model=POOL_MODEL,
        messages=MESSAGES,
        max_tokens=12,  # type: ignore[arg-type]
    )
    assert reply.model == POOL_MODEL
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    (row,) = ledger_rows(router.log.parent, 1, "tenant = 'alice'")
    assert (row["pool"], row["outcome"]) == ("hosted", "ok")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        reply.usage.prompt_tokens, reply.usage.completion_tokens,
    )  # fmt: skip
    assert row["cost_usd"] == pytest.approx(
        _stated_cost(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    )


def test_a_stream_is_billed_from_the_engine_s_usage_chunk(router: Running) -> None:
    stream = _client(router, "carol").chat.completions.create(
        model=POOL_MODEL, messages=MESSAGES, max_tokens=12, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {POOL_MODEL}
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    (row,) = ledger_rows(router.log.parent, 1, "tenant = 'carol'")
    assert row["completion_tokens"] == usage.completion_tokens
    assert row["cost_usd"] == pytest.approx(
        _stated_cost(usage.prompt_tokens, usage.completion_tokens)
    )


def test_a_router_with_the_wrong_key_is_refused_clearly_and_bills_nothing(
    keyed_engine: EngineProcess, tmp_path: Path
) -> None:
    running = _router(keyed_engine, tmp_path, "sk-not-the-engine-s-key")
    try:
        reply = httpx.post(
            running.url + "/v1/chat/completions",
            json={"model": POOL_MODEL, "messages": MESSAGES, "max_tokens": 4},
            headers={"authorization": f"Bearer {KEYS['carol']}"},
            timeout=60,
        )
        usage = httpx.get(
            running.url + "/v1/usage",
            headers={"authorization": f"Bearer {KEYS['carol']}"},
            timeout=10,
        ).json()
    finally:
        running.stop()
    assert reply.status_code == 503
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable" and "HTTP 401" in error["message"]
    log = running.log.read_text()
    assert "event=provider_refused_key pool=hosted status=401" in log
    assert "sk-not-the-engine-s-key" not in log and PROVIDER_KEY not in log
    assert usage["totals"]["cost_usd"] == 0 and usage["budget"]["spent_usd"] == 0
