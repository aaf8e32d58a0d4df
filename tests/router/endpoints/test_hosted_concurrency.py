"""A hosted pool's `maxConcurrentRequests` holds in a tier it shares with pods: a real router
process, a real sim node and a fake provider on loopback ports. While the provider has as many
requests open as its pool allows, the tier's pods serve the rest; before, a policy that
favoured the provider sent it the whole tier's load, and a provider past its limit answers
429, which ejects it. A request only the provider could serve, admitted by a queue it shares
with the pods, is shed with 429 `provider_at_limit`: one for a model name only the provider
answers to, and one longer than the pods' context (`context-filter`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from fake_provider import Provider, running_provider
from polling_helpers import until
from process_helpers import Running, start_ready_router, start_sim_node

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANT_KEY = "tenant-key-0123456789abcdef"
PROVIDER_KEY = "sk-provider-secret-0123456789"
TENANT = {"authorization": f"Bearer {TENANT_KEY}"}
#: At once: the provider's limit, and the requests sent together.
LIMIT, TOGETHER = 1, 3
#: A name only the hosted pool answers to: its requests share the tier's queue with the pods'.
ONLY_HOSTED = "chat-hosted"

# Prefix affinity alone decides: a prompt favours the endpoint that served it before.
CONFIG = """\
router:
  ledgerPath: {ledger}
  tenantsFile: {tenants}
  scrapeIntervalS: 0.1
  policy:
    filters: [{{type: model-filter}}, {{type: tier-filter}}, {{type: context-filter}}]
    scorers: [{{type: prefix-affinity-scorer}}]
pools:
  - {{name: hosted, tier: batched, model: llama-3.1-8b, servedModelName: chat,
      aliases: [{only_hosted}],
      billing: {{inputPerMillionUsd: 1, outputPerMillionUsd: 2}},
      endpoint: {{url: {url}, model: {model}, apiKeyFile: {key_file},
                  maxConcurrentRequests: {limit}}}}}
  - {{name: pods, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm, servedModelName: chat,
      batching: {{maxNumSeqs: 8}}, maxContextTokens: {short}, endpoints: [{node}]}}
"""
#: The pods' context; the provider serves the model's whole context.
SHORT = 4096


@dataclass
class Mixed:
    url: str
    router: Running
    provider: Provider

    def chat(self, prompt: str, model: str = "chat") -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 5}  # fmt: skip
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=TENANT,
                          timeout=30)  # fmt: skip


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mixed]:
    tmp = tmp_path_factory.mktemp("mixed")
    node = start_sim_node(
        tmp / "node.log", "--model", "llama-3.1-8b", "--accelerator", "h100-sxm",
        "--served-model-name", "chat", "--max-num-seqs", "8", "--max-model-len", str(SHORT),
    )  # fmt: skip
    try:
        with running_provider(PROVIDER_KEY, "prov-model") as provider:
            (tmp / "tenants.yaml").write_text(
                f"tenants:\n  - {{name: acme, apiKeys: [{TENANT_KEY}]}}\n"
            )
            key_file = tmp / "provider.key"
            key_file.write_text(PROVIDER_KEY + "\n")
            config = tmp / "router.yaml"
            config.write_text(
                CONFIG.format(
                    ledger=tmp / "ledger.sqlite",
                    tenants=tmp / "tenants.yaml",
                    url=json.dumps(provider.url),
                    model=provider.model,
                    key_file=json.dumps(str(key_file)),
                    limit=LIMIT,
                    only_hosted=ONLY_HOSTED,
                    node=node.url,
                    short=SHORT,
                )  # fmt: skip
            )
            router = start_ready_router(config, tmp / "router.log")
            try:
                yield Mixed(router.url, router, provider)
            finally:
                router.stop()
    finally:
        node.stop()


def prompt_the_provider_served(mixed: Mixed) -> str:
    """A prompt (two 256-character blocks and more) the provider served, so prefix affinity
    sends every request with it to the provider first."""
    found: list[str] = []

    def served_by_the_provider() -> bool:
        prompt = f"prompt {len(found)} " + "x" * 600
        reply = mixed.chat(prompt)
        assert reply.status_code == 200, reply.text
        if reply.headers["x-tiergate-pool"] == "hosted":
            found.append(prompt)
            return True
        found.append("")
        return False

    until(served_by_the_provider, "the provider never served a prompt", 60)
    return found[-1]


def test_a_provider_at_its_limit_leaves_the_tier_s_other_requests_to_the_pods(
    mixed: Mixed,
) -> None:
    prompt = prompt_the_provider_served(mixed)
    provider = mixed.provider
    with provider.lock:
        provider.most_open = 0
        before = len(provider.received)
    provider.release.clear()
    provider.fail, provider.hang_s = "held", 60.0  # replies only once released
    try:
        with ThreadPoolExecutor(TOGETHER) as pool:
            sent = [pool.submit(mixed.chat, prompt) for _ in range(TOGETHER)]
            # The provider holds what it was sent: the rest are back, or it holds them all.
            until(
                lambda: (
                    sum(f.done() for f in sent) >= TOGETHER - LIMIT or provider.open_now > LIMIT
                ),
                "the requests were neither served nor sent to the provider",
                60,
            )
            most_open = provider.most_open
            provider.release.set()
            replies = [f.result() for f in sent]
    finally:
        provider.fail, provider.hang_s = None, 5.0
        provider.release.set()
    assert [r.status_code for r in replies] == [200] * TOGETHER, [r.text for r in replies]
    pools = sorted(r.headers["x-tiergate-pool"] for r in replies)
    assert most_open == LIMIT, pools
    assert pools == ["hosted"] * LIMIT + ["pods"] * (TOGETHER - LIMIT)
    with provider.lock:
        assert len(provider.received) - before == LIMIT


def while_the_provider_is_at_its_limit(
    mixed: Mixed, ask: Callable[[], httpx.Response]
) -> httpx.Response:
    """`ask()`'s reply, asked while the provider holds a request of the name only it answers
    to open (its pool's limit is 1); that request is then released and served."""
    provider = mixed.provider
    provider.release.clear()
    provider.fail, provider.hang_s = "held", 60.0
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(mixed.chat, "first", ONLY_HOSTED)
            until(lambda: provider.open_now == LIMIT, "the provider was not sent the first", 60)
            reply = ask()
            provider.release.set()
            assert first.result().status_code == 200, first.result().text
    finally:
        provider.fail, provider.hang_s = None, 5.0
        provider.release.set()
    return reply


def test_a_request_only_a_provider_at_its_limit_could_serve_is_shed_with_429(
    mixed: Mixed,
) -> None:
    second = while_the_provider_is_at_its_limit(mixed, lambda: mixed.chat("second", ONLY_HOSTED))
    assert second.status_code == 429, second.text
    error = second.json()["error"]
    assert (error["code"], error["type"]) == ("provider_at_limit", "rate_limit_error")
    assert second.headers["retry-after"] == "1"


def test_a_request_longer_than_the_pods_context_waits_for_the_provider_at_its_limit(
    mixed: Mixed,
) -> None:
    long_prompt = "word " * 6000  # more than the pods' 4,096 tokens however they are counted
    # The provider free, it serves the long request: the pods' engine would refuse it.
    reply = mixed.chat(long_prompt)
    assert (reply.status_code, reply.headers.get("x-tiergate-pool")) == (200, "hosted"), reply.text
    # At its limit: shed to be retried, not sent to the pods for a permanent 400.
    second = while_the_provider_is_at_its_limit(mixed, lambda: mixed.chat(long_prompt))
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "provider_at_limit"
    assert second.headers["retry-after"] == "1"
