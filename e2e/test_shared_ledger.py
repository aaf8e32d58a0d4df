"""Three router replicas sharing one PostgreSQL ledger, as the chart installs them.

PostgreSQL runs on this machine (tests/helpers/postgres_server.py), as a managed database
would outside the cluster; the release names it either way the chart offers: the whole DSN in
a Secret, or its address with the password in a Secret. The local backend's pods reach it
from their 127.x addresses; kind's nodes cannot reach this machine's loopback, so there the
test does not apply.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from cluster import LocalCluster
from postgres_server import PASSWORD, USER, PostgresServer, started_server
from release import BACKEND, Release, installed, namespace_for
from test_pools import EXAMPLES

pytestmark = pytest.mark.skipif(
    BACKEND != "local", reason="the PostgreSQL server listens on this machine's loopback"
)

REPLICAS = 3
REQUESTS_PER_REPLICA = 8
TENANT = "team-shared"
API_KEY = "sk-e2e-shared-ledger"
SECRET = "tiergate-ledger"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = started_server("tiergate-e2e-pg-")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["dsn-secret", "host-and-password-secret"])
def shared_release(
    cluster: LocalCluster, postgres: PostgresServer, request: pytest.FixtureRequest
) -> Iterator[tuple[Release, str]]:
    """The chart with three routers on a fresh database; (the release, the database). The
    database named either way the chart offers: the whole DSN in a Secret, or its address
    with the password in a Secret (the pods' PGPASSWORD)."""
    database = postgres.create_database()
    if request.param == "dsn-secret":
        secret = f"--from-literal=dsn={postgres.dsn(database)}"
        ledger = [f"router.ledger.postgres.existingSecret={SECRET}"]
    else:
        secret = f"--from-literal=password={PASSWORD}"
        ledger = [
            f"router.ledger.postgres.host={postgres.host}",
            f"router.ledger.postgres.port={postgres.port}",
            f"router.ledger.postgres.database={database}",
            f"router.ledger.postgres.user={USER}",
            "router.ledger.postgres.sslmode=disable",
            f"router.ledger.postgres.passwordSecret.name={SECRET}",
        ]

    def create_secret(release: Release) -> None:
        release.kubectl("create", "secret", "generic", SECRET, secret)

    tenant = "router.tenants.inline[0]"
    values = [
        f"router.replicas={REPLICAS}",
        *ledger,
        f"{tenant}.name={TENANT}",
        f"{tenant}.apiKeys[0]={API_KEY}",
        f"{tenant}.budgetUsd=1000",
        f"{tenant}.budgetPeriod=month",
    ]
    helm_args = [arg for value in values for arg in ("--set", value)]
    namespace = namespace_for(request.node.name)
    with installed(cluster, namespace, *helm_args, prepare=create_secret) as release:
        yield release, database


def chat(ip: str) -> httpx.Response:
    return httpx.post(
        f"http://{ip}:8080/v1/chat/completions",
        json={
            "model": "frontier",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
        },
        headers={"x-tiergate-tier": "batched", "authorization": f"Bearer {API_KEY}"},
        timeout=60.0,
    )


def usage(ip: str) -> dict[str, Any]:
    response = httpx.get(
        f"http://{ip}:8080/v1/usage", headers={"authorization": f"Bearer {API_KEY}"}, timeout=10
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def has_an_endpoint(ip: str) -> bool:
    """The router at `ip` sees a ready sim node (without a request, so nothing is recorded)."""
    ready = httpx.get(f"http://{ip}:8080/readyz", timeout=5.0)
    return ready.status_code == 200 and int(ready.json().get("endpoints", 0)) >= 1


def test_three_replicas_share_one_postgres_ledger(
    shared_release: tuple[Release, str], postgres: PostgresServer
) -> None:
    release, database = shared_release
    pods = release.router_pods(ready=True)
    assert len(pods) == REPLICAS, pods
    release.kubectl("apply", "-f", str(EXAMPLES / "batched.yaml"))
    for name, ip in pods.items():
        release.wait(lambda ip=ip: has_an_endpoint(ip), f"router {name} to see the batched pool")

    # Spread over the three pods by address, a few at a time on each.
    targets = [ip for ip in pods.values() for _ in range(REQUESTS_PER_REPLICA)]
    with ThreadPoolExecutor(max_workers=2 * REPLICAS) as pool:
        replies = list(zip(targets, pool.map(chat, targets), strict=True))
    failed = [(ip, r.status_code, r.text[:200]) for ip, r in replies if r.status_code != 200]
    assert not failed, f"{failed[:3]}\n{release.diagnose()}"
    served = {ip for ip, _ in replies}
    assert served == set(pods.values()), "every replica serves"
    request_ids = {r.headers["x-tiergate-request-id"] for _, r in replies}
    assert len(request_ids) == len(replies)

    # Each reply's end went out after its row was committed: the rows are all there, by id.
    rows = postgres.psql(
        f"SELECT DISTINCT request_id FROM usage WHERE tenant = '{TENANT}'", database
    )
    assert set(rows.split()) == request_ids
    total_usd = float(
        postgres.psql(f"SELECT sum(cost_usd) FROM usage WHERE tenant = '{TENANT}'", database)
    )

    # Every replica answers /v1/usage alike, from the shared ledger (asked until they agree:
    # a replica may still be reading).
    answers: dict[str, dict[str, Any]] = {}

    def all_agree() -> bool:
        answers.update({ip: usage(ip) for ip in pods.values()})
        return len({repr(sorted(a.items())) for a in answers.values()}) == 1

    deadline = time.monotonic() + 30
    while not all_agree():
        assert time.monotonic() < deadline, f"the replicas' /v1/usage differ: {answers}"
        time.sleep(0.5)
    answer = next(iter(answers.values()))
    assert answer["tenant"] == TENANT
    assert answer["totals"]["requests"] == len(replies), answer
    assert answer["by_tier_served"]["batched"]["requests"] == len(replies), answer
    assert answer["totals"]["cost_usd"] == pytest.approx(total_usd, abs=1e-5), answer
    assert answer["budget"]["spent_usd"] == pytest.approx(total_usd, abs=1e-5), answer
