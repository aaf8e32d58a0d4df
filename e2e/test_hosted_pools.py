"""A hosted pool on a real API server: `kubectl apply` of an InferencePool whose
`spec.endpoint` names an OpenAI-compatible API (a real HTTP server this test starts on
loopback, strict about its own key and model name: tests/helpers/fake_provider.py) with the key
in a Secret. The operator creates no pods and states the price in status; the router reads the
key from the Secret through its Role (the chart's `router.providerKeySecrets`), calls the
provider with it, and bills the tenant at the stated price with the provider's usage. What only
the API server shows: the CEL refusals with their reasons, a Secret that does not exist at
runtime (a 503 envelope, the router's log saying which Secret, nothing billed), and the
Role's limit on which Secrets the router may read.

Local backend only: the provider listens on this machine's loopback, which kind's nodes cannot
reach (as the shared ledger's PostgreSQL)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from cluster import LocalCluster
from fake_provider import COMPLETION_TOKENS, PROMPT_TOKENS, Provider, running_provider
from release import BACKEND, Release, installed, namespace_for

pytestmark = pytest.mark.skipif(
    BACKEND != "local", reason="the provider listens on this machine's loopback"
)

PROVIDER_KEY = "sk-e2e-provider-0123456789abcdef"
PROVIDER_MODEL = "prov-small-2026"
TENANT, TENANT_KEY = "acme", "tenant-e2e-key-0123456789"
INPUT_USD, OUTPUT_USD = 2.0, 10.0  # per million tokens, as the pool states
COST_USD = (PROMPT_TOKENS * INPUT_USD + COMPLETION_TOKENS * OUTPUT_USD) / 1e6
KEY_SECRET, MISSING_SECRET, UNLISTED_SECRET = "provider-key", "gone-key", "other-key"


def hosted_pool(name: str, tier: str, url: str, secret: str, *, billing: bool = True) -> str:
    price = (
        f"  billing: {{inputPerMillionUsd: {INPUT_USD}, outputPerMillionUsd: {OUTPUT_USD}}}\n"
        if billing
        else ""
    )
    key = f"    apiKeySecretRef: {{name: {secret}, key: api-key}}\n" if secret else ""
    return (
        "apiVersion: tiergate.dev/v1alpha1\n"
        "kind: InferencePool\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  tier: {tier}\n"
        "  model: llama-3.1-8b\n"
        "  servedModelName: chat\n"
        f"{price}"
        "  endpoint:\n"
        f"    url: {url}\n"
        f"    model: {PROVIDER_MODEL}\n"
        f"{key}"
    )


@dataclass
class Hosted:
    release: Release
    provider: Provider

    def chat(self, tier: str, **fields: Any) -> httpx.Response:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}
        return httpx.post(
            f"{self.release.router_url()}/v1/chat/completions",
            json=body,
            headers={"x-tiergate-tier": tier, "authorization": f"Bearer {TENANT_KEY}"},
            timeout=60.0,
        )

    def usage(self) -> dict[str, Any]:
        reply = httpx.get(
            f"{self.release.router_url()}/v1/usage",
            headers={"authorization": f"Bearer {TENANT_KEY}"},
            timeout=10.0,
        )
        assert reply.status_code == 200, reply.text
        totals: dict[str, Any] = reply.json()["totals"]
        return totals

    def apply(self, manifest: str) -> subprocess.CompletedProcess[str]:
        """`kubectl apply`, its exit code and output kept (Release.apply)."""
        return self.release.apply(manifest)


@pytest.fixture(scope="module")
def hosted(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Hosted]:
    """The chart with one tenant, its router allowed to read two provider-key Secrets (one of
    which is never created), and the provider running."""
    values = [
        f"router.providerKeySecrets={{{KEY_SECRET},{MISSING_SECRET}}}",
        f"router.tenants.inline[0].name={TENANT}",
        f"router.tenants.inline[0].apiKeys[0]={TENANT_KEY}",
        "router.tenants.inline[0].budgetUsd=1000",
    ]
    helm_args = [arg for value in values for arg in ("--set", value)]

    def create_secrets(release: Release) -> None:
        for name in (KEY_SECRET, UNLISTED_SECRET):
            release.kubectl(
                "create", "secret", "generic", name, f"--from-literal=api-key={PROVIDER_KEY}"
            )

    with (
        running_provider(PROVIDER_KEY, PROVIDER_MODEL) as provider,
        installed(
            cluster, namespace_for(request.node.name), *helm_args, prepare=create_secrets
        ) as release,
    ):
        yield Hosted(release, provider)


def test_a_hosted_pool_runs_no_pods_and_states_its_price(hosted: Hosted) -> None:
    release = hosted.release
    done = hosted.apply(hosted_pool("hosted-batched", "batched", hosted.provider.url, KEY_SECRET))
    assert done.returncode == 0, done.stderr

    def ready() -> bool:
        cond = release.condition("hosted-batched", "Ready")
        return cond is not None and cond["status"] == "True"

    release.wait(ready, "the hosted pool Ready")
    status = release.get("inferencepool.tiergate.dev", "hosted-batched")["status"]
    envelope = status["envelope"]
    assert envelope["basis"] == "stated", envelope
    assert envelope["costPerMillionOutputTokensUSD"] == OUTPUT_USD, envelope
    assert envelope["costPerMillionInputTokensUSD"] == INPUT_USD, envelope
    assert "tokensPerSecondPerStream" not in envelope, envelope  # no physics for it
    assert status["billed"] == {"basis": "stated", "outputPerMillionUsd": OUTPUT_USD,
                                "inputPerMillionUsd": INPUT_USD}  # fmt: skip
    assert release.condition("hosted-batched", "Ready")["reason"] == "Hosted"  # type: ignore[index]
    for kind in ("deployment", "service"):
        assert not release.exists(kind, "hosted-batched"), kind
    assert release.pool_pods("hosted-batched") == {}


def test_the_router_calls_the_provider_with_the_secrets_key_and_bills_the_stated_price(
    hosted: Hosted,
) -> None:
    assert hosted.apply(
        hosted_pool("hosted-batched", "batched", hosted.provider.url, KEY_SECRET)
    ).returncode == 0  # fmt: skip
    before = hosted.usage()
    replies: list[httpx.Response] = []

    def served() -> bool:  # until the router has seen the pool and read its Secret
        replies.append(hosted.chat("batched", max_tokens=COMPLETION_TOKENS))
        return replies[-1].status_code == 200

    hosted.release.wait(served, "a reply from the hosted pool", 60)
    reply = replies[-1]
    assert reply.headers["x-tiergate-pool"] == "hosted-batched"
    assert reply.json()["model"] == "chat"  # the pool's name, never the provider's
    sent = hosted.provider.requests()[-1]
    assert sent.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
    assert TENANT_KEY not in str(sent.headers)
    assert sent.body is not None and sent.body["model"] == PROVIDER_MODEL
    usage = reply.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS,
                                                                    COMPLETION_TOKENS)  # fmt: skip
    assert usage["cost_usd"] == pytest.approx(COST_USD)
    # The ledger (what the tenant pays): every reply served since `before`, at the stated price.
    served_count = sum(r.status_code == 200 for r in replies)

    def billed() -> bool:
        return hosted.usage()["requests"] - before["requests"] >= served_count

    hosted.release.wait(billed, "the replies billed", 30)
    after = hosted.usage()
    assert after["completion_tokens"] - before["completion_tokens"] == (
        served_count * COMPLETION_TOKENS
    )
    assert after["cost_usd"] - before["cost_usd"] == pytest.approx(served_count * COST_USD)
    logs = hosted.release.kubectl("logs", "deploy/tiergate-router")
    assert PROVIDER_KEY not in logs and TENANT_KEY not in logs


def test_a_secret_missing_at_runtime_is_a_503_envelope_and_bills_nothing(hosted: Hosted) -> None:
    release = hosted.release
    done = hosted.apply(hosted_pool("hosted-gone", "premium", hosted.provider.url, MISSING_SECRET))
    assert done.returncode == 0, done.stderr
    release.wait(
        lambda: "does not exist" in release.kubectl("logs", "deploy/tiergate-router"),
        "the router's warning about the missing Secret",
        60,
    )
    before, sent_before = hosted.usage(), len(hosted.provider.requests())
    reply = hosted.chat("premium", max_tokens=5)
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable", error
    assert "API key is unavailable" in error["message"], error
    assert "127.0.0.1" not in reply.text and PROVIDER_MODEL not in reply.text
    warning = next(
        line
        for line in release.kubectl("logs", "deploy/tiergate-router").splitlines()
        if "event=provider_key_unreadable" in line and MISSING_SECRET in line
    )
    assert f"Secret {MISSING_SECRET} does not exist" in warning, warning
    assert len(hosted.provider.requests()) == sent_before  # the provider was never called
    after = hosted.usage()
    assert after["cost_usd"] == before["cost_usd"], (before, after)
    assert after["completion_tokens"] == before["completion_tokens"], (before, after)


def test_a_secret_the_router_may_not_read_says_how_to_allow_it(hosted: Hosted) -> None:
    release = hosted.release
    pool = hosted_pool("hosted-unlisted", "wafer-scale", hosted.provider.url, UNLISTED_SECRET)
    assert hosted.apply(pool).returncode == 0
    release.wait(
        lambda: "router.providerKeySecrets" in release.kubectl("logs", "deploy/tiergate-router"),
        "the router's warning about a Secret it may not read",
        60,
    )
    reply = hosted.chat("wafer-scale", max_tokens=5)
    assert reply.status_code == 503, reply.text
    assert "API key is unavailable" in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    ("case", "secret", "billing", "reason"),
    [
        ("no key Secret", "", True, "spec.endpoint.apiKeySecretRef is required"),
        ("no billing", KEY_SECRET, False, "needs spec.billing.outputPerMillionUsd"),
    ],
)
def test_a_bad_hosted_pool_is_refused_by_kubectl_with_the_reason(
    hosted: Hosted, case: str, secret: str, billing: bool, reason: str
) -> None:
    name = "hosted-bad-" + case.replace(" ", "-").lower()
    done = hosted.apply(hosted_pool(name, "batched", hosted.provider.url, secret, billing=billing))
    assert done.returncode != 0, done.stdout
    assert reason in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # a message, no dump
    assert not hosted.release.exists("inferencepool.tiergate.dev", name)
