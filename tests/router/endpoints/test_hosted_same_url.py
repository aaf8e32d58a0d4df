"""Two hosted pools at one provider's base URL (two of its models in one tier, as an OpenAI
account serves many) are two endpoints to the router: a stream that fails on one before its
first token goes on to the other, where the URL alone would have ruled out both."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fake_provider import Provider, running_provider
from polling_helpers import until
from process_helpers import Running, start_ready_router

#: Real processes and servers: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANT_KEY = "tenant-key-0123456789abcdef"
PROVIDER_KEY = "sk-provider-secret-0123456789"
MODELS = {"one": "prov-model-one", "two": "prov-model-two"}

CONFIG = """\
router:
  ledgerPath: {ledger}
  tenantsFile: {tenants}
pools:
{pools}"""
POOL = """\
  - {{name: {name}, tier: batched, model: llama-3.1-8b, servedModelName: chat,
      billing: {{inputPerMillionUsd: 1, outputPerMillionUsd: 2}},
      endpoint: {{url: {url}, model: {model}, apiKeyFile: {key_file}}}}}
"""


@dataclass
class SameUrl:
    url: str
    router: Running
    provider: Provider


@pytest.fixture(scope="module")
def same_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SameUrl]:
    tmp = tmp_path_factory.mktemp("same-url")
    with running_provider(PROVIDER_KEY, MODELS["one"]) as provider:
        provider.also_models = (MODELS["two"],)
        (tmp / "tenants.yaml").write_text(
            f"tenants:\n  - {{name: acme, apiKeys: [{TENANT_KEY}]}}\n"
        )
        key_file = tmp / "provider.key"
        key_file.write_text(PROVIDER_KEY + "\n")
        pools = "".join(
            POOL.format(
                name=name,
                url=json.dumps(provider.url),
                model=model,
                key_file=json.dumps(str(key_file)),
            )
            for name, model in MODELS.items()
        )
        config = tmp / "router.yaml"
        config.write_text(
            CONFIG.format(ledger=tmp / "ledger.sqlite", tenants=tmp / "tenants.yaml", pools=pools)
        )
        router = start_ready_router(config, tmp / "router.log")
        try:
            yield SameUrl(router.url, router, provider)
        finally:
            router.stop()


def tried(provider: Provider, model: str) -> int:
    return sum(1 for r in provider.requests() if r.body and r.body.get("model") == model)


def test_a_stream_cut_before_its_first_token_goes_to_the_other_pool_at_the_same_url(
    same_url: SameUrl,
) -> None:
    provider = same_url.provider
    provider.fail, provider.failing_model = "cut", MODELS["one"]
    try:
        before = tried(provider, MODELS["one"])

        def one_was_tried() -> bool:
            body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 5, "stream": True}  # fmt: skip
            with httpx.stream(
                "POST", same_url.url + "/v1/chat/completions", json=body,
                headers={"authorization": f"Bearer {TENANT_KEY}"}, timeout=30,
            ) as reply:  # fmt: skip
                assert reply.status_code == 200, reply.read()
                assert reply.headers["x-tiergate-pool"] == "two"
                text = reply.read().decode()
            assert "hel" in text and text.rstrip().endswith("data: [DONE]"), text
            return tried(provider, MODELS["one"]) > before

        until(one_was_tried, "the pool of model one was never tried", 60)
    finally:
        provider.fail, provider.failing_model = None, None
