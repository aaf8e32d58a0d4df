"""Kubernetes discovery of hosted pools: the provider's URL is the pool's one endpoint (its
pods, if any, are not), the key comes from the Secret the pool names, read by name and again
when it rotates; a Secret the router may not read says how to let it, and one deleted stops
the provider being called."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from kube_helpers import ReplayApi, eventually, kube_source, recorded

from tiergate.router.discovery.kube import KubeSource
from tiergate.router.discovery.kube_state import INFERENCE_POOLS as POOLS
from tiergate.router.discovery.kube_state import PODS, KubeApiError
from tiergate.router.endpoints.hosted import KeyUnavailable

SECRET_VALUE = "sk-hosted-secret-0123456789"
HOSTED_SPEC = {
    "tier": "batched",
    "model": "llama-3.1-8b",
    "servedModelName": "coder",
    "replicas": 1,
    "endpoint": {
        "url": "https://api.example.com/v1",
        "model": "provider-8b",
        "apiKeySecretRef": {"name": "provider", "key": "api-key"},
    },
    "billing": {"outputPerMillionUsd": 3.0, "inputPerMillionUsd": 1.0},
}


class Secrets:
    """The namespace's Secrets as `read_secret` sees them; 403 for those not allowed."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {"provider": {"api-key": SECRET_VALUE}}
        self.forbidden: set[str] = set()
        self.failing = False  # the API server failing every read, with `outage` (a status)
        self.outage: int | None = None
        self.reads: list[str] = []
        self.lock = threading.Lock()

    def read(self, name: str) -> Mapping[str, str]:
        with self.lock:
            self.reads.append(name)
            if self.failing:
                raise KubeApiError(f"Secret {name}: HTTP {self.outage}", self.outage)
            if name in self.forbidden:
                raise KubeApiError(f"Secret {name}: HTTP 403 Forbidden", 403)
            if name not in self.data:
                raise KubeApiError(f"Secret {name}: HTTP 404 Not Found", 404)
            return dict(self.data[name])


def pools_with_hosted() -> dict[str, Any]:
    listed = recorded("inferencepools_list")
    hosted = copy.deepcopy(listed["items"][0])
    hosted["metadata"].update(name="coder-hosted", uid="uid-hosted")
    hosted["spec"] = copy.deepcopy(HOSTED_SPEC)
    listed["items"].append(hosted)
    return listed


@pytest.fixture
def secrets() -> Secrets:
    return Secrets()


@pytest.fixture
async def source(secrets: Secrets) -> AsyncIterator[tuple[ReplayApi, KubeSource]]:
    api = ReplayApi()
    source = kube_source(api, read_secret=secrets.read, secret_refresh_s=0.05)
    await source.start()
    try:
        api.give_list(POOLS, pools_with_hosted())
        api.give_list(PODS, recorded("pods_list"))
        await eventually(lambda: source.synced)
        yield api, source
    finally:
        await source.stop()


def hosted_key(source: KubeSource) -> str:
    (endpoint,) = source.view.pools["coder-hosted"].endpoints
    assert endpoint.hosted is not None
    return endpoint.hosted.key.value()


def key_problem(source: KubeSource) -> str | None:
    """Why the hosted pool's key cannot be had now (None: it can)."""
    try:
        hosted_key(source)
    except KeyUnavailable as exc:
        return str(exc)
    return None


def key_read(source: KubeSource) -> bool:
    return key_problem(source) is None


async def test_a_hosted_pool_is_its_providers_url_with_the_secrets_key(
    source: tuple[ReplayApi, KubeSource], secrets: Secrets
) -> None:
    _, kube = source
    pool = kube.view.pools["coder-hosted"]
    (endpoint,) = pool.endpoints
    assert endpoint.url == "https://api.example.com/v1" and pool.deployment is None
    assert endpoint.hosted is not None and endpoint.hosted.model == "provider-8b"
    assert pool.output_price_per_token_usd == pytest.approx(3e-6)
    assert {e.pool for e in kube.view.candidates("coder", "batched")} == {
        "coder-batched", "coder-hosted"
    }  # fmt: skip
    await eventually(lambda: key_read(kube))
    assert hosted_key(kube) == SECRET_VALUE
    assert SECRET_VALUE not in repr(endpoint)
    secrets.data["provider"]["api-key"] = "sk-rotated-0123456789"
    await eventually(lambda: hosted_key(kube) == "sk-rotated-0123456789")


async def test_a_secret_the_router_may_not_read_says_how_to_allow_it(
    secrets: Secrets, caplog: pytest.LogCaptureFixture
) -> None:
    secrets.forbidden.add("provider")
    api = ReplayApi()
    kube = kube_source(api, read_secret=secrets.read, secret_refresh_s=0.05)
    caplog.set_level(logging.WARNING, "tiergate.router.kube")
    await kube.start()
    try:
        api.give_list(POOLS, pools_with_hosted())
        api.give_list(PODS, recorded("pods_list"))
        await eventually(lambda: kube.synced and "provider" in secrets.reads)
        await eventually(lambda: "providerKeySecrets" in caplog.text)
        with pytest.raises(KeyUnavailable, match="router.providerKeySecrets"):
            hosted_key(kube)
        assert caplog.text.count("event=provider_key_unreadable") == 1  # once, not per read
    finally:
        await kube.stop()


async def test_a_secret_deleted_or_withdrawn_after_a_first_read_stops_the_provider_being_called(
    source: tuple[ReplayApi, KubeSource], secrets: Secrets, caplog: pytest.LogCaptureFixture
) -> None:
    _, kube = source
    caplog.set_level(logging.WARNING, "tiergate.router.kube")
    await eventually(lambda: key_read(kube))
    with secrets.lock:
        del secrets.data["provider"]
    await eventually(lambda: "Secret provider does not exist" in (key_problem(kube) or ""))
    assert "the key read before is no longer used" in caplog.text
    assert SECRET_VALUE not in caplog.text
    with secrets.lock:
        secrets.data["provider"] = {"other": "x"}  # made again, without the key
    await eventually(lambda: "Secret provider has no key api-key" in (key_problem(kube) or ""))
    with secrets.lock:
        secrets.data["provider"] = {"api-key": SECRET_VALUE}
    await eventually(lambda: key_read(kube))
    with secrets.lock:
        secrets.data["provider"]["api-key"] = ""
    await eventually(lambda: "key api-key of Secret provider is empty" in (key_problem(kube) or ""))
    with secrets.lock:
        secrets.data["provider"]["api-key"] = SECRET_VALUE
    await eventually(lambda: key_read(kube))
    with secrets.lock:
        secrets.forbidden.add("provider")  # the chart's providerKeySecrets no longer names it
    await eventually(lambda: "router.providerKeySecrets" in (key_problem(kube) or ""))


@pytest.mark.parametrize("status", [500, 503, None])  # None: the connection failed
async def test_an_api_server_that_fails_for_a_while_leaves_the_key_in_use(
    source: tuple[ReplayApi, KubeSource], secrets: Secrets, status: int | None
) -> None:
    _, kube = source
    await eventually(lambda: key_read(kube))
    with secrets.lock:
        secrets.failing, secrets.outage = True, status
        seen = len(secrets.reads)
    await eventually(lambda: len(secrets.reads) >= seen + 3)  # three refreshes failed
    assert hosted_key(kube) == SECRET_VALUE
    assert "reading Secret provider failed" in (kube.keys.problem("provider", "api-key") or "")
