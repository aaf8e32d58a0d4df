"""The router in front of a real engine: vLLM (CPU) serving SmolLM2-135M-Instruct, reached
with the OpenAI SDK as a user would. Tenants, budgets and billing are checked against the
engine's own token counts (its replies' usage and its /metrics counters)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_process import EngineProcess
from engine_router import (
    KEYS,
    MODEL,
    cost_usd,
    engine_counter,
    ledger_rows,
    pool_yaml,
    start_engine_router,
)
from polling_helpers import until
from process_helpers import Running

from tiergate.router.discovery.scraper import parse_vllm_metrics
from tiergate.router.request.cascade import the_request_s_fault

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def router(engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A router whose one pool is the engine."""
    folder = tmp_path_factory.mktemp("engine-router")
    engine_url = engine.ensure_started()
    pools = pool_yaml("engine", engine_url, model="llama-3.2-1b", accelerator="a100-40gb")
    running = start_engine_router(folder, pools)
    try:
        yield running
    finally:
        running.stop()


def client(router: Running, tenant: str) -> openai.OpenAI:
    """The OpenAI SDK pointed at the router as `tenant`, with no retries of its own."""
    return openai.OpenAI(base_url=router.url + "/v1", api_key=KEYS[tenant], max_retries=0)


def folder(router: Running) -> Path:
    """The router's folder (its log, configuration and ledger)."""
    return router.log.parent


def test_chat_through_the_router_with_the_openai_sdk(router: Running) -> None:
    reply = client(router, "alice").chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert 0 < reply.usage.completion_tokens <= 16
    assert reply.usage.prompt_tokens > len(MESSAGES[0]["content"].split())  # chat template


def test_a_stream_with_usage_through_the_router(router: Running) -> None:
    stream = client(router, "alice").chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert 0 < usage.completion_tokens <= 24


def test_billing_uses_the_engine_s_token_counts_at_the_pool_s_price(
    router: Running, engine: EngineProcess
) -> None:
    """Carol's requests are billed at the pool's `billing` price for exactly the tokens the
    engine counted: in its replies, and in its own /metrics counters."""
    prompt_before = engine_counter(engine.url, "vllm:prompt_tokens_total")
    generated_before = engine_counter(engine.url, "vllm:generation_tokens_total")
    carol = client(router, "carol")
    usages = []
    for max_tokens in (5, 12):
        reply = carol.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=max_tokens,
        )
        assert reply.usage is not None
        usages.append(reply.usage)
    stream = carol.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    last = list(stream)[-1]
    assert last.usage is not None
    usages.append(last.usage)
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    # The engine's own counters saw the same tokens (nothing else used it meanwhile).
    assert engine_counter(engine.url, "vllm:prompt_tokens_total") - prompt_before == prompt
    assert engine_counter(engine.url, "vllm:generation_tokens_total") - generated_before == (
        completion
    )
    rows = ledger_rows(folder(router), 3, "tenant = 'carol'")
    assert sorted((r["prompt_tokens"], r["completion_tokens"]) for r in rows) == sorted(
        (u.prompt_tokens, u.completion_tokens) for u in usages
    )
    for row in rows:
        assert row["cost_usd"] == pytest.approx(
            cost_usd(row["prompt_tokens"], row["completion_tokens"])
        )
    usage = httpx.get(
        router.url + "/v1/usage", headers={"authorization": f"Bearer {KEYS['carol']}"}, timeout=10
    ).json()
    assert usage["totals"]["prompt_tokens"] == prompt
    assert usage["totals"]["completion_tokens"] == completion
    assert usage["totals"]["cost_usd"] == pytest.approx(cost_usd(prompt, completion))


