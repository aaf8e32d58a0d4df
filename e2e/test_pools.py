"""The chart, the operator and the router on a real API server: the example pools served,
each tier at its speed, a pool scaled. (Pools edited and deleted: test_pool_edits.py.)"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import pytest
import yaml
from cluster import REPO
from release import Release

EXAMPLES = REPO / "examples"
POOLS = {"batched": "frontier-batched", "premium": "frontier-premium", "wafer-scale": "spark-wafer"}
MODEL = {"batched": "frontier", "premium": "frontier", "wafer-scale": "frontier-spark"}


pytestmark = pytest.mark.usefixtures("pools_removed")


@pytest.fixture(scope="module")
def release(module_release: Release) -> Release:
    """One release for the module: each test applies the pools it needs."""
    return module_release


def example_pools() -> list[str]:
    """Names of every InferencePool in examples/ (`kubectl apply -f examples/` creates all)."""
    docs = (yaml.safe_load(f.read_text()) for f in sorted(EXAMPLES.glob("*.yaml")))
    return [d["metadata"]["name"] for d in docs if d and d.get("kind") == "InferencePool"]


def apply_examples(release: Release) -> None:
    release.kubectl("apply", "-f", str(EXAMPLES))
    for pool in example_pools():
        release.wait(
            lambda p=pool: (release.condition(p, "Ready") or {}).get("status") == "True",
            f"pool {pool} Ready=True",
            120,
        )


def chat(
    release: Release, tier: str, *, stream: bool = False, max_tokens: int = 16
) -> httpx.Response:
    body = {
        "model": MODEL[tier],
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return httpx.post(
        f"{release.router_url()}/v1/chat/completions",
        json=body,
        headers={"x-tiergate-tier": tier},
        timeout=60.0,
    )


def served_by(release: Release, tier: str) -> bool:
    """The router has an endpoint of this tier's pool (its discovery caught up)."""
    try:
        return chat(release, tier).status_code == 200
    except httpx.HTTPError:
        return False


def stream_seconds(release: Release, tier: str, tokens: int) -> float:
    """Wall time from the first to the last content chunk of one streamed answer."""
    body = {
        "model": MODEL[tier],
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    with httpx.stream(
        "POST",
        f"{release.router_url()}/v1/chat/completions",
        json=body,
        headers={"x-tiergate-tier": tier},
        timeout=60.0,
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["x-tiergate-tier"] == tier
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                now = time.monotonic()
                first = first or now
                last = now
    assert first is not None and last is not None, f"{tier}: no content chunks"
    return last - first


def test_helm_install_then_helm_test_passes(release: Release) -> None:
    for component in ("operator", "router"):
        deployment = release.get("deployment", f"{release.name}-{component}")
        assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    release.wait(lambda: served_by(release, "batched"), "the router to serve batched")
    out = release.cluster.helm(
        "test", release.name, "-n", release.namespace, "--timeout", "2m", check=False
    )
    assert "Phase:          Succeeded" in out or "Phase: Succeeded" in out, (
        f"helm test did not succeed:\n{out}\n{release.diagnose()}"
    )


def test_examples_become_ready_with_an_envelope(release: Release) -> None:
    apply_examples(release)
    envelopes: dict[str, dict[str, Any]] = {}
    for tier, pool in POOLS.items():
        obj = release.get("inferencepool.tiergate.dev", pool)
        envelope = obj["status"]["envelope"]
        assert envelope["tokensPerSecondPerStream"] > 0, envelope
        assert envelope["costPerMillionOutputTokensUSD"] > 0, envelope
        assert obj["status"].get("readyReplicas") == 1, obj["status"]
        assert release.exists("deployment", pool) and release.exists("service", pool)
        envelopes[tier] = envelope
    speed = {t: e["tokensPerSecondPerStream"] for t, e in envelopes.items()}
    assert speed["batched"] < speed["premium"] < speed["wafer-scale"], speed
    # The printer columns a person sees: numbers, not blanks.
    table = release.kubectl("get", "inferencepools.tiergate.dev", "-o", "wide")
    header, *rows = table.strip().splitlines()
    assert "TOK/S" in header and "$/MTOK" in header, header
    columns = header.split()
    assert len(rows) == len(example_pools()), table
    for row in rows:
        cells = dict(zip(columns, row.split(), strict=False))
        assert float(cells["TOK/S"]) > 0 and float(cells["$/MTOK"]) > 0, row
        assert cells["STATUS"] == "Serving", row


#: The reply's service_tier is OpenAI's word for the tier (the tier's name is in a header).
OPENAI_SERVICE_TIER = {"batched": "default", "premium": "priority", "wafer-scale": "default"}


def test_requests_land_on_the_tier_they_ask_for(release: Release) -> None:
    apply_examples(release)
    for tier in POOLS:
        release.wait(lambda t=tier: served_by(release, t), f"the router to serve {tier}")
    for tier, pool in POOLS.items():
        response = chat(release, tier)
        assert response.status_code == 200, response.text
        assert response.headers["x-tiergate-tier"] == tier
        assert response.headers["x-tiergate-pool"] == pool
        assert response.json()["service_tier"] == OPENAI_SERVICE_TIER[tier]
    # Speeds come from the simulated hardware; the gaps (2.5x, ~6x) dwarf this machine's noise.
    seconds = {
        t: statistics.median(stream_seconds(release, t, 48) for _ in range(3)) for t in POOLS
    }
    assert seconds["premium"] < seconds["batched"] / 1.5, seconds
    assert seconds["wafer-scale"] < seconds["premium"] / 1.5, seconds


def test_scale_to_three_replicas_spreads_load(release: Release) -> None:
    release.kubectl("apply", "-f", str(EXAMPLES / "wafer-scale.yaml"))
    release.wait(lambda: served_by(release, "wafer-scale"), "the router to serve wafer-scale")
    release.kubectl("scale", "inferencepool.tiergate.dev/spark-wafer", "--replicas=3")
    release.wait(
        lambda: release.ready_replicas("spark-wafer") == 3,
        "3 ready replicas",
        90,
    )
    pods = release.pool_pods("spark-wafer", ready=True)
    assert len(pods) == 3, pods
    before = {name: release.served_requests(name, ip) for name, ip in pods.items()}
    sent = 0

    def spread() -> bool:
        nonlocal sent
        for _ in range(12):
            assert chat(release, "wafer-scale").status_code == 200
            sent += 1
        return all(release.served_requests(n, ip) > before[n] for n, ip in pods.items())

    # The router learns of new pods from its watch; until then the first pod takes them all.
    release.wait(spread, "requests reaching all three endpoints", 60)
    gained = {n: release.served_requests(n, ip) - before[n] for n, ip in pods.items()}
    assert sum(gained.values()) == sent, gained
