"""The chart, the operator and the router on a real API server."""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import yaml
from cluster import REPO
from prometheus_client.parser import text_string_to_metric_families
from release import Release

from tiergate.pools.rollout import ROLLOUT_STANDS_STILL, ROLLOUT_VALUE

EXAMPLES = REPO / "examples"
POOLS = {"batched": "frontier-batched", "premium": "frontier-premium", "wafer-scale": "spark-wafer"}
MODEL = {"batched": "frontier", "premium": "frontier", "wafer-scale": "frontier-spark"}


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


def exported_conditions(release: Release, pool: str) -> dict[str, tuple[str, str]]:
    """type -> (status, reason) of the pool's conditions on the operator's /metrics (one
    operator pod: the release's default)."""
    ((name, ip),) = release.operator_pods(ready=True).items()
    found = {}
    for family in text_string_to_metric_families(release.pod_metrics(name, ip, 8082)):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "tiergate_operator_pool_condition" and labels["pool"] == pool:
                assert labels["pool_namespace"] == release.namespace, labels
                found[labels["type"]] = (labels["status"], labels["reason"])
    return found


def test_deleting_a_pool_removes_its_objects_and_its_routes(release: Release) -> None:
    release.kubectl("apply", "-f", str(EXAMPLES / "premium.yaml"))
    release.wait(lambda: served_by(release, "premium"), "the router to serve premium")
    release.wait(
        lambda: exported_conditions(release, "frontier-premium").get("Ready", ("",))[0] == "True",
        "the operator's metrics to say frontier-premium serves",
    )
    release.kubectl("delete", "inferencepool.tiergate.dev", "frontier-premium")
    release.wait(
        lambda: exported_conditions(release, "frontier-premium") == {},
        "the operator's metrics to forget frontier-premium",
        30,  # well within the 90 s a pool's conditions are kept without a reconciliation
    )
    release.wait(
        lambda: (
            not release.exists("deployment", "frontier-premium")
            and not release.exists("service", "frontier-premium")
        ),
        "garbage collection of the pool's Deployment and Service",
    )
    release.wait(
        lambda: chat(release, "premium").status_code == 404, "the router to stop serving premium"
    )


def test_operator_restarted_while_a_pool_is_edited_converges(release: Release) -> None:
    pool = POOLS["batched"]
    operator = f"{release.name}-operator"
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    release.wait(lambda: served_by(release, "batched"), "the router to serve batched")
    # Down for certain (not just a pod delete the old process might outlive), edit, back up.
    release.kubectl("scale", "deployment", operator, "--replicas=0")
    release.wait(
        lambda: (
            not release.kubectl(
                "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "name"
            ).strip()
        ),
        "the operator pod gone",
    )
    release.kubectl(
        "patch", "inferencepool.tiergate.dev", pool, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    time_of_edit = release.get("deployment", pool)["spec"]["replicas"]
    assert time_of_edit == 1, "nothing may act on the edit while the operator is down"
    release.kubectl("scale", "deployment", operator, "--replicas=1")
    release.wait(
        lambda: (
            release.get("deployment", pool)["spec"]["replicas"] == 2
            and release.ready_replicas(pool) == 2
        ),
        "the restarted operator to scale the pool to 2",
        120,
    )


def test_a_pool_s_rollout_reaches_its_deployment_and_restarts_no_pod(release: Release) -> None:
    pool = yaml.safe_load((EXAMPLES / "batched.yaml").read_text())
    pool["metadata"]["name"] = "rolled"
    pool["spec"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode == 0, done.stderr
    release.wait(lambda: release.ready_replicas("rolled") == 1, "pool rolled ready")
    strategy = release.get("deployment", "rolled")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }, strategy
    pods = set(release.pool_pods("rolled", ready=True))

    # Said no more: Kubernetes' defaults again (the operator's apply no longer owns the
    # field), and the pods keep running: the rollout changes no pod.
    del pool["spec"]["rollout"]
    assert release.apply(yaml.safe_dump(pool)).returncode == 0
    release.wait(
        lambda: (
            release.get("deployment", "rolled")["spec"]["strategy"]["rollingUpdate"]
            == {"maxSurge": "25%", "maxUnavailable": "25%"}
        ),
        "the Deployment back to Kubernetes' rolling update",
    )
    assert set(release.pool_pods("rolled", ready=True)) == pods

    pool["spec"]["rollout"] = {"maxSurge": "0%", "maxUnavailable": 0}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode != 0 and ROLLOUT_STANDS_STILL in done.stderr, done.stderr
    pool["spec"]["rollout"] = {"maxSurge": "150%"}
    done = release.apply(yaml.safe_dump(pool))
    assert done.returncode != 0 and ROLLOUT_VALUE in done.stderr, done.stderr
    release.kubectl("delete", "inferencepool.tiergate.dev", "rolled")