def test_a_stream_of_several_choices_left_early_is_billed_every_choice_s_tokens(
    router: Running, engine: EngineProcess
) -> None:
    """`n: 3`: vLLM's chunks each say their own choice's usage. Erin leaves after 30 chunks
    of text; she is billed at least the tokens she got, over all three choices, and no more
    than the engine generated."""
    generated_before = engine_counter(engine.url, "vllm:generation_tokens_total")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to a hundred in words."}],
        "max_tokens": 200,  # far more than the 30 chunks read: the stream cannot end first
        "n": 3,
        "ignore_eos": True,  # vLLM's: every choice runs to its cap unless the client leaves
        "stream": True,
    }
    received, choices = 0, set()
    with httpx.stream(
        "POST",
        router.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEYS['erin']}"},
        timeout=60,
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["delta"].get("content"):
                received += 1
                choices.add(choice["index"])
            if received == 30:
                break  # leaves: the connection closes with the stream
    assert choices == {0, 1, 2}
    # Written while it streamed (outcome `incomplete`), then amended once it ended.
    (row,) = ledger_rows(folder(router), 1, "tenant = 'erin' and outcome != 'incomplete'")
    assert row["outcome"] == "client_disconnect"
    assert 30 <= row["completion_tokens"] < 3 * 200
    until(
        lambda: (
            engine_counter(engine.url, "vllm:generation_tokens_total") - generated_before
            >= row["completion_tokens"]
        ),
        f"the engine generated fewer tokens than the {row['completion_tokens']} billed",
        10.0,
    )
    assert row["cost_usd"] == pytest.approx(
        cost_usd(row["prompt_tokens"], row["completion_tokens"])
    )


def test_a_tenant_past_its_budget_is_refused_after_its_last_request_is_billed(
    router: Running,
) -> None:
    dave = client(router, "dave")
    reply = dave.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
    )
    assert reply.usage is not None
    with pytest.raises(openai.RateLimitError) as refused:
        dave.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
        )
    assert refused.value.code == "budget_exceeded"
    (row,) = ledger_rows(folder(router), 1, "tenant = 'dave' and http_status = 200")
    assert row["cost_usd"] == pytest.approx(
        cost_usd(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    )


def test_a_model_the_engine_does_not_serve_is_an_openai_error_envelope(router: Running) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client(router, "alice").chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
        )
    assert refused.value.code == "model_not_found"
    assert MODEL in refused.value.message  # it names what is served


def test_the_engine_s_own_4xx_passes_through_as_its_envelope_and_ejects_nothing(
    router: Running, engine: EngineProcess
) -> None:
    """A prompt longer than the engine's context: vLLM's 400 reaches the client as vLLM wrote
    it, however often, and the engine keeps serving."""
    alice = client(router, "alice")
    too_long = [{"role": "user", "content": "colour " * 3000}]
    for _ in range(6):  # more than the outlier detector's streak (5)
        with pytest.raises(openai.BadRequestError) as refused:
            alice.chat.completions.create(
                model=MODEL,
                messages=too_long,
                max_tokens=4,
            )
        assert "context length" in refused.value.message or "maximum" in refused.value.message
    metrics = httpx.get(router.metrics_url, timeout=10).text
    assert 'tiergate_pool_endpoints{pool="engine",state="ejected",tier="batched"} 0.0' in metrics
    # A cascade whose first tier is this engine escalates such a refusal (the second tier's
    # context may be longer): the router reads vLLM's own body as a context refusal.
    refusal = httpx.post(
        engine.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": too_long, "max_tokens": 4},
        timeout=60,
    )
    assert refusal.status_code == 400
    assert the_request_s_fault(400, refusal.content) is False
    reply = alice.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
    )
    assert reply.choices[0].message.content is not None


def test_the_router_reads_the_engine_s_load_from_its_metric_names(engine: EngineProcess) -> None:
    """vLLM 0.32 says `kv_cache_usage_perc` (no `gpu_cache_usage_perc`): all three figures
    routing uses are read from a real exposition."""
    text = httpx.get(engine.ensure_started() + "/metrics", timeout=10).text
    assert "vllm:gpu_cache_usage_perc" not in text
    metrics = parse_vllm_metrics(text)
    assert metrics.running == 0 and metrics.waiting == 0
    assert metrics.kv_usage is not None and 0 <= metrics.kv_usage <= 1
